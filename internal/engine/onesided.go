package engine

import (
	"context"
	"fmt"
	"sync"

	"github.com/rdmavisor/rdmavisor/internal/engine/format"
	"github.com/rdmavisor/rdmavisor/internal/verbs"
)

// One-sided operations: a vconn's RDMA WRITEs and READs to the regions its
// peer exported to it (region.go). An operation's work requests wait in
// the vconn's ring behind a marker, so they keep their place among its
// messages, and its poller posts them (serve.go postMarker).

// rdmaOp is a vconn's one-sided operation in progress (one at a time).
type rdmaOp struct {
	mu  sync.Mutex     // serialises Write and Read on the vconn
	wrs []verbs.SendWR // the operation's WRs, posted at the ring's marker

	cmu     sync.Mutex // guards the completion state below
	pending int        // WRs not completed
	reads   []uint32   // read destination offsets in dst, by post order
	dst     []byte
	err     error
	done    chan struct{} // closed when pending reaches 0
	// abandoned: done was closed without the completions (abandonOp),
	// whose work requests may still be in flight.
	abandoned bool
}

// opMarker in a vconn's ring says "post the pending one-sided WRs here",
// which keeps one-sided operations in order with the vconn's messages.
const opMarker = ^bufSlot(0)

// Write copies data into the peer's region id at off with RDMA WRITE, and
// returns when it is placed.
func (vc *VConn) Write(ctx context.Context, id uint32, off uint64, data []byte) error {
	return vc.rdma(ctx, verbs.WRRDMAWrite, id, off, data)
}

// Read copies len(dst) bytes from the peer's region id at off with RDMA
// READ.
func (vc *VConn) Read(ctx context.Context, id uint32, off uint64, dst []byte) error {
	return vc.rdma(ctx, verbs.WRRDMARead, id, off, dst)
}

// rdma runs one one-sided operation of op on n = len(buf) bytes at off of
// the peer's region id: the application's goroutine, one operation per
// vconn at a time (o.mu).
func (vc *VConn) rdma(ctx context.Context, op verbs.WROpcode, id uint32, off uint64, buf []byte) error {
	rg, r, err := vc.remoteFor(op, id, off, len(buf))
	if err != nil {
		return err
	}
	o := &rg.op
	o.mu.Lock()
	defer o.mu.Unlock()
	slots, err := vc.prepareOp(ctx, o, op, r, off, buf)
	if err != nil {
		return err
	}
	_, err = vc.runOp(ctx, o, rg, id, r, func() { vc.putAll(slots) })
	return err
}

// runOp queues the work requests o holds (o.wrs, o.done made ready) at
// the vconn's marker and waits for them: whether the operation was
// abandoned with them perhaps still in flight, and their error. unqueued
// gives back what the operation held when it could not be queued. A
// caller that stops waiting fails the vconn: the WRs are queued or posted
// and will complete (their buffers come back then), and the peer cannot
// be told to stop.
func (vc *VConn) runOp(ctx context.Context, o *rdmaOp, rg *regions, id uint32, r remoteRegion, unqueued func()) (abandoned bool, err error) {
	o.cmu.Lock()
	o.pending = len(o.wrs)
	done := o.done
	o.cmu.Unlock()
	if err := vc.queueOp(ctx, rg, id, r); err != nil {
		o.cmu.Lock()
		o.pending = 0
		o.cmu.Unlock()
		unqueued()
		return false, err
	}
	select {
	case <-done:
	case <-ctx.Done():
		vc.fail(fmt.Errorf("one-sided operation abandoned: %w", ctx.Err()))
		<-done
	}
	o.cmu.Lock()
	defer o.cmu.Unlock()
	return o.abandoned, o.err
}

// remoteFor checks a one-sided operation against the region the peer
// exported: there, allowing op, and holding n bytes at off.
func (vc *VConn) remoteFor(op verbs.WROpcode, id uint32, off uint64, n int) (*regions, remoteRegion, error) {
	if vc.state.Load() != stateOpen {
		return nil, remoteRegion{}, fmt.Errorf("engine: one-sided operation on vconn %v: %w", vc.id, vc.stateErr())
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
		return nil, r, fmt.Errorf("engine: vconn %v region %d: %w", vc.id, id, ErrNoRegion)
	case Access(r.Access)&need == 0:
		return nil, r, fmt.Errorf("engine: vconn %v region %d: %w: not exported for %v", vc.id, id, ErrRegionAccess, op)
	case off > r.Length || uint64(n) > r.Length-off:
		return nil, r, fmt.Errorf("engine: vconn %v region %d: %w: %d bytes at %d outside its %d", vc.id, id, ErrRegionAccess, n, off, r.Length)
	}
	return rg, r, nil
}

// prepareOp readies o for op on buf: a work request per chunk, each with a
// send buffer (holding the data of a write; a read's lands there), and
// returns the buffers. o.mu is held.
func (vc *VConn) prepareOp(ctx context.Context, o *rdmaOp, op verbs.WROpcode, r remoteRegion, off uint64, buf []byte) ([]bufSlot, error) {
	e := vc.e
	per := e.cfg.ChunkSize
	o.cmu.Lock()
	o.wrs, o.reads, o.err, o.dst, o.abandoned = o.wrs[:0], o.reads[:0], nil, buf, false
	o.done = make(chan struct{})
	o.cmu.Unlock()
	var slots []bufSlot
	for pos := 0; pos < len(buf) || pos == 0 && len(buf) == 0; pos += per {
		n := min(per, len(buf)-pos)
		slot, err := vc.getBuffer(ctx, max(n, 1), true)
		if err != nil {
			vc.putAll(slots)
			return nil, err
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
			WRID: format.TagOf(uint32(slot)).WRID(vc.id), Opcode: op, Flags: verbs.SendSignaled,
			NumSGE: 1, SG: [verbs.MaxSGE]verbs.SGE{e.pool.sge(slot, uint32(n))},
			RemoteAddr: r.Addr + off + uint64(pos), RKey: r.RKey,
		})
		if len(buf) == 0 {
			break
		}
	}
	return slots, nil
}

// queueOp pushes the operation's marker into the ring, in order with the
// vconn's messages.
func (vc *VConn) queueOp(ctx context.Context, rg *regions, id uint32, r remoteRegion) error {
	vc.sendMu.Lock()
	defer vc.sendMu.Unlock()
	if err := vc.waitRing(ctx, true); err != nil {
		return err
	}
	// The region must still be exported when the marker goes in: the
	// poller confirms an unexport only once the ring holds no marker
	// queued before it, so a WR can never reach the peer after it
	// deregistered the memory (a remote access error there would fail
	// the shared QP and every vconn on it).
	rg.mu.Lock()
	now, still := rg.remote[id]
	if !still || now != r {
		rg.mu.Unlock()
		return fmt.Errorf("engine: vconn %v region %d: %w", vc.id, id, ErrNoRegion)
	}
	vc.push(newEntry(opMarker, 0))
	rg.marks++
	rg.mu.Unlock()
	vc.schedule()
	return nil
}

// putAll returns send buffers an operation will not use.
func (vc *VConn) putAll(slots []bufSlot) {
	for _, s := range slots {
		vc.e.pool.put(s)
	}
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
		o.abandoned = true
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

// takeUnexportAcks appends to ids the confirmations the poller may send
// now: those whose markers it posted. Only vc's poller calls it.
func (vc *VConn) takeUnexportAcks(ids []uint32) []uint32 {
	rg := vc.regions.Load()
	if rg == nil {
		return ids
	}
	rg.mu.Lock()
	defer rg.mu.Unlock()
	k := 0
	for _, a := range rg.unexportAcks {
		if a.after <= rg.posted {
			ids = append(ids, a.id)
		} else {
			rg.unexportAcks[k] = a
			k++
		}
	}
	rg.unexportAcks = rg.unexportAcks[:k]
	return ids
}
