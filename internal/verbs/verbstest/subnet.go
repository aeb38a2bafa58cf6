package verbstest

import (
	"fmt"
	"net/netip"
	"sync"

	"github.com/rdmavisor/rdmavisor/internal/verbs"
)

// Subnet is a fake InfiniBand subnet for tests of code above package
// verbs: a device attached to it reports link layer InfiniBand and a LID,
// and takes only LID-routed address vectors (NoGRH, a unicast DLID), in
// QP paths and address handles alike. It carries them over the RoCE
// device beneath, to the GID the destination LID was given with, and
// makes completions look as an InfiniBand port's within one subnet do:
// no GRH flag, and the sender's LID in WC.SLID (a UD receive's GRH space
// zeroed). It checks what the code above builds and exchanges; it is no
// model of InfiniBand's link or of a subnet manager.
type Subnet struct {
	mu   sync.Mutex
	gids map[uint16]verbs.GID // guarded by mu
	lids map[verbs.GID]uint16 // guarded by mu
	avs  []verbs.AHAttr       // every vector a port was given; guarded by mu
}

// NewSubnet returns an empty subnet.
func NewSubnet() *Subnet {
	return &Subnet{gids: make(map[uint16]verbs.GID), lids: make(map[verbs.GID]uint16)}
}

// Attach gives dev (a RoCE device: its GID 0 is where its traffic goes)
// the LID lid in the subnet, and returns it as an InfiniBand port.
func (s *Subnet) Attach(dev verbs.Device, lid uint16) (verbs.Device, error) {
	if lid == 0 || lid > verbs.MaxUnicastLID {
		return nil, fmt.Errorf("verbstest: LID %#x is not unicast: %w", lid, verbs.ErrInvalid)
	}
	g, err := dev.GID(0)
	if err != nil {
		return nil, err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if _, dup := s.gids[lid]; dup {
		return nil, fmt.Errorf("verbstest: LID %#x taken: %w", lid, verbs.ErrInvalid)
	}
	s.gids[lid], s.lids[g] = g, lid
	return &ibDevice{Device: dev, s: s, lid: lid, recvs: make(map[uint64]uint64), qps: make(map[uint32]*ibQP)}, nil
}

// Vectors returns every address vector the subnet's ports were given, in
// order: QP paths (QPAttrAV) and address handles.
func (s *Subnet) Vectors() []verbs.AHAttr {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]verbs.AHAttr(nil), s.avs...)
}

// route checks a vector given to a port and returns the RoCE one that
// carries it.
func (s *Subnet) route(av verbs.AHAttr) (verbs.AHAttr, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.avs = append(s.avs, av)
	if !av.NoGRH {
		return verbs.AHAttr{}, fmt.Errorf("verbstest: %w: a GRH on the fake subnet's port (to %v): within a subnet an InfiniBand path is LID-routed", verbs.ErrInvalid, av.DGID)
	}
	if err := verbs.CheckAH(&av); err != nil {
		return verbs.AHAttr{}, err
	}
	g, ok := s.gids[av.DLID]
	if !ok {
		return verbs.AHAttr{}, fmt.Errorf("verbstest: %w: no port has LID %#x", verbs.ErrInvalid, av.DLID)
	}
	return verbs.AHAttr{DGID: g, PortNum: av.PortNum, HopLimit: 64, SL: av.SL}, nil
}

func (s *Subnet) lidOf(g verbs.GID) uint16 {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.lids[g]
}

type ibDevice struct {
	verbs.Device
	s   *Subnet
	lid uint16

	mu    sync.Mutex
	mrs   []verbs.MR        // to find a receive's buffer; guarded by mu
	recvs map[uint64]uint64 // a posted receive's wr_id → its buffer's address; guarded by mu
	qps   map[uint32]*ibQP  // guarded by mu
}

func (d *ibDevice) Attr() verbs.DeviceAttr {
	a := d.Device.Attr()
	a.LinkLayer, a.LID, a.LMC = verbs.LinkLayerInfiniBand, d.lid, 0
	return a
}

func (d *ibDevice) AllocPD() (verbs.PD, error) {
	pd, err := d.Device.AllocPD()
	if err != nil {
		return nil, err
	}
	return &ibPD{PD: pd, d: d}, nil
}

func (d *ibDevice) CreateCQ(cqe int) (verbs.CQ, error) {
	cq, err := d.Device.CreateCQ(cqe)
	if err != nil {
		return nil, err
	}
	return &ibCQ{CQ: cq, d: d}, nil
}

func (d *ibDevice) noteRecvs(wrs []verbs.RecvWR, n int) {
	d.mu.Lock()
	defer d.mu.Unlock()
	for _, w := range wrs[:n] {
		if w.NumSGE > 0 {
			d.recvs[w.WRID] = w.SG[0].Addr
		}
	}
}

// grhSpace returns the GRH space of the receive buffer at addr.
func (d *ibDevice) grhSpace(addr uint64) []byte {
	for _, mr := range d.mrs {
		if b := mr.Bytes(); addr >= mr.Addr() && addr+verbs.GRHSize <= mr.Addr()+uint64(len(b)) {
			off := addr - mr.Addr()
			return b[off : off+verbs.GRHSize]
		}
	}
	return nil
}

type ibPD struct {
	verbs.PD
	d *ibDevice
}

func (p *ibPD) RegMR(length int, access verbs.Access) (verbs.MR, error) {
	mr, err := p.PD.RegMR(length, access)
	if err == nil {
		p.d.mu.Lock()
		p.d.mrs = append(p.d.mrs, mr)
		p.d.mu.Unlock()
	}
	return mr, err
}

func (p *ibPD) RegMRMem(mem []byte, access verbs.Access) (verbs.MR, error) {
	mr, err := p.PD.RegMRMem(mem, access)
	if err == nil {
		p.d.mu.Lock()
		p.d.mrs = append(p.d.mrs, mr)
		p.d.mu.Unlock()
	}
	return mr, err
}

func (p *ibPD) CreateAH(attr *verbs.AHAttr) (verbs.AH, error) {
	av, err := p.d.s.route(*attr)
	if err != nil {
		return nil, err
	}
	return p.PD.CreateAH(&av)
}

func (p *ibPD) CreateSRQ(attr *verbs.SRQInitAttr) (verbs.SRQ, error) {
	srq, err := p.PD.CreateSRQ(attr)
	if err != nil {
		return nil, err
	}
	return &ibSRQ{SRQ: srq, d: p.d}, nil
}

func (p *ibPD) CreateQP(attr *verbs.QPInitAttr) (verbs.QP, error) {
	in := *attr
	if c, ok := in.SendCQ.(*ibCQ); ok {
		in.SendCQ = c.CQ
	}
	if c, ok := in.RecvCQ.(*ibCQ); ok {
		in.RecvCQ = c.CQ
	}
	if s, ok := in.SRQ.(*ibSRQ); ok {
		in.SRQ = s.SRQ
	}
	qp, err := p.PD.CreateQP(&in)
	if err != nil {
		return nil, err
	}
	q := &ibQP{QP: qp, d: p.d}
	p.d.mu.Lock()
	p.d.qps[qp.QPN()] = q
	p.d.mu.Unlock()
	return q, nil
}

type ibSRQ struct {
	verbs.SRQ
	d *ibDevice
}

func (s *ibSRQ) PostRecv(wrs []verbs.RecvWR) (int, error) {
	n, err := s.SRQ.PostRecv(wrs)
	s.d.noteRecvs(wrs, n)
	return n, err
}

type ibQP struct {
	verbs.QP
	d *ibDevice

	mu sync.Mutex
	av verbs.AHAttr // the path as given; guarded by mu
}

func (q *ibQP) Modify(attr *verbs.QPAttr, mask verbs.QPAttrMask) error {
	if mask&verbs.QPAttrAV == 0 {
		return q.QP.Modify(attr, mask)
	}
	roce, err := q.d.s.route(attr.AH)
	if err != nil {
		return err
	}
	a := *attr
	a.AH = roce
	if err := q.QP.Modify(&a, mask); err != nil {
		return err
	}
	q.mu.Lock()
	q.av = attr.AH
	q.mu.Unlock()
	return nil
}

func (q *ibQP) Query() verbs.QPAttr {
	a := q.QP.Query()
	q.mu.Lock()
	a.AH = q.av
	q.mu.Unlock()
	return a
}

func (q *ibQP) PostRecv(wrs []verbs.RecvWR) (int, error) {
	n, err := q.QP.PostRecv(wrs)
	q.d.noteRecvs(wrs, n)
	return n, err
}

func (q *ibQP) Close() error {
	qpn := q.QPN()
	if err := q.QP.Close(); err != nil {
		return err
	}
	q.d.mu.Lock()
	delete(q.d.qps, qpn)
	q.d.mu.Unlock()
	return nil
}

type ibCQ struct {
	verbs.CQ
	d *ibDevice
}

// Poll rewrites receive completions as a port within one subnet reports
// them: no GRH, the sender's LID in SLID (for UD, from the GRH space the
// RoCE device beneath filled, which is then zeroed; for RC and UC, the
// connected QP's DLID).
func (c *ibCQ) Poll(wcs []verbs.WC) int {
	n := c.CQ.Poll(wcs)
	d := c.d
	d.mu.Lock()
	defer d.mu.Unlock()
	for i := range wcs[:n] {
		wc := &wcs[i]
		if wc.Opcode&verbs.WCRecv == 0 {
			continue
		}
		addr, posted := d.recvs[wc.WRID]
		delete(d.recvs, wc.WRID)
		q := d.qps[wc.QPN]
		if q == nil || wc.Status != verbs.WCSuccess {
			continue
		}
		wc.Flags &^= verbs.WCWithGRH
		if q.Type() != verbs.QPTypeUD {
			q.mu.Lock()
			wc.SLID = q.av.DLID
			q.mu.Unlock()
			continue
		}
		if grh := d.grhSpace(addr); posted && grh != nil {
			wc.SLID = d.s.lidOf(sourceGID(grh))
			clear(grh)
		}
	}
	return n
}

// sourceGID reads the sender from a RoCE UD receive's GRH space: RoCE v2
// over IPv4 puts 20 zero bytes and the IPv4 header there, otherwise a GRH.
func sourceGID(grh []byte) (g verbs.GID) {
	if grh[0]>>4 != 6 && grh[20]>>4 == 4 {
		return verbs.GIDFromAddr(netip.AddrFrom4([4]byte(grh[32:36])))
	}
	copy(g[:], grh[8:24])
	return g
}
