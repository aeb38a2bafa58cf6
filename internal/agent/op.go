package agent

import (
	"context"
	"errors"
	"fmt"

	"github.com/rdmavisor/rdmavisor/internal/engine"
	"github.com/rdmavisor/rdmavisor/internal/frame"
	"github.com/rdmavisor/rdmavisor/internal/shm"
	"github.com/rdmavisor/rdmavisor/internal/verbs"
)

// work runs the vconn's operations in order and answers each; those
// still queued when the vconn ends are answered with why it ended. Its
// sends go through the agent's send loop (forward); the other operations
// run as opSource meets them, in order with the sends.
func (h *vconnHandle) work() {
	defer h.s.wg.Done()
	defer h.dropRegions()
	defer h.refuseQueued()
	forward(h.ctx, h.vc, &opSource{h: h})
}

// opSource is the session's queue of a vconn's operations as a source of
// messages: Sends are forward's, the rest it runs itself.
type opSource struct {
	h   *vconnHandle
	cur op // the Send next returned
}

func (s *opSource) next() (outgoing, error) {
	h := s.h
	for {
		select {
		case <-h.ctx.Done():
			return outgoing{}, h.ctx.Err()
		case o := <-h.ops:
			if o.f.Op != frame.OpSend {
				r, fds, err := h.do(o.f)
				h.answerRights(o, r, fds, err)
				continue
			}
			if max := h.info.MaxMessage; uint32(len(o.f.Payload)) > max {
				h.answer(o, frame.Frame{}, fmt.Errorf("send %d bytes on a %v vconn: %w (%d)", len(o.f.Payload), h.info.Transport, engine.ErrTooLarge, max))
				continue
			}
			s.cur = o
			return outgoing{data: o.f.Payload, imm: o.f.Arg, hasImm: o.f.Flags&frame.FlagImm != 0}, nil
		}
	}
}

// sent answers the Send; a failed one ends only itself: the operations
// after it are answered in turn (with the vconn's failure, if it failed).
func (s *opSource) sent(err error) bool {
	s.h.answer(s.cur, frame.Frame{Op: frame.OpOK, Req: s.cur.f.Req, Handle: s.h.id}, err)
	s.cur = op{}
	return true
}

func (s *opSource) end(error) {} // the vconn ended: refuseQueued answers the rest

// answer gives back o's place in the window, then writes its reply r or
// its error: a client that sends again on reading the answer finds the
// place free.
func (h *vconnHandle) answer(o op, r frame.Frame, err error) {
	h.answerRights(o, r, nil, err)
}

// answerRights is answer with descriptors passed with the OK (none with
// an error); it closes them once written.
func (h *vconnHandle) answerRights(o op, r frame.Frame, fds []int, err error) {
	if err != nil && errors.Is(err, context.Canceled) && h.ctx.Err() != nil {
		// Closed under it (Close, the session's end): the operation
		// was not done, as those still queued (refuseQueued).
		err = h.ended()
	}
	h.doneOp(o)
	switch {
	case err != nil:
		_ = h.s.replyErr(o.f.Req, h.id, err)
	case len(fds) > 0:
		_ = h.s.writeRights(&r, fds)
	default:
		_ = h.s.write(&r)
	}
	shm.CloseFDs(fds)
	h.answered()
}

// do runs one operation other than Send and returns its OK reply, with
// the descriptors to pass with it (answerRights closes them).
func (h *vconnHandle) do(f frame.Frame) (frame.Frame, []int, error) {
	switch {
	case f.Op == frame.OpExport:
		return h.export(f)
	case f.Op == frame.OpStage:
		return h.stageMemory(f)
	case (f.Op == frame.OpWrite || f.Op == frame.OpRead) && f.Flags&frame.FlagMemfd != 0:
		r, err := h.staged(f)
		return r, nil, err
	}
	r, err := h.run(f)
	return r, nil, err
}

// stageMemory gives the vconn staging memory (frame.OpStage): a sealed
// memfd, as a region's, the engine registers for its one-sided
// operations (engine.VConn.Stage), so that their bytes cross no socket.
// The mapping goes once the engine deregistered it, at the vconn's end.
func (h *vconnHandle) stageMemory(f frame.Frame) (frame.Frame, []int, error) {
	s := h.s
	if h.stage != nil {
		return frame.Frame{}, nil, fmt.Errorf("stage: the vconn has staging memory already: %w", verbs.ErrInvalid)
	}
	if f.Arg2 == 0 {
		return frame.Frame{}, nil, fmt.Errorf("stage 0 bytes: %w: want 1..%d", verbs.ErrInvalid, s.al.a.cfg.MaxMessageBytes)
	}
	size := int64(min(f.Arg2, uint64(s.al.a.cfg.MaxMessageBytes)))
	if err := s.al.claimStaging(size); err != nil {
		return frame.Frame{}, nil, err
	}
	fd, mem, err := shm.NewMemfd(fmt.Sprintf("rdmavisor-%s-%d-stage", s.al.id, h.id), int(size))
	if err != nil {
		s.al.releaseStaging(size)
		return frame.Frame{}, nil, fmt.Errorf("stage: %w", err)
	}
	st, err := h.vc.Stage(mem, func() {
		_ = shm.Unmap(mem)
		s.al.releaseStaging(size)
	})
	if errors.Is(err, engine.ErrRegisteredLimit) {
		err = fmt.Errorf("stage %d bytes: the node's regions are at limits.registeredBytes: %w", size, err)
	}
	if err != nil {
		shm.CloseFDs([]int{fd})
		return frame.Frame{}, nil, err
	}
	h.stage = st
	return frame.Frame{Op: frame.OpOK, Req: f.Req, Handle: h.id, Arg2: uint64(size)}, []int{fd}, nil
}

// staged runs a Write or Read whose bytes are in the vconn's staging
// memory (FlagMemfd).
func (h *vconnHandle) staged(f frame.Frame) (frame.Frame, error) {
	if h.stage == nil {
		return frame.Frame{}, fmt.Errorf("%v with its bytes staged: the vconn has no staging memory (stage first): %w", f.Op, verbs.ErrInvalid)
	}
	at, n, err := frame.DecodeStaged(f.Payload)
	if err != nil {
		return frame.Frame{}, fmt.Errorf("%v: %w: %w", f.Op, verbs.ErrInvalid, err)
	}
	if uint64(at)+uint64(n) > uint64(h.stage.Len()) {
		return frame.Frame{}, fmt.Errorf("%v: %d bytes at %d outside the %d of staging memory: %w", f.Op, n, at, h.stage.Len(), verbs.ErrInvalid)
	}
	if f.Op == frame.OpWrite {
		err = h.vc.WriteFrom(h.ctx, f.Arg, f.Arg2, h.stage, int(at), int(n))
	} else {
		err = h.vc.ReadInto(h.ctx, f.Arg, f.Arg2, h.stage, int(at), int(n))
	}
	if err != nil {
		return frame.Frame{}, err
	}
	return frame.Frame{Op: frame.OpOK, Req: f.Req, Handle: h.id}, nil
}

// export registers and exports a region, in a memfd it passes to the pod
// if asked (FlagMemfd).
func (h *vconnHandle) export(f frame.Frame) (frame.Frame, []int, error) {
	s, vc := h.s, h.vc
	// The whole of arg is the access: bits the protocol does not
	// define are refused, not dropped (a later version may use them).
	if f.Arg == 0 || f.Arg&^uint32(engine.AccessRead|engine.AccessWrite) != 0 {
		return frame.Frame{}, nil, fmt.Errorf("export with access %#x: %w: want 1 (read), 2 (write) or 3", f.Arg, verbs.ErrInvalid)
	}
	if f.Arg2 == 0 {
		return frame.Frame{}, nil, fmt.Errorf("export of 0 bytes: %w: want 1..%d", verbs.ErrInvalid, s.al.a.cfg.MaxMessageBytes)
	}
	if f.Arg2 > uint64(s.al.a.cfg.MaxMessageBytes) {
		return frame.Frame{}, nil, fmt.Errorf("export %d bytes: %w: at most %d (the agent's maxMessageBytes)", f.Arg2, engine.ErrTooLarge, s.al.a.cfg.MaxMessageBytes)
	}
	size := int64(f.Arg2)
	if err := s.al.claimRegion(size); err != nil {
		return frame.Frame{}, nil, err
	}
	// The claim is given back once the memory is deregistered,
	// not at Unexport or the vconn's end: until the peer confirms
	// (or the grace ends) it is still registered, and pinned.
	released := func() { s.al.releaseRegion(size) }
	var fds []int
	var r *engine.Region
	var err error
	if f.Flags&frame.FlagMemfd != 0 {
		fds, r, err = h.exportMemfd(int(size), engine.Access(f.Arg), released)
	} else {
		r, err = vc.Export(h.ctx, int(size), engine.Access(f.Arg), released)
	}
	if errors.Is(err, engine.ErrRegisteredLimit) {
		return frame.Frame{}, nil, fmt.Errorf("export %d bytes: the node's regions are at limits.registeredBytes: %w", size, err)
	}
	if err != nil {
		return frame.Frame{}, nil, err
	}
	if h.regions == nil {
		h.regions = make(map[uint32]*engine.Region)
	}
	h.regions[r.ID()] = r
	return frame.Frame{Op: frame.OpOK, Req: f.Req, Handle: h.id, Arg: r.ID()}, fds, nil
}

// exportMemfd exports size bytes of a sealed memfd (shm.NewMemfd: the pod
// can neither shrink it under the agent's mapping nor grow it) and
// returns its descriptor for the pod. The mapping goes once the engine
// deregistered it, before released. Where no memfd can be made, the
// region is the engine's memory, reached over the socket only.
func (h *vconnHandle) exportMemfd(size int, access engine.Access, released func()) ([]int, *engine.Region, error) {
	fd, mem, err := shm.NewMemfd(fmt.Sprintf("rdmavisor-%s-%d-region", h.s.al.id, h.id), size)
	if err != nil {
		h.s.log.Info("No memfd for a region: exporting it unmapped", "vconn", h.id, "reason", err.Error())
		r, err := h.vc.Export(h.ctx, size, access, released)
		return nil, r, err
	}
	r, err := h.vc.ExportMem(h.ctx, mem, access, func() {
		_ = shm.Unmap(mem)
		released()
	})
	if err != nil {
		shm.CloseFDs([]int{fd})
		return nil, nil, err
	}
	return []int{fd}, r, nil
}

// run runs one operation other than Send and Export and returns its OK
// reply.
func (h *vconnHandle) run(f frame.Frame) (frame.Frame, error) {
	vc := h.vc
	switch f.Op {
	case frame.OpUnexport:
		r := h.regions[f.Arg]
		if r == nil {
			return frame.Frame{}, fmt.Errorf("unexport region %d: %w", f.Arg, engine.ErrNoRegion)
		}
		delete(h.regions, f.Arg)
		if err := r.Close(); err != nil {
			return frame.Frame{}, err
		}
		return frame.Frame{Op: frame.OpOK, Req: f.Req, Handle: h.id}, nil
	case frame.OpLocalRead, frame.OpLocalWrite:
		var l uint32
		if f.Op == frame.OpLocalRead {
			var err error
			if l, err = lengthOf(f); err != nil {
				return frame.Frame{}, err
			}
		}
		r := h.regions[f.Arg]
		if r == nil {
			return frame.Frame{}, fmt.Errorf("%v region %d: %w", f.Op, f.Arg, engine.ErrNoRegion)
		}
		// Copies go through the region, which its end (the peer's
		// unexport acknowledgement, the vconn failing) cannot race.
		if f.Arg2 > uint64(r.Len()) {
			return frame.Frame{}, fmt.Errorf("%v: offset %d outside region %d of %d: %w", f.Op, f.Arg2, f.Arg, r.Len(), engine.ErrRegionAccess)
		}
		if f.Op == frame.OpLocalWrite {
			if _, err := r.WriteAt(f.Payload, int64(f.Arg2)); err != nil {
				return frame.Frame{}, fmt.Errorf("%v: %w", f.Op, err)
			}
			return frame.Frame{Op: frame.OpOK, Req: f.Req, Handle: h.id}, nil
		}
		if uint64(l) > uint64(r.Len())-f.Arg2 {
			return frame.Frame{}, fmt.Errorf("%v: %d bytes at %d outside region %d of %d: %w", f.Op, l, f.Arg2, f.Arg, r.Len(), engine.ErrRegionAccess)
		}
		buf := make([]byte, l)
		if _, err := r.ReadAt(buf, int64(f.Arg2)); err != nil {
			return frame.Frame{}, fmt.Errorf("%v: %w", f.Op, err)
		}
		return frame.Frame{Op: frame.OpOK, Req: f.Req, Handle: h.id, Payload: buf}, nil
	case frame.OpWrite:
		if err := vc.Write(h.ctx, f.Arg, f.Arg2, f.Payload); err != nil {
			return frame.Frame{}, err
		}
		return frame.Frame{Op: frame.OpOK, Req: f.Req, Handle: h.id}, nil
	case frame.OpRead:
		l, err := lengthOf(f)
		if err != nil {
			return frame.Frame{}, err
		}
		buf := make([]byte, l)
		if err := vc.Read(h.ctx, f.Arg, f.Arg2, buf); err != nil {
			return frame.Frame{}, err
		}
		return frame.Frame{Op: frame.OpOK, Req: f.Req, Handle: h.id, Payload: buf}, nil
	}
	return frame.Frame{}, fmt.Errorf("%v: %w", f.Op, verbs.ErrInvalid)
}

// lengthOf reads the u32 length payload of LocalRead and Read: one of
// more than MaxPayload bytes is too large (CodeTooLarge), a payload that
// is no u32 a bad request.
func lengthOf(f frame.Frame) (uint32, error) {
	l, err := frame.DecodeLength(f.Payload)
	switch {
	case errors.Is(err, frame.ErrTooBig):
		return 0, fmt.Errorf("%v: %w: %w", f.Op, engine.ErrTooLarge, err)
	case err != nil:
		return 0, fmt.Errorf("%v: %w: %w", f.Op, verbs.ErrInvalid, err)
	}
	return l, nil
}

// dropRegions withdraws the vconn's regions and its staging memory; each
// is given back to the allocation once deregistered (Export's and Stage's
// released).
func (h *vconnHandle) dropRegions() {
	for id, r := range h.regions {
		_ = r.Close()
		delete(h.regions, id)
	}
	if h.stage != nil {
		_ = h.stage.Close()
		h.stage = nil
	}
}
