package soft

import (
	"errors"
	"fmt"
	"net"
	"sync"
	"sync/atomic"

	"github.com/rdmavisor/rdmavisor/internal/verbs"
	"github.com/rdmavisor/rdmavisor/internal/verbs/soft/roce"
	"github.com/rdmavisor/rdmavisor/internal/verbs/soft/wire"
)

// Config configures a software device.
type Config struct {
	// Name is the device name, as ibv_get_device_name would return.
	Name string
	// Wire carries the device's packets; the device owns it from Open on
	// and closes it on Close. Its LocalGID is the port's GID 0.
	Wire wire.Wire
	// MTU is the port's active MTU in bytes: 256, 512, 1024, 2048 or 4096
	// (default 4096). Like rxe, set it from the link MTU.
	MTU int
	// MaxInflight bounds the packets an RC QP has unacknowledged (default
	// 256): the share of the wire one QP may fill.
	MaxInflight int
	// Port is the UDP port every device of the network uses, covered by
	// the ICRC (default: the wire's Port method if it has one, else 4791).
	Port uint16
	// RxBatch is how many packets the receive loop takes from the wire at
	// once (default 64).
	RxBatch int
	// NIC, if set, models a NIC's QP-context cache and receive ring on
	// the receive path (nic.go); zero fields take DefaultNICModel's. Nil,
	// the default, runs at CPU speed with unbounded state.
	NIC *NICModel
}

// Device limits, reported by Attr and enforced on create and post.
const (
	maxQP     = 1 << 20
	maxQPWR   = 1 << 15
	maxCQE    = 1 << 22
	maxMRSize = 1 << 40
	maxSRQWR  = 1 << 15
	firstQPN  = 0x11 // QPNs 0 and 1 are the special QPs; rxe starts at 17 too
)

// Device is a software RDMA device with one port.
type Device struct {
	cfg  Config
	w    wire.Wire
	gid  verbs.GID
	port uint16        // UDP port of every device on the wire
	self roce.Endpoint // this device's end of the flows, for the ICRC
	mtu  verbs.MTU

	qpMu    sync.RWMutex
	qps     map[uint32]*qp // by QPN; guarded by qpMu
	nextQPN uint32         // guarded by qpMu

	// keys maps MR keys to regions (keys.go).
	keys mrKeys
	// mws maps memory window keys and handles to windows (mw.go).
	mws mwKeys

	ahMu   sync.RWMutex
	ahs    map[uint32]*ah // guarded by ahMu
	nextAH uint32         // guarded by ahMu

	txPool sync.Pool // *txq

	children atomic.Int64 // live PDs and CQs
	closed   atomic.Bool
	rxDone   chan struct{}
	stats    Stats
}

var _ verbs.Device = (*Device)(nil)

// Open starts a device on cfg.Wire.
func Open(cfg Config) (*Device, error) {
	if cfg.Wire == nil {
		return nil, fmt.Errorf("soft: open: %w: no wire", verbs.ErrInvalid)
	}
	if cfg.Name == "" {
		cfg.Name = "soft0"
	}
	if cfg.MTU == 0 {
		cfg.MTU = 4096
	}
	mtu, err := verbs.MTUFromBytes(cfg.MTU)
	if err != nil {
		return nil, fmt.Errorf("soft: open %s: %w", cfg.Name, err)
	}
	if cfg.MaxInflight <= 0 {
		cfg.MaxInflight = 256
	}
	if cfg.MaxInflight > 1<<22 {
		return nil, fmt.Errorf("soft: open %s: %w: MaxInflight %d exceeds half the PSN space", cfg.Name, verbs.ErrInvalid, cfg.MaxInflight)
	}
	if cfg.RxBatch <= 0 {
		cfg.RxBatch = 64
	}
	if cfg.NIC != nil {
		m, err := cfg.NIC.withDefaults()
		if err != nil {
			return nil, fmt.Errorf("soft: open %s: %w", cfg.Name, err)
		}
		if err := m.setRing(cfg.Wire); err != nil {
			return nil, fmt.Errorf("soft: open %s: %w", cfg.Name, err)
		}
		cfg.NIC = &m
	}
	d := &Device{
		cfg:     cfg,
		w:       cfg.Wire,
		gid:     cfg.Wire.LocalGID(),
		mtu:     mtu,
		qps:     make(map[uint32]*qp),
		nextQPN: firstQPN,
		ahs:     make(map[uint32]*ah),
		nextAH:  1,
		rxDone:  make(chan struct{}),
	}
	d.mws.first, d.mws.limit = mwIndexBase, 1<<24
	d.port = cfg.Port
	if p, ok := cfg.Wire.(interface{ Port() uint16 }); ok && d.port == 0 {
		d.port = p.Port()
	}
	if d.port == 0 {
		d.port = roce.DefaultPort
	}
	d.self = roce.Endpoint{GID: d.gid, Port: d.port}
	pktLen := roce.MaxPacketLen(4096)
	d.txPool.New = func() any { return newTxq(d.w, pktLen, 64, &d.stats) }
	go d.rxLoop()
	return d, nil
}

// Attr reports the device's limits and port.
func (d *Device) Attr() verbs.DeviceAttr {
	return verbs.DeviceAttr{
		Name:      d.cfg.Name,
		Vendor:    "soft",
		NodeGUID:  guidOf(d.gid),
		MaxQP:     maxQP,
		MaxQPWR:   maxQPWR,
		MaxSGE:    verbs.MaxSGE,
		MaxCQ:     1 << 20,
		MaxCQE:    maxCQE,
		MaxMR:     mwIndexBase - 1,
		MaxMW:     1<<24 - mwIndexBase,
		MaxMRSize: maxMRSize,
		MaxPD:     1 << 20,
		MaxSRQ:    1 << 20,
		MaxSRQWR:  maxSRQWR,
		MaxAH:     1 << 20,
		ActiveMTU: d.mtu,
		MaxMTU:    verbs.MTU4096,
		PortCount: 1,
		NUMANode:  -1,
		LinkLayer: verbs.LinkLayerEthernet,
	}
}

// guidOf derives an EUI-64-like node GUID from the GID, stable per address.
func guidOf(g verbs.GID) uint64 {
	var v uint64
	for _, b := range g {
		v = v*131 + uint64(b)
	}
	return v
}

// GID returns the port's GID table entry; the soft port has one.
func (d *Device) GID(index int) (verbs.GID, error) {
	if index != 0 {
		return verbs.GID{}, fmt.Errorf("soft: GID index %d: %w", index, verbs.ErrInvalid)
	}
	return d.gid, nil
}

// PortState reports the port ACTIVE while the device is open, unless its
// wire says otherwise: a UDP wire is DOWN while no interface that is up
// holds its bind address, as rxe's port follows its netdev. Wires of
// the in-memory fabric are always ACTIVE.
func (d *Device) PortState() (verbs.PortState, error) {
	if d.closed.Load() {
		return 0, fmt.Errorf("soft: port state of %s: %w", d.cfg.Name, verbs.ErrClosed)
	}
	w, ok := d.w.(interface {
		PortState() (verbs.PortState, error)
	})
	if !ok {
		return verbs.PortStateActive, nil
	}
	st, err := w.PortState()
	if errors.Is(err, net.ErrClosed) {
		return 0, fmt.Errorf("soft: port state of %s: %w", d.cfg.Name, verbs.ErrClosed)
	}
	if err != nil {
		return 0, fmt.Errorf("soft: port state of %s: %w", d.cfg.Name, err)
	}
	return st, nil
}

// Stats returns the device's counters.
func (d *Device) Stats() StatsSnapshot {
	s := d.stats.snapshot()
	if d.cfg.NIC != nil {
		s.RxRingDrops = d.w.Stats().DropQueueFull
	}
	return s
}

// AllocPD allocates a protection domain.
func (d *Device) AllocPD() (verbs.PD, error) {
	if d.closed.Load() {
		return nil, fmt.Errorf("soft: alloc pd: %w", verbs.ErrClosed)
	}
	d.children.Add(1)
	return &pd{dev: d}, nil
}

// CreateCQ creates a completion queue with its own completion channel.
func (d *Device) CreateCQ(cqe int) (verbs.CQ, error) {
	if d.closed.Load() {
		return nil, fmt.Errorf("soft: create cq: %w", verbs.ErrClosed)
	}
	if cqe < 1 || cqe > maxCQE {
		return nil, fmt.Errorf("soft: create cq with %d entries: %w", cqe, verbs.ErrInvalid)
	}
	cq, err := newCQ(cqe)
	if err != nil {
		return nil, fmt.Errorf("soft: create cq: %w", err)
	}
	cq.dev = d
	d.children.Add(1)
	return cq, nil
}

// Close stops the device. It fails with ErrBusy while PDs or CQs exist.
func (d *Device) Close() error {
	if n := d.children.Load(); n > 0 {
		return fmt.Errorf("soft: close %s: %d PDs and CQs still open: %w", d.cfg.Name, n, verbs.ErrBusy)
	}
	if d.closed.Swap(true) {
		return fmt.Errorf("soft: close %s: %w", d.cfg.Name, verbs.ErrClosed)
	}
	err := d.w.Close()
	<-d.rxDone
	return err
}

// rxLoop takes batches of packets from the wire and processes them. Output
// the responders generate (ACKs, NAKs, read responses) is sent once per
// batch, which is how ACKs get coalesced.
func (d *Device) rxLoop() {
	defer close(d.rxDone)
	pktLen := roce.MaxPacketLen(4096)
	pkts := make([]wire.Packet, d.cfg.RxBatch)
	for i := range pkts {
		pkts[i].Buf = make([]byte, pktLen)
	}
	rx := &rxState{dev: d, tx: newTxq(d.w, pktLen, 64, &d.stats), reqTx: newTxq(d.w, pktLen, 64, &d.stats)}
	if d.cfg.NIC != nil {
		rx.nic = newNIC(*d.cfg.NIC, &d.stats)
	}
	for {
		n, err := d.w.Recv(pkts)
		for i := 0; i < n; i++ {
			rx.handle(pkts[i].Buf[:pkts[i].N], pkts[i].Addr, pkts[i].Port)
		}
		rx.endBatch()
		if err != nil {
			if errors.Is(err, net.ErrClosed) || d.closed.Load() {
				return
			}
			d.stats.rxErrors.Add(1)
		}
		for i := 0; i < n; i++ {
			pkts[i].N = 0
		}
	}
}

// endpoint is a peer's end of the flow: every device of a network uses the
// same UDP port, as RoCEv2 does.
func (d *Device) endpoint(g verbs.GID) roce.Endpoint { return roce.Endpoint{GID: g, Port: d.port} }

// source is the end of a received packet's flow: port 0 (a wire that does
// not say) is the network's port, which every device here sends from.
func (d *Device) source(g verbs.GID, port uint16) roce.Endpoint {
	if port == 0 {
		port = d.port
	}
	return roce.Endpoint{GID: g, Port: port}
}

func (d *Device) lookupQP(qpn uint32) *qp {
	d.qpMu.RLock()
	q := d.qps[qpn]
	d.qpMu.RUnlock()
	return q
}

func (d *Device) getTxq() *txq  { return d.txPool.Get().(*txq) }
func (d *Device) putTxq(t *txq) { t.flush(); d.txPool.Put(t) }
