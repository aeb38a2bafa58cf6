package agent

import (
	"errors"
	"fmt"
	"io"
	"sync"
	"sync/atomic"
	"time"

	"github.com/rdmavisor/rdmavisor/internal/engine"
	"github.com/rdmavisor/rdmavisor/internal/frame"
	"github.com/rdmavisor/rdmavisor/internal/shm"
)

// shmBatch is how many messages of one vconn the poller sends before it
// looks at the next.
const shmBatch = 64

// shmVConn is a vconn whose messages travel in shared memory (frame.OpShm):
// its sending goroutine (forwardTX) feeds the pod's TX ring to the engine,
// serveRX writes what the engine delivers into the RX ring. Each copies
// once: from the ring's slab into the engine's registered send buffer,
// and from the engine's receive buffer into the slab.
type shmVConn struct {
	h   *vconnHandle
	seg *shm.Segment
	tx  *shm.Consumer // forwardTX's
	rx  *shm.Producer // serveRX's
	wg  sync.WaitGroup
	// stop ends forwardTX's and serveRX's waits on the rings with the
	// vconn; made once, so that a wait allocates nothing.
	stop shm.Stop

	failOnce sync.Once
	reason   atomic.Pointer[error] // why fail ended the vconn
}

// openShm answers OpShm on the reader goroutine, which also serves Grant:
// so a Grant cannot slip between the check that none came and the switch.
func (s *session) openShm(f frame.Frame) bool {
	h := s.lookup(f.Handle)
	if h == nil {
		return s.reply(f.Req, f.Handle, frame.CodeNoHandle, "shm: no such vconn") == nil
	}
	h.gmu.Lock()
	granted := h.window != 0
	h.gmu.Unlock()
	if granted || s.shmOf(h.id) != nil {
		// The pump may be reading the engine already: two readers would
		// split the vconn's messages between the paths.
		return s.reply(f.Req, h.id, frame.CodeBadRequest, "shm: the vconn already receives over the socket or shared memory") == nil
	}
	l := shm.DefaultLayout
	l.MaxMessage = min(l.MaxMessage, s.maxMessage())
	seg, err := shm.Create(fmt.Sprintf("rdmavisor-%s-%d", s.al.id, h.id), l)
	if err != nil {
		// Not fatal: the client stays on the socket.
		return s.replyErr(f.Req, h.id, fmt.Errorf("shm: %w", err)) == nil
	}
	x := &shmVConn{h: h, seg: seg}
	x.tx, x.rx = seg.Agent()
	x.stop = func() (time.Duration, error) { return -1, h.ctx.Err() }
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		_ = seg.Close()
		return false
	}
	if s.shm == nil {
		s.shm = make(map[uint32]*shmVConn)
	}
	s.shm[h.id] = x
	x.wg.Add(2)
	s.wg.Add(1)
	s.mu.Unlock()
	err = s.writeRights(&frame.Frame{Op: frame.OpOK, Req: f.Req, Handle: h.id, Payload: shm.AppendLayout(nil, l)}, seg.Files())
	seg.ClosePeer()
	go x.forwardTX()
	go x.serveRX()
	go x.reap()
	return err == nil
}

func (s *session) shmOf(id uint32) *shmVConn {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.shm[id]
}

// writeRights writes a frame with descriptors attached (SCM_RIGHTS).
func (s *session) writeRights(f *frame.Frame, fds []int) error {
	return s.w.WriteMsg(f, shm.Rights(fds))
}

// reap unmaps the segment once the vconn is gone and both servers
// returned.
func (x *shmVConn) reap() {
	s := x.h.s
	defer s.wg.Done()
	<-x.h.ctx.Done()
	x.seg.Shutdown() // ends forwardTX's and serveRX's doorbell waits
	x.wg.Wait()
	_ = x.seg.Close()
	s.mu.Lock()
	delete(s.shm, x.h.id)
	s.mu.Unlock()
}

// fail ends the vconn for a send that failed or a ring the pod broke.
// The pod learns why in the RX ring, after what was delivered before,
// where serveRX can still write (rxBroken false: it reports the reason
// when the abort ends its Recv); else from an Error push on the socket.
func (x *shmVConn) fail(err error, rxBroken bool) {
	h := x.h
	if h.ctx.Err() != nil {
		return
	}
	x.failOnce.Do(func() {
		x.reason.Store(&err)
		if !errors.Is(err, shm.ErrCorrupt) {
			// A send the engine refused (too large for the vconn's
			// transport, say) leaves the vconn open: only the socket
			// can tell.
			_ = h.s.replyErr(0, h.id, err)
			return
		}
		h.s.log.Info("Shared-memory ring corrupt: aborting the vconn", "vconn", h.id, "reason", err.Error())
		if rxBroken {
			_ = h.s.reply(0, h.id, frame.CodeBadRequest, err.Error())
		}
		h.vc.Abort()
	})
}

// forwardTX is the vconn's sending goroutine on shared memory: the TX
// ring is its source (forward).
func (x *shmVConn) forwardTX() {
	defer x.wg.Done()
	forward(x.h.ctx, x.h.vc, shmTX{x})
}

// shmTX is the TX ring as a source: the pod's messages in its order, each
// released to the pod once the engine copied it.
type shmTX struct{ x *shmVConn }

func (t shmTX) next() (outgoing, error) {
	d, b, err := t.x.tx.Next(t.x.stop)
	if err == nil {
		err = checkTX(d)
	}
	if err != nil {
		return outgoing{}, err
	}
	return outgoing{data: b, imm: d.Imm, hasImm: d.Flags&shm.FlagImm != 0}, nil
}

// sent releases the message; a send the engine refused ends the ring,
// which the pod learns from the socket (fail).
func (t shmTX) sent(err error) bool {
	if err != nil {
		t.x.fail(err, false)
		return false
	}
	t.x.tx.Release()
	return true
}

// end: a ring the pod broke aborts the vconn; else the vconn ended (its
// context, the doorbell shut), which needs no word.
func (t shmTX) end(err error) {
	if errors.Is(err, shm.ErrCorrupt) {
		t.x.fail(err, false)
	}
}

func checkTX(d shm.Desc) error {
	if d.Flags&(shm.FlagEOF|shm.FlagError) != 0 {
		return fmt.Errorf("%w: the pod sent flags %#x", shm.ErrCorrupt, d.Flags)
	}
	return nil
}

// serveRX is the vconn's delivery goroutine on shared memory (deliver),
// with the RX ring as its carrier.
func (x *shmVConn) serveRX() {
	defer x.wg.Done()
	x.h.deliver(x)
}

// ready: the RX ring has no window; push waits for room instead.
func (x *shmVConn) ready() bool { return true }

func (x *shmVConn) put(m engine.Message) bool {
	var flags uint32
	if m.HasImm {
		flags = shm.FlagImm
	}
	return x.push(m.Data, m.Imm, flags)
}

func (x *shmVConn) end(err error) {
	if errors.Is(err, io.EOF) {
		x.push(nil, 0, shm.FlagEOF)
		return
	}
	code := codeOf(err)
	if r := x.reason.Load(); r != nil && errors.Is(*r, shm.ErrCorrupt) {
		// The abort of a ring the pod broke ended the vconn: that is why.
		err, code = *r, frame.CodeBadRequest
	}
	x.pushErr(code, err.Error())
}

func (x *shmVConn) limit() (int, string) { return x.rx.MaxMessage(), "shared memory" }

func (x *shmVConn) pushErr(c frame.Code, msg string) {
	x.push([]byte(msg[:min(len(msg), x.rx.MaxMessage())]), uint32(c), shm.FlagError)
}

// push writes one descriptor into the RX ring, waiting for room (the pod
// reads slowly: that holds the engine's credits, as the socket's window
// does); on the delivery goroutine. False when the vconn is done or the
// ring broke.
func (x *shmVConn) push(b []byte, imm, flags uint32) bool {
	err := x.rx.PushWait(b, imm, flags, x.stop)
	if errors.Is(err, shm.ErrCorrupt) || errors.Is(err, shm.ErrTooLarge) {
		x.fail(err, true)
	}
	return err == nil
}
