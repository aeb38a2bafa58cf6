package agent

import (
	"context"
	"errors"
	"fmt"
	"io"
	"runtime"
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
// the session's shmPoller feeds the pod's TX ring to the engine, serveRX
// writes what the engine delivers into the RX ring. Each copies once: from
// the ring's slab into the engine's registered send buffer, and from the
// engine's receive buffer into the slab.
type shmVConn struct {
	h    *vconnHandle
	seg  *shm.Segment
	tx   *shm.Consumer // the poller's, or drainBlocking's while busy
	busy atomic.Bool   // drainBlocking has the TX ring
	dead bool          // the vconn failed, its ring is not read; owned as tx
	rx   *shm.Producer // serveRX's
	wg   sync.WaitGroup

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
	p := s.shmPoll
	if p == nil {
		if p, err = newShmPoller(s); err != nil {
			delete(s.shm, h.id)
			s.mu.Unlock()
			_ = seg.Close()
			return s.replyErr(f.Req, h.id, err) == nil
		}
		s.shmPoll = p
		s.wg.Add(1)
		go p.run()
	}
	x.wg.Add(1)
	s.wg.Add(1)
	s.mu.Unlock()
	err = s.writeRights(&frame.Frame{Op: frame.OpOK, Req: f.Req, Handle: h.id, Payload: shm.AppendLayout(nil, l)}, seg.Files())
	seg.ClosePeer()
	p.add(x)
	go x.serveRX()
	go x.reap()
	return err == nil
}

func (s *session) shmPoller() *shmPoller {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.shmPoll
}

func (s *session) shmOf(id uint32) *shmVConn {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.shm[id]
}

// writeRights writes a frame with descriptors attached (SCM_RIGHTS).
func (s *session) writeRights(f *frame.Frame, fds []int) error {
	s.wmu.Lock()
	defer s.wmu.Unlock()
	var err error
	if s.wbuf, err = frame.Append(s.wbuf[:0], f); err != nil {
		return err
	}
	_, _, err = s.conn.WriteMsgUnix(s.wbuf, shm.Rights(fds), nil)
	return err
}

// reap unmaps the segment once the vconn is gone and both servers
// returned.
func (x *shmVConn) reap() {
	s := x.h.s
	defer s.wg.Done()
	<-x.h.ctx.Done()
	s.shmPoller().remove(x) // the poller lets go of the TX ring
	x.seg.Shutdown()        // ends serveRX's doorbell wait
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

// drainTX hands the TX ring's messages to the engine, at most a batch, so
// the session's other vconns get their turn. When the engine's queue for
// the vconn is full, a goroutine of the vconn's own takes over the ring
// (drainBlocking) until it is empty: it sleeps in the engine until room
// comes back, while the poller serves the others.
func (x *shmVConn) drainTX(p *shmPoller) (n int) {
	if x.busy.Load() || x.dead {
		return 0
	}
	h := x.h
	for n < shmBatch {
		d, b, ok, err := x.tx.Peek()
		if err == nil && ok {
			err = checkTX(d)
		}
		if err != nil {
			x.dead = true
			x.fail(err, false)
			return n
		}
		if !ok {
			return n
		}
		var sent bool
		if d.Flags&shm.FlagImm != 0 {
			sent, err = h.vc.TrySendImm(b, d.Imm)
		} else {
			sent, err = h.vc.TrySend(b)
		}
		if err != nil {
			x.dead = true
			x.fail(err, false)
			return n
		}
		if !sent {
			x.busy.Store(true)
			x.wg.Add(1) // before remove returns: reap waits for it
			go x.drainBlocking(p)
			return n
		}
		x.tx.Release()
		n++
	}
	return n
}

func checkTX(d shm.Desc) error {
	if d.Flags&(shm.FlagEOF|shm.FlagError) != 0 {
		return fmt.Errorf("%w: the pod sent flags %#x", shm.ErrCorrupt, d.Flags)
	}
	return nil
}

// drainBlocking sends the TX ring's messages, blocking in the engine,
// until the ring is empty, then gives the ring back to the poller.
func (x *shmVConn) drainBlocking(p *shmPoller) {
	defer x.wg.Done()
	h := x.h
	for !x.dead {
		d, b, ok, err := x.tx.Peek()
		if err == nil && ok {
			err = checkTX(d)
		}
		if err == nil && ok {
			if d.Flags&shm.FlagImm != 0 {
				err = h.vc.SendImm(h.ctx, b, d.Imm)
			} else {
				err = h.vc.Send(h.ctx, b)
			}
		}
		if err != nil {
			x.dead = true
			x.fail(err, false)
			break
		}
		if !ok {
			break
		}
		x.tx.Release()
	}
	x.busy.Store(false) // publishes dead and the ring's state to the poller
	p.kick.Ring()       // which may sleep with this ring unarmed
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
	start, spin := time.Now(), time.Duration(0)
	for {
		ok, err := x.rx.Push(b, imm, flags)
		if err != nil {
			x.fail(err, true)
			return false
		}
		if ok {
			return true
		}
		if x.h.ctx.Err() != nil {
			return false
		}
		if spin == 0 {
			spin = max(shm.SpinFor(), 1) // 1: looked up, no spinning
		}
		if time.Since(start) < spin {
			runtime.Gosched()
			continue
		}
		x.rx.Arm()
		if ok, err := x.rx.Push(b, imm, flags); ok || err != nil {
			if err != nil {
				x.fail(err, true)
			}
			return ok
		}
		if _, err := x.rx.Wait(-1); err != nil {
			return false
		}
	}
}

// shmPoller is a session's one goroutine for the TX rings of all its
// shared-memory vconns: it polls them, yielding the processor between
// rounds, for shm.SpinFor after the last message, then sleeps (parked in the
// network poller: see shm.Bell) on their doorbells (and its own, kicked,
// for changes to the set) until a pod rings, which a pod does only once
// the poller said it sleeps.
type shmPoller struct {
	s            *session
	kick, kicked *shm.Bell // kick rings kicked, which the poller sleeps on

	gen  atomic.Uint64 // bumped by each change to vcs
	mu   sync.Mutex
	cond sync.Cond   // signals seen's changes; on mu
	vcs  []*shmVConn // guarded by mu
	seen uint64      // the generation the poller serves; guarded by mu
	done bool        // the poller returned; guarded by mu
}

func newShmPoller(s *session) (*shmPoller, error) {
	a, b, err := shm.NewBellPair()
	if err != nil {
		return nil, fmt.Errorf("shm poller: %w", err)
	}
	p := &shmPoller{s: s, kick: a, kicked: b}
	p.cond.L = &p.mu
	return p, nil
}

func (p *shmPoller) add(x *shmVConn) {
	p.mu.Lock()
	p.vcs = append(p.vcs, x)
	p.gen.Add(1)
	p.mu.Unlock()
	p.kick.Ring()
}

// remove takes x from the poller and waits until the poller no longer
// touches its rings.
func (p *shmPoller) remove(x *shmVConn) {
	p.mu.Lock()
	defer p.mu.Unlock()
	for i, y := range p.vcs {
		if y == x {
			p.vcs = append(p.vcs[:i], p.vcs[i+1:]...)
			break
		}
	}
	g := p.gen.Add(1)
	p.kick.Ring()
	for p.seen < g && !p.done {
		p.cond.Wait()
	}
}

func (p *shmPoller) run() {
	s := p.s
	defer s.wg.Done()
	stop := context.AfterFunc(s.ctx, p.kick.Ring)
	defer func() {
		stop()
		p.mu.Lock()
		p.done = true
		p.cond.Broadcast()
		p.mu.Unlock()
		_ = p.kick.Close()
		_ = p.kicked.Close()
	}()
	var (
		vcs   []*shmVConn
		bells shm.BellSet
		seen  = ^uint64(0) // none yet: the first round builds the set, kicked in it
		idle  time.Time    // when the last round with work ended
		spin  time.Duration
	)
	defer bells.Reset() // closes its epoll instance
	for s.ctx.Err() == nil {
		if p.gen.Load() != seen {
			p.mu.Lock()
			vcs = append(vcs[:0], p.vcs...)
			seen = p.gen.Load()
			p.seen = seen
			p.cond.Broadcast()
			p.mu.Unlock()
			bells.Reset()
			bells.Add(p.kicked)
			for _, x := range vcs {
				bells.Add(x.tx.Bell())
			}
		}
		work := 0
		for _, x := range vcs {
			work += x.drainTX(p)
		}
		if work > 0 {
			idle = time.Time{}
			continue
		}
		if idle.IsZero() {
			idle, spin = time.Now(), shm.SpinFor()
		}
		if time.Since(idle) < spin {
			runtime.Gosched()
			continue
		}
		ready := false
		for _, x := range vcs {
			if !x.busy.Load() && !x.dead {
				ready = x.tx.Arm() || ready
			}
		}
		if ready || p.gen.Load() != seen {
			continue
		}
		if err := bells.Wait(-1); err != nil {
			s.log.Error(err, "Shared-memory poller cannot sleep: polling")
			time.Sleep(time.Millisecond)
		}
		idle = time.Time{}
	}
}
