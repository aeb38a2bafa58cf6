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
	slot   acceptSlot      // its place in the quota (accept.go)
	ctx    context.Context
	cancel context.CancelFunc
	ops    chan op // at most SendWindow queued

	gmu     sync.Mutex
	window  int           // granted, not yet pushed; guarded by gmu
	granted chan struct{} // signalled when window grows

	regions map[uint32]*engine.Region // worker-owned
	stage   *engine.Staging           // the vconn's staging memory (Stage); worker-owned

	qmu         sync.Mutex
	outstanding int   // ops accepted and not yet answered, at most SendWindow; guarded by qmu
	running     int   // ops enqueued whose answer is not yet written; guarded by qmu
	txQueued    int64 // payload bytes of ops claimed against the allocation (claimTx); guarded by qmu
	workDone    bool  // the worker returned and gave txQueued back; guarded by qmu
	// txRefused: an op met limits.queuedBytes; every later op with a
	// payload is refused too (guarded by qmu). The client pipelines its
	// sends and takes the first error as the end of the vconn's send
	// side: refusing only the one would leave a hole in the stream, the
	// sends after it, made before the client learned, carried on.
	txRefused error
}

type op struct {
	f       frame.Frame // Payload owned by the op
	claimed int64       // bytes of the allocation's limits.queuedBytes the op holds
}

// errWindow: an op past the vconn's SendWindow (frame.CodeWindow).
var errWindow = fmt.Errorf("more than %d operations outstanding", SendWindow)

// enqueue accepts an op for the worker: its payload counted against the
// allocation (claimTx) and its place in the window held until doneOp. An
// op past the window fails with errWindow, one past limits.queuedBytes
// with errLimit; once the worker returned, with why the vconn ended.
func (h *vconnHandle) enqueue(o op) error {
	n := int64(len(o.f.Payload))
	h.qmu.Lock()
	defer h.qmu.Unlock()
	switch {
	case h.workDone:
		return h.ended()
	case h.outstanding >= SendWindow:
		return errWindow
	case n > 0 && h.txRefused != nil:
		return h.txRefused
	}
	if n > 0 {
		if err := h.s.al.claimTx(o.f.Op, n); err != nil {
			h.txRefused = err
			return err
		}
		h.txQueued += n
		o.claimed = n
	}
	h.outstanding++
	h.running++
	h.ops <- o // never blocks: the channel holds SendWindow
	return nil
}

// answered: the worker wrote the answer of an op it ran.
func (h *vconnHandle) answered() {
	h.qmu.Lock()
	h.running--
	h.qmu.Unlock()
}

// sendNow runs a Send on the session's reader when nothing of the vconn
// is queued or running, so that order holds, and the engine takes it at
// once: no hand-off to the worker, no copy of the payload, which goes
// from the read buffer into the engine's registered one. It reports
// false, having done nothing, to leave the send to the worker (which
// answers an error, or waits for room). An allocation with rates sends
// through the worker only: forward's wait for tokens must not hold the
// reader, which serves the session's other vconns.
func (h *vconnHandle) sendNow(f frame.Frame) bool {
	if h.s.al.rate != nil {
		return false
	}
	h.qmu.Lock()
	idle := h.running == 0 && !h.workDone && h.txRefused == nil
	h.qmu.Unlock()
	if !idle || uint32(len(f.Payload)) > h.info.MaxMessage {
		return false
	}
	var sent bool
	var err error
	if f.Flags&frame.FlagImm != 0 {
		sent, err = h.vc.TrySendImm(f.Payload, f.Arg)
	} else {
		sent, err = h.vc.TrySend(f.Payload)
	}
	if err != nil || !sent {
		return false
	}
	h.s.al.stats.sent(len(f.Payload), nil) // the send loop's count, for its short cut
	_ = h.s.ok(f.Req, h.id)
	return true
}

// doneOp gives back an op's place in the window and its claim.
func (h *vconnHandle) doneOp(o op) {
	h.qmu.Lock()
	defer h.qmu.Unlock()
	if h.workDone {
		return // given back with the rest
	}
	h.outstanding--
	h.txQueued -= o.claimed
	h.s.al.releaseTx(o.claimed)
}

// refuseQueued runs as the worker returns: it gives back the claims of the
// ops it will not run and answers each with why the vconn ended, so that
// no request goes unanswered.
func (h *vconnHandle) refuseQueued() {
	h.qmu.Lock()
	h.workDone = true
	h.s.al.releaseTx(h.txQueued)
	h.txQueued, h.outstanding, h.running = 0, 0, 0
	var left []op
	for len(h.ops) > 0 {
		left = append(left, <-h.ops)
	}
	err := h.ended()
	h.qmu.Unlock()
	for _, o := range left {
		_ = h.s.replyErr(o.f.Req, h.id, err)
	}
}

// ended is why the vconn's operations stop: its failure, or its close.
func (h *vconnHandle) ended() error {
	if err := h.vc.Err(); err != nil {
		return err
	}
	return fmt.Errorf("vconn %d: %w", h.id, engine.ErrClosed)
}

// add registers a vconn and starts its worker and pump; nil if the
// session closed.
func (s *session) add(vc *engine.VConn) *vconnHandle { return s.addFor(vc, acceptSlot{}) }

// addFor is add for a vconn that holds slot: a listener's (takeAccept),
// or the zero slot of one dialled.
func (s *session) addFor(vc *engine.VConn, slot acceptSlot) *vconnHandle {
	ctx, cancel := context.WithCancel(s.ctx)
	h := &vconnHandle{s: s, vc: vc, info: vconnInfo(vc), slot: slot, ctx: ctx, cancel: cancel, ops: make(chan op, SendWindow), granted: make(chan struct{}, 1)}
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
	s.al.giveFor(h.slot)
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

// pump is the vconn's delivery goroutine on the socket (deliver); on
// shared memory it waits idle for the window a shared-memory vconn never
// gets.
func (h *vconnHandle) pump() {
	defer h.s.wg.Done()
	h.deliver(socketRX{h})
}

// socketRX is the socket's carrier: Data frames, one per message, while
// the pod has window (grant).
type socketRX struct{ h *vconnHandle }

func (c socketRX) ready() bool {
	h := c.h
	for {
		h.gmu.Lock()
		w := h.window
		h.gmu.Unlock()
		if w > 0 {
			return true
		}
		select {
		case <-h.granted:
		case <-h.ctx.Done():
			return false
		}
	}
}

func (c socketRX) put(m engine.Message) bool {
	h := c.h
	f := frame.Frame{Op: frame.OpData, Handle: h.id, Payload: m.Data}
	if m.HasImm {
		f.Flags, f.Arg = frame.FlagImm, m.Imm
	}
	if h.s.write(&f) != nil {
		return false
	}
	h.gmu.Lock()
	h.window--
	h.gmu.Unlock()
	return true
}

func (c socketRX) end(err error) {
	if errors.Is(err, io.EOF) {
		_ = c.h.s.write(&frame.Frame{Op: frame.OpEOF, Handle: c.h.id})
		return
	}
	_ = c.h.s.replyErr(0, c.h.id, err)
}

func (socketRX) limit() (int, string) { return frame.MaxPayload, "the socket" }
