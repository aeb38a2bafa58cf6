package engine

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"sync"

	"github.com/rdmavisor/rdmavisor/internal/verbs"
)

// Access says what a peer may do to an exported region.
type Access uint8

const (
	AccessRead  Access = 1 << 0
	AccessWrite Access = 1 << 1
)

var (
	// ErrNoRegion is a one-sided operation on a region the peer has not
	// exported to this vconn (or no longer does).
	ErrNoRegion = errors.New("engine: region not exported to this vconn")
	// ErrRegionAccess is an operation outside the region or not allowed
	// by its access.
	ErrRegionAccess = errors.New("engine: region access denied")
)

// Region is memory a vconn exports to its peer vconn, and only to it: the
// peer engine learns the region's address and key over this vconn and lets
// only this vconn's peer use them. Bytes is registered memory: the peer's
// writes land in it and its reads come from it, without this side's CPU.
type Region struct {
	vc     *VConn
	id     uint32
	mr     verbs.MR
	access Access
	once   sync.Once
}

// regionAd is what an export message carries after its header.
const regionAdLen = 8 + 4 + 8 + 1

// remoteRegion is a region the peer exported to this vconn.
type remoteRegion struct {
	addr   uint64
	rkey   uint32
	length uint64
	access Access
}

// regions is a vconn's one-sided state, allocated on first use so vconns
// that never export or read cost nothing.
type regions struct {
	mu           sync.Mutex
	next         uint32                  // last export id; guarded by mu
	exports      map[uint32]*Region      // exported by this side; guarded by mu
	remote       map[uint32]remoteRegion // exported to this side; guarded by mu
	unexportAcks []uint32                // confirmations to send; guarded by mu
	op           oneSided
}

// rg returns the vconn's one-sided state, creating it.
func (vc *VConn) rg() *regions {
	if r := vc.regions.Load(); r != nil {
		return r
	}
	vc.regions.CompareAndSwap(nil, &regions{})
	return vc.regions.Load()
}

// oneSided is a vconn's one-sided operation in progress (one at a time).
type oneSided struct {
	mu  sync.Mutex     // serialises Write and Read on the vconn
	wrs []verbs.SendWR // the operation's WRs, posted at the ring's marker

	cmu     sync.Mutex // guards the completion state below
	pending int        // WRs not completed
	reads   []uint32   // read destination offsets in dst, by post order
	dst     []byte
	err     error
	done    chan struct{} // closed when pending reaches 0
}

// opMarker in a vconn's ring says "post the pending one-sided WRs here",
// which keeps one-sided operations in order with the vconn's messages.
const opMarker = ^bufSlot(0)

// Export registers size bytes and exports them to the peer vconn with the
// given access. The export reaches the peer before any message sent after
// Export returns.
func (vc *VConn) Export(ctx context.Context, size int, access Access) (*Region, error) {
	if size <= 0 || access&^(AccessRead|AccessWrite) != 0 || access == 0 {
		return nil, fmt.Errorf("engine: export %d bytes with access %#x: %w", size, access, verbs.ErrInvalid)
	}
	if vc.state.Load() != stateOpen {
		return nil, fmt.Errorf("engine: export on vconn %v: %w", vc.id, vc.stateErr())
	}
	va := verbs.AccessLocalWrite
	if access&AccessRead != 0 {
		va |= verbs.AccessRemoteRead
	}
	if access&AccessWrite != 0 {
		va |= verbs.AccessRemoteWrite
	}
	mr, err := vc.e.pd.RegMR(size, va)
	if err != nil {
		return nil, fmt.Errorf("engine: export on vconn %v: %w", vc.id, err)
	}
	rg := vc.rg()
	rg.mu.Lock()
	rg.next++
	r := &Region{vc: vc, id: rg.next, mr: mr, access: access}
	if rg.exports == nil {
		rg.exports = make(map[uint32]*Region)
	}
	rg.exports[r.id] = r
	rg.mu.Unlock()

	var ad [regionAdLen]byte
	binary.BigEndian.PutUint64(ad[0:], mr.Addr())
	binary.BigEndian.PutUint32(ad[8:], mr.RKey())
	binary.BigEndian.PutUint64(ad[12:], uint64(size))
	ad[20] = byte(access)
	if err := vc.sendControl(ctx, msgExport, r.id, ad[:]); err != nil {
		rg.mu.Lock()
		delete(rg.exports, r.id)
		rg.mu.Unlock()
		return nil, errors.Join(err, mr.Close())
	}
	return r, nil
}

// ID names the region to the peer.
func (r *Region) ID() uint32 { return r.id }

// Bytes is the region's memory.
func (r *Region) Bytes() []byte { return r.mr.Bytes() }

// Close withdraws the export. The memory is deregistered once the peer has
// confirmed it stopped using the region (or the vconn ends), so an
// operation already in flight never hits a dead key.
func (r *Region) Close() error {
	var err error
	r.once.Do(func() {
		vc := r.vc
		if vc.state.Load() == stateOpen {
			err = vc.sendControl(context.Background(), msgUnexport, r.id, nil)
			if err == nil {
				return // deregistered on the peer's acknowledgement
			}
		}
		rg := vc.rg()
		rg.mu.Lock()
		_, live := rg.exports[r.id]
		delete(rg.exports, r.id)
		rg.mu.Unlock()
		if live {
			err = errors.Join(err, r.mr.Close())
		}
	})
	return err
}

// sendControl queues a control message (export, unexport) in order with the
// vconn's data.
func (vc *VConn) sendControl(ctx context.Context, t msgType, arg uint32, payload []byte) error {
	e := vc.e
	vc.sendMu.Lock()
	defer vc.sendMu.Unlock()
	slot, err := vc.getBuffer(ctx, headerLen+len(payload), true)
	if err != nil {
		return err
	}
	b := e.pool.bytes(slot)
	h := regionHeader(t, arg)
	h.put(b)
	copy(b[headerLen:], payload)
	if err := vc.waitRing(ctx, true); err != nil {
		e.pool.put(slot)
		return err
	}
	vc.push(newEntry(slot, uint32(headerLen+len(payload))))
	vc.schedule()
	return nil
}

// onExport records a region the peer exported to this vconn.
func (vc *VConn) onExport(h *header, payload []byte) error {
	if len(payload) != regionAdLen {
		return fmt.Errorf("engine: export message of %d bytes", len(payload))
	}
	r := remoteRegion{
		addr:   binary.BigEndian.Uint64(payload[0:]),
		rkey:   binary.BigEndian.Uint32(payload[8:]),
		length: binary.BigEndian.Uint64(payload[12:]),
		access: Access(payload[20]),
	}
	if r.length == 0 || r.access&^(AccessRead|AccessWrite) != 0 || r.addr+r.length < r.addr {
		return fmt.Errorf("engine: bad export %+v", r)
	}
	rg := vc.rg()
	rg.mu.Lock()
	if rg.remote == nil {
		rg.remote = make(map[uint32]remoteRegion)
	}
	rg.remote[h.region()] = r
	rg.mu.Unlock()
	return nil
}

// onUnexport forgets a region and confirms; operations this side posted
// before the confirmation reach the peer first (same QP, in order).
func (vc *VConn) onUnexport(h *header) {
	rg := vc.rg()
	rg.mu.Lock()
	_, had := rg.remote[h.region()]
	delete(rg.remote, h.region())
	if had {
		rg.unexportAcks = append(rg.unexportAcks, h.region())
	}
	rg.mu.Unlock()
	if had {
		vc.schedule()
	}
}

// onUnexported: the peer confirmed it stopped using region id.
func (vc *VConn) onUnexported(id uint32) {
	rg := vc.rg()
	rg.mu.Lock()
	r := rg.exports[id]
	delete(rg.exports, id)
	rg.mu.Unlock()
	if r != nil {
		_ = r.mr.Close()
	}
}

// releaseRegions deregisters what the vconn exported; called when the peer
// can no longer touch them (its FIN came, or the vconn is gone).
func (vc *VConn) releaseRegions() {
	rg := vc.regions.Load()
	if rg == nil {
		return
	}
	rg.mu.Lock()
	exp := rg.exports
	rg.exports, rg.remote, rg.unexportAcks = nil, nil, nil
	rg.mu.Unlock()
	for _, r := range exp {
		_ = r.mr.Close()
	}
}

// Write copies data into the peer's region id at off with RDMA WRITE, and
// returns when it is placed.
func (vc *VConn) Write(ctx context.Context, id uint32, off uint64, data []byte) error {
	return vc.oneSided(ctx, verbs.WRRDMAWrite, id, off, data)
}

// Read copies len(dst) bytes from the peer's region id at off with RDMA
// READ.
func (vc *VConn) Read(ctx context.Context, id uint32, off uint64, dst []byte) error {
	return vc.oneSided(ctx, verbs.WRRDMARead, id, off, dst)
}

func (vc *VConn) oneSided(ctx context.Context, op verbs.WROpcode, id uint32, off uint64, buf []byte) error {
	e := vc.e
	if vc.state.Load() != stateOpen {
		return fmt.Errorf("engine: one-sided operation on vconn %v: %w", vc.id, vc.stateErr())
	}
	rg := vc.rg()
	rg.mu.Lock()
	r, ok := rg.remote[id]
	rg.mu.Unlock()
	need := AccessWrite
	if op == verbs.WRRDMARead {
		need = AccessRead
	}
	switch {
	case !ok:
		return fmt.Errorf("engine: vconn %v region %d: %w", vc.id, id, ErrNoRegion)
	case r.access&need == 0:
		return fmt.Errorf("engine: vconn %v region %d: %w: not exported for %v", vc.id, id, ErrRegionAccess, op)
	case off > r.length || uint64(len(buf)) > r.length-off:
		return fmt.Errorf("engine: vconn %v region %d: %w: %d bytes at %d outside its %d", vc.id, id, ErrRegionAccess, len(buf), off, r.length)
	}
	o := &rg.op
	o.mu.Lock()
	defer o.mu.Unlock()
	per := e.cfg.ChunkSize
	o.cmu.Lock()
	o.wrs, o.reads, o.err, o.dst = o.wrs[:0], o.reads[:0], nil, buf
	o.done = make(chan struct{})
	o.cmu.Unlock()
	var slots []bufSlot
	for pos := 0; pos < len(buf) || pos == 0 && len(buf) == 0; pos += per {
		n := min(per, len(buf)-pos)
		slot, err := vc.getBuffer(ctx, max(n, 1), true)
		if err != nil {
			for _, s := range slots {
				e.pool.put(s)
			}
			return err
		}
		slots = append(slots, slot)
		if op == verbs.WRRDMAWrite {
			copy(e.pool.bytes(slot), buf[pos:pos+n])
		} else {
			o.cmu.Lock()
			o.reads = append(o.reads, uint32(pos))
			o.cmu.Unlock()
		}
		o.wrs = append(o.wrs, verbs.SendWR{
			WRID: tagOf(slot).wrID(vc.id), Opcode: op, Flags: verbs.SendSignaled,
			NumSGE: 1, SG: [verbs.MaxSGE]verbs.SGE{e.pool.sge(slot, uint32(n))},
			RemoteAddr: r.addr + off + uint64(pos), RKey: r.rkey,
		})
		if len(buf) == 0 {
			break
		}
	}
	o.cmu.Lock()
	o.pending = len(o.wrs)
	done := o.done
	o.cmu.Unlock()
	vc.sendMu.Lock()
	err := vc.waitRing(ctx, true)
	if err == nil {
		vc.push(newEntry(opMarker, 0))
		vc.schedule()
	}
	vc.sendMu.Unlock()
	if err != nil {
		o.cmu.Lock()
		o.pending = 0
		o.cmu.Unlock()
		for _, s := range slots {
			e.pool.put(s)
		}
		return err
	}
	select {
	case <-done:
	case <-ctx.Done():
		// The WRs are queued or posted and will complete; their buffers
		// come back then. The peer cannot be told to stop: the vconn fails.
		vc.fail(fmt.Errorf("one-sided operation abandoned: %w", ctx.Err()))
		<-done
	}
	o.cmu.Lock()
	defer o.cmu.Unlock()
	return o.err
}

// abandonOp ends an operation whose completions will not be seen: the
// vconn was released (its vQPN may already have a new owner).
func (vc *VConn) abandonOp(err error) {
	rg := vc.regions.Load()
	if rg == nil {
		return
	}
	o := &rg.op
	o.cmu.Lock()
	if o.pending > 0 {
		o.pending = 0
		if o.err == nil {
			o.err = err
		}
		close(o.done)
	}
	o.cmu.Unlock()
}

// opCompleted is called by the poller for each one-sided WR's completion.
func (vc *VConn) opCompleted(wc *verbs.WC, slot bufSlot) {
	rg := vc.regions.Load()
	if rg == nil {
		return
	}
	o := &rg.op
	o.cmu.Lock()
	defer o.cmu.Unlock()
	if o.pending == 0 {
		return // abandoned
	}
	if wc.Status != verbs.WCSuccess && o.err == nil {
		o.err = fmt.Errorf("engine: vconn %v: %w", vc.id, wc.Err())
	}
	if wc.Opcode == verbs.WCRDMARead && len(o.reads) > 0 {
		at := o.reads[0]
		o.reads = o.reads[1:]
		if wc.Status == verbs.WCSuccess {
			copy(o.dst[at:], vc.e.pool.bytes(slot)[:min(uint32(len(o.dst))-at, uint32(vc.e.cfg.ChunkSize))])
		}
	}
	o.pending--
	if o.pending == 0 {
		close(o.done)
	}
}

// takeUnexportAcks returns the confirmations the poller must send.
func (vc *VConn) takeUnexportAcks() []uint32 {
	rg := vc.regions.Load()
	if rg == nil {
		return nil
	}
	rg.mu.Lock()
	defer rg.mu.Unlock()
	acks := rg.unexportAcks
	rg.unexportAcks = nil
	return acks
}
