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
// serveRX writes what the engine delivers into the RX ring. The TX ring's
// slab is registered for the vconn's sends (engine.VConn.StageSends), so
// the engine sends each message from where the pod wrote it, and the pod
// gets the message's room back once no work request will read it again
// (lent): the pod's copy into the ring is the only one on the way out.
// serveRX copies once, from the engine's receive buffer into the slab.
type shmVConn struct {
	h   *vconnHandle
	seg *shm.Segment
	tx  *shm.Consumer // forwardTX's (Peek, Hold); Release under lent.mu
	rx  *shm.Producer // serveRX's
	wg  sync.WaitGroup
	// stop ends forwardTX's and serveRX's waits on the rings with the
	// vconn; made once, so that a wait allocates nothing.
	stop shm.Stop

	// stage is the TX slab registered for sends in place; nil where the
	// node's registered memory refused it: forward copies then.
	stage *engine.Staging
	lent  lent
	send  func() (int, error) // sendHeld, made once
	// lendMin is the smallest message sent in place: shorter ones, which
	// two can share a chunk, are copied into a send buffer, where Auto
	// bundles them. Sent in place, 4 KiB messages streamed at 0.50-0.66x
	// (paired E6 runs, shm, shm-proc): each went alone, and held its ring
	// room until acknowledged.
	lendMin int
	// maps counts who still needs the mapping: reap, once forwardTX and
	// serveRX returned, and the staging, until it is released (engine
	// reads of the slab end); the last unmaps.
	maps atomic.Int32

	failOnce sync.Once
	reason   atomic.Pointer[error] // why fail ended the vconn
}

// lent tracks the TX descriptors held while the engine sends from them:
// each is released, oldest first as the ring requires, once every chunk
// the engine queued of it came back (a later one may come back first: a
// datagram acknowledged before an earlier RC send completes).
type lent struct {
	mu   sync.Mutex
	out  []int32 // per descriptor index (masked): chunks not back; guarded by mu
	head uint32  // the oldest held descriptor; guarded by mu
	held uint32  // the next descriptor to hold; guarded by mu
	cur  heldTX  // the one forwardTX sends now: its goroutine's alone
}

// heldTX is a TX descriptor the engine sends in place.
type heldTX struct {
	data          []byte // a message copied rather than sent in place (lendMin)
	at, n, chunks int
	imm           uint32
	hasImm        bool
	index         uint32
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
	x.stageTX(l) // reap will close what it registers
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

// stageTX registers the TX ring's slab for the vconn's sends in place,
// counted against the node's registered memory as staging is
// (limits.registeredBytes, shared fairly), not against the pod's
// limits.regionBytes: it is the agent's ring, not a region the pod asked
// for. Refused, the vconn copies its messages as before.
func (x *shmVConn) stageTX(l shm.Layout) {
	al := x.h.s.al
	size := int64(len(x.tx.Slab()))
	x.maps.Store(1) // reap's
	if err := al.a.registered.claim(al, "shm", size, al.a.cfg.Limits.RegisteredBytes); err != nil {
		x.h.s.log.V(1).Info("Shared-memory TX ring copied, not sent in place", "vconn", x.h.id, "reason", err.Error())
		return
	}
	x.maps.Add(1) // the staging's, given up by released, which runs however StageSends ends
	st, err := x.h.vc.StageSends(x.tx.Slab(), x.returned, func() {
		al.a.registered.release(al, size)
		x.unmap()
	})
	if err != nil {
		x.h.s.log.V(1).Info("Shared-memory TX ring copied, not sent in place", "vconn", x.h.id, "reason", err.Error())
		return
	}
	x.stage, x.lent.out = st, make([]int32, l.Entries)
	x.lendMin = x.h.vc.FillSize() / 2
	x.send = x.sendHeld
}

// unmap drops a need of the mapping; the last unmaps it.
func (x *shmVConn) unmap() {
	if x.maps.Add(-1) == 0 {
		_ = x.seg.Close()
	}
}

// reap unmaps the segment once the vconn is gone, both servers returned
// and, where the engine sends from the TX slab, it deregistered the slab
// (every message it held came back).
func (x *shmVConn) reap() {
	s := x.h.s
	defer s.wg.Done()
	<-x.h.ctx.Done()
	x.seg.Shutdown() // ends forwardTX's and serveRX's doorbell waits
	x.wg.Wait()
	if x.stage != nil {
		_ = x.stage.Close() // deregistered once what it holds comes back
	}
	x.unmap()
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
	x := t.x
	d, b, err := x.tx.Next(x.stop)
	if err == nil {
		err = checkTX(d)
	}
	if err != nil {
		return outgoing{}, err
	}
	hasImm := d.Flags&shm.FlagImm != 0
	if x.stage == nil {
		return outgoing{data: b, imm: d.Imm, hasImm: hasImm}, nil
	}
	c := heldTX{at: int(d.Off), n: int(d.Len), chunks: x.h.vc.Chunks(int(d.Len)), imm: d.Imm, hasImm: hasImm}
	if c.n < x.lendMin {
		c.data, c.chunks = b, 1 // copied, then back at once
	}
	x.lent.mu.Lock()
	c.index = x.tx.Hold()
	x.lent.out[c.index&uint32(len(x.lent.out)-1)] = int32(c.chunks)
	x.lent.held = c.index + 1
	x.lent.mu.Unlock()
	x.lent.cur = c
	return outgoing{send: x.send}, nil
}

// sent releases a copied message; a held one comes back from the engine
// (returned). A send the engine refused ends the ring, which the pod
// learns from the socket (fail).
func (t shmTX) sent(err error) bool {
	if err != nil {
		t.x.fail(err, false)
		return false
	}
	if t.x.stage == nil {
		t.x.tx.Release()
	}
	return true
}

// sendHeld hands the engine the held descriptor: copied, it comes back
// once queued; sent in place, chunk by chunk as the engine gives them
// back. A send the engine refused gives nothing back: the ring is read no
// more, and its refused message stays the pod's (protocol R5.9).
func (x *shmVConn) sendHeld() (int, error) {
	c := &x.lent.cur
	if c.data != nil {
		var err error
		if c.hasImm {
			err = x.h.vc.SendImm(x.h.ctx, c.data, c.imm)
		} else {
			err = x.h.vc.Send(x.h.ctx, c.data)
		}
		if err != nil {
			return 0, err
		}
		x.back(c.index, 1)
		return c.n, nil
	}
	if _, err := x.h.vc.SendStaged(x.h.ctx, x.stage, c.at, c.n, c.imm, c.hasImm, c.index); err != nil {
		return 0, err
	}
	return c.n, nil
}

// returned is the engine's word that a chunk of a held descriptor will
// not be read again (engine.VConn.StageSends); on a poller.
func (x *shmVConn) returned(index uint32) { x.back(index, 1) }

// back counts k chunks of descriptor index back, and releases to the pod
// every held descriptor, oldest first, that has all of its back.
func (x *shmVConn) back(index uint32, k int) {
	l := &x.lent
	mask := uint32(len(l.out) - 1)
	l.mu.Lock()
	l.out[index&mask] -= int32(k)
	for l.head != l.held && l.out[l.head&mask] == 0 {
		x.tx.Release()
		l.head++
	}
	l.mu.Unlock()
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
