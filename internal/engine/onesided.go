package engine

import (
	"context"
	"errors"
	"fmt"
	"sync"

	"github.com/rdmavisor/rdmavisor/internal/engine/format"
	"github.com/rdmavisor/rdmavisor/internal/verbs"
)

// One-sided operations: a vconn's RDMA WRITEs and READs to the regions its
// peer exported to it (region.go). An operation's work requests wait in
// the vconn's ring behind a marker, so they keep their place among its
// messages, and its poller posts them (serve.go postMarker).

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
			if err := e.poolUse(); err != nil {
				vc.putAll(slots)
				return nil, err
			}
			copy(e.pool.bytes(slot), buf[pos:pos+n])
			e.poolDone()
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
	return vc.queueEntry(ctx, func() (ringEntry, error) {
		// The region must still be exported when the marker goes in: the
		// poller confirms an unexport only once the ring holds no marker
		// queued before it, so a WR can never reach the peer after it
		// deregistered the memory (a remote access error there would fail
		// the shared QP and every vconn on it).
		rg.mu.Lock()
		defer rg.mu.Unlock()
		if now, still := rg.remote[id]; !still || now != r {
			return 0, fmt.Errorf("engine: vconn %v region %d: %w", vc.id, id, ErrNoRegion)
		}
		rg.marks++ // under rg.mu, with the push after it: the marker is queued
		return newEntry(opMarker, 0), nil
	})
}

// putAll returns send buffers an operation will not use.
func (vc *VConn) putAll(slots []bufSlot) {
	for _, s := range slots {
		vc.e.pool.put(s)
	}
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

// Staging is memory the caller owns, registered for one vconn's one-sided
// operations to write from and read into (WriteFrom, ReadInto) in place
// of the engine's send buffers: the agent's mapping of a memfd it shares
// with a pod, so that the bytes of an RDMA WRITE or READ are copied once,
// by the pod, and cross no socket. It counts against MaxRegisteredBytes as
// a region does.
//
// The caller serialises nothing: the vconn runs one operation at a time
// (rdmaOp.mu), and the caller keeps the bytes of an operation in place
// until it returns.
type Staging struct {
	vc       *VConn
	mr       verbs.MR
	released func()
	returned func(token uint32) // StageSends'; nil for one-sided use only

	mu     sync.Mutex
	busy   int  // operations whose work requests may be in flight; guarded by mu
	lost   bool // one ended with its work requests possibly in flight (abandoned); guarded by mu
	closed bool // Close was called; guarded by mu
	gone   bool // deregistered; guarded by mu
}

// Stage registers mem, memory the caller mapped outside the Go heap and
// keeps mapped until released runs, for vc's WriteFrom and ReadInto.
// released, if not nil, runs exactly once: after Close, once no work
// request can touch mem any more and it is deregistered, or before Stage
// returns an error. It may run on a timer's goroutine: it must not block.
func (vc *VConn) Stage(mem []byte, released func()) (*Staging, error) {
	e := vc.e
	fail := func(err error) (*Staging, error) {
		if released != nil {
			released()
		}
		return nil, err
	}
	if len(mem) == 0 {
		return fail(fmt.Errorf("engine: staging of 0 bytes on vconn %v: %w", vc.id, verbs.ErrInvalid))
	}
	if vc.state.Load() != stateOpen {
		return fail(fmt.Errorf("engine: staging on vconn %v: %w", vc.id, vc.stateErr()))
	}
	if err := e.reserve(int64(len(mem))); err != nil {
		return fail(fmt.Errorf("engine: staging of %d bytes on vconn %v: %w", len(mem), vc.id, err))
	}
	// Local write: an RDMA READ lands in it. Nothing remote.
	mr, err := e.pd.RegMRMem(mem, verbs.AccessLocalWrite)
	if err != nil {
		e.registered.Add(-int64(len(mem)))
		return fail(fmt.Errorf("engine: staging on vconn %v: %w", vc.id, err))
	}
	return &Staging{vc: vc, mr: mr, released: released}, nil
}

// Len is the staging memory's size.
func (s *Staging) Len() int { return len(s.mr.Bytes()) }

// WriteFrom writes the n bytes of s at at into the peer's region id at
// off with RDMA WRITE, and returns when they are placed, as Write.
func (vc *VConn) WriteFrom(ctx context.Context, id uint32, off uint64, s *Staging, at, n int) error {
	return vc.rdmaStaged(ctx, verbs.WRRDMAWrite, id, off, s, at, n)
}

// ReadInto reads n bytes of the peer's region id at off into s at at with
// RDMA READ, as Read.
func (vc *VConn) ReadInto(ctx context.Context, id uint32, off uint64, s *Staging, at, n int) error {
	return vc.rdmaStaged(ctx, verbs.WRRDMARead, id, off, s, at, n)
}

// rdmaStaged runs one one-sided operation whose local memory is n bytes of
// s at at: one work request, which the poller posts at the vconn's marker
// as rdma's.
func (vc *VConn) rdmaStaged(ctx context.Context, op verbs.WROpcode, id uint32, off uint64, s *Staging, at, n int) error {
	if s.vc != vc {
		return fmt.Errorf("engine: vconn %v: staging memory of vconn %v: %w", vc.id, s.vc.id, verbs.ErrInvalid)
	}
	if at < 0 || n < 0 || at > s.Len() || n > s.Len()-at {
		return fmt.Errorf("engine: vconn %v: %d bytes at %d outside its %d of staging memory: %w", vc.id, n, at, s.Len(), verbs.ErrInvalid)
	}
	rg, r, err := vc.remoteFor(op, id, off, n)
	if err != nil {
		return err
	}
	o := &rg.op
	o.mu.Lock()
	defer o.mu.Unlock()
	if err := s.acquire(); err != nil {
		return fmt.Errorf("engine: vconn %v: %w", vc.id, err)
	}
	o.cmu.Lock()
	o.wrs, o.reads, o.err, o.dst, o.abandoned = o.wrs[:0], o.reads[:0], nil, nil, false
	o.done = make(chan struct{})
	o.wrs = append(o.wrs, verbs.SendWR{
		WRID: format.TagOf(uint32(stagedSlot)).WRID(vc.id), Opcode: op, Flags: verbs.SendSignaled,
		NumSGE: 1, SG: [verbs.MaxSGE]verbs.SGE{{Addr: s.mr.Addr() + uint64(at), Length: uint32(n), LKey: s.mr.LKey()}},
		RemoteAddr: r.Addr + off, RKey: r.RKey,
	})
	o.cmu.Unlock()
	abandoned, err := vc.runOp(ctx, o, rg, id, r, func() {})
	s.done(abandoned)
	return err
}

var errStagingClosed = errors.New("staging memory closed")

// acquire counts an operation on s; it fails once s is closed.
func (s *Staging) acquire() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return errStagingClosed
	}
	s.busy++
	return nil
}

// done ends an operation acquire counted; abandoned says its work request
// may still be in flight.
func (s *Staging) done(abandoned bool) {
	s.mu.Lock()
	s.busy--
	s.lost = s.lost || abandoned
	last := s.closed && s.busy == 0
	s.mu.Unlock()
	if last {
		s.deregister()
	}
}

// Close deregisters the memory once no operation uses it. Where one was
// abandoned with its work request in flight (the vconn failed under it),
// the memory stays registered for the grace a region gets (regionGrace),
// so the request never meets a dead key, which would fail the shared QP
// and every vconn on it.
func (s *Staging) Close() error {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return nil
	}
	s.closed = true
	idle := s.busy == 0
	s.mu.Unlock()
	if idle {
		s.deregister()
	}
	return nil
}

func (s *Staging) deregister() {
	s.mu.Lock()
	lost := s.lost
	s.mu.Unlock()
	if lost {
		s.vc.e.releaseLater(s)
		return
	}
	_ = s.release()
}

// release deregisters the memory, then stops counting it and runs
// released. A failed deregistration leaves it registered and counted.
func (s *Staging) release() error {
	s.mu.Lock()
	if s.gone {
		s.mu.Unlock()
		return nil
	}
	s.gone = true
	s.mu.Unlock()
	if s.returned != nil {
		s.unlend()
	}
	n := len(s.mr.Bytes())
	if err := s.mr.Close(); err != nil {
		s.vc.e.log.Error(err, "Deregistering staging memory failed: it stays registered", "vconn", s.vc.id, "bytes", n)
		return err
	}
	s.vc.e.registered.Add(-int64(n))
	if s.released != nil {
		s.released()
	}
	return nil
}

// on is the peer whose QPs s's work requests go on.
func (s *Staging) on() *Peer { return s.vc.peer }

// sendControl queues a control message (export, unexport) in order with the
// vconn's data.
func (vc *VConn) sendControl(ctx context.Context, t format.Type, arg uint32, payload []byte) error {
	e := vc.e
	return vc.queueEntry(ctx, func() (ringEntry, error) {
		slot, err := vc.getBuffer(ctx, format.HeaderLen+len(payload), true)
		if err != nil {
			return 0, err
		}
		if err := e.poolUse(); err != nil {
			e.pool.put(slot)
			return 0, err
		}
		b := e.pool.bytes(slot)
		h := format.RegionHeader(t, arg)
		h.Put(b)
		copy(b[format.HeaderLen:], payload)
		e.poolDone()
		return newEntry(slot, uint32(format.HeaderLen+len(payload))), nil
	})
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

// retryUnexportAck puts back a confirmation that found no room to go.
// Only vc's poller calls it.
func (vc *VConn) retryUnexportAck(id uint32) {
	rg := vc.rg()
	rg.mu.Lock()
	rg.unexportAcks = append(rg.unexportAcks, unexportAck{id: id})
	rg.mu.Unlock()
}
