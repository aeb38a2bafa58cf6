package agent

import (
	"context"
	"errors"
	"fmt"
	"io"
	"sync"

	"github.com/rdmavisor/rdmavisor/internal/engine"
	"github.com/rdmavisor/rdmavisor/internal/frame"
)

// vconnHandle is a vconn of a session, with its worker (ordered
// operations) and pump (deliveries within the granted window).
type vconnHandle struct {
	s      *session
	id     uint32
	vc     *engine.VConn
	info   frame.VConnInfo // what the application was told of vc
	ctx    context.Context
	cancel context.CancelFunc
	ops    chan op // at most SendWindow queued

	gmu     sync.Mutex
	window  int           // granted, not yet pushed; guarded by gmu
	granted chan struct{} // signalled when window grows

	regions map[uint32]*engine.Region // worker-owned
}

type op struct {
	f frame.Frame // Payload owned by the op
}

// add registers a vconn and starts its worker and pump; nil if the
// session closed.
func (s *session) add(vc *engine.VConn) *vconnHandle {
	ctx, cancel := context.WithCancel(s.ctx)
	h := &vconnHandle{s: s, vc: vc, info: vconnInfo(vc), ctx: ctx, cancel: cancel, ops: make(chan op, SendWindow), granted: make(chan struct{}, 1)}
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		cancel()
		return nil
	}
	s.next++
	h.id = s.next
	s.vconns[h.id] = h
	s.wg.Add(2)
	s.mu.Unlock()
	go h.work()
	go h.pump()
	return h
}

// closeVConn closes a vconn (FIN after what the engine queued) and frees
// its quota slot. While the agent stops, the engine's close fails the
// vconn instead, silently.
func (s *session) closeVConn(h *vconnHandle) {
	s.mu.Lock()
	_, live := s.vconns[h.id]
	delete(s.vconns, h.id)
	s.mu.Unlock()
	if !live {
		return
	}
	h.cancel()
	if !s.al.a.stopping.Load() {
		_ = h.vc.Close()
	}
	s.al.give()
}

func (h *vconnHandle) grant(n int) {
	if n <= 0 {
		return
	}
	h.gmu.Lock()
	h.window = min(h.window+n, 1<<20)
	h.gmu.Unlock()
	select {
	case h.granted <- struct{}{}:
	default:
	}
}

// pump delivers messages while the client has window: the agent reads
// from the engine only then, so an application that does not read holds
// its vconn's engine credits, not agent memory.
func (h *vconnHandle) pump() {
	defer h.s.wg.Done()
	s := h.s
	for {
		for {
			h.gmu.Lock()
			w := h.window
			h.gmu.Unlock()
			if w > 0 {
				break
			}
			select {
			case <-h.granted:
			case <-h.ctx.Done():
				return
			}
		}
		m, err := h.vc.Recv(h.ctx)
		if h.ctx.Err() != nil {
			if err == nil {
				m.Release()
			}
			return
		}
		switch {
		case errors.Is(err, io.EOF):
			_ = s.write(&frame.Frame{Op: frame.OpEOF, Handle: h.id})
			return
		case err != nil:
			_ = s.replyErr(0, h.id, err)
			return
		}
		f := frame.Frame{Op: frame.OpData, Handle: h.id, Payload: m.Data}
		if m.HasImm {
			f.Flags, f.Arg = frame.FlagImm, m.Imm
		}
		if len(m.Data) > frame.MaxPayload {
			_ = s.reply(0, h.id, frame.CodeTooLarge, fmt.Sprintf("received a message of %d bytes: the socket carries at most %d", len(m.Data), frame.MaxPayload))
			m.Release()
			h.vc.Abort()
			return
		}
		werr := s.write(&f)
		m.Release()
		if werr != nil {
			return
		}
		h.gmu.Lock()
		h.window--
		h.gmu.Unlock()
	}
}
