package engine

import (
	"context"
	"errors"
	"fmt"
	"sync"

	"github.com/rdmavisor/rdmavisor/internal/engine/format"
	"github.com/rdmavisor/rdmavisor/internal/verbs"
)

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

	mu     sync.Mutex
	busy   int  // operations whose work requests may be in flight; guarded by mu
	lost   bool // one ended with its work requests possibly in flight (abandoned); guarded by mu
	closed bool // Close was called; guarded by mu
	gone   bool // deregistered; guarded by mu
}

// stagedSlot is the wr_id tag's slot of a work request on staging memory:
// no buffer of the pool (whose classes hold fewer than 2^24-1 buffers, so
// the last index of the last class is never one).
const stagedSlot = bufSlot(format.TagSlotMask)

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
