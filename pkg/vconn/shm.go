package vconn

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"sync"
	"time"

	"github.com/rdmavisor/rdmavisor/internal/frame"
	"github.com/rdmavisor/rdmavisor/internal/shm"
)

// shmConn is a vconn's shared-memory data path (frame.OpShm): SendMsg
// copies into the TX ring, RecvMsg copies out of the RX ring. A caller
// that waits sleeps on the agent's doorbell in slices of at most
// shmWaitSlice, to notice contexts, deadlines, Close and failures the
// socket reports.
type shmConn struct {
	seg       *shm.Segment
	closeOnce sync.Once // close: by Close, or when the session breaks

	tmu    sync.Mutex // serialises senders: the ring has one producer
	tx     *shm.Producer
	rmu    sync.Mutex // serialises receivers: the ring has one consumer
	rx     *shm.Consumer
	wmu    sync.RWMutex // held shared by receivers asleep on RX's doorbell
	closed bool         // set holding tmu, rmu and wmu, before the unmap
}

// start moves the vconn to shared memory if the client asked and the
// agent agrees; otherwise it opens the socket's receive window.
func (c *Conn) start(ctx context.Context) {
	if c.s.wantShm && c.openShm(ctx) == nil {
		return
	}
	c.grantInitial()
}

// openShm asks the agent for the vconn's segment and maps it.
func (c *Conn) openShm(ctx context.Context) error {
	rep, fds, err := c.s.callRights(ctx, &frame.Frame{Op: frame.OpShm, Handle: c.h})
	if err != nil {
		return err
	}
	if len(fds) == 0 {
		return fmt.Errorf("vconn: shm: the agent's reply carried no descriptors")
	}
	l, err := shm.DecodeLayout(rep.Payload)
	if err != nil {
		shm.CloseFDs(fds)
		return err
	}
	seg, err := shm.Open(l, fds)
	if err != nil {
		return err
	}
	x := &shmConn{seg: seg}
	x.tx, x.rx = seg.Pod()
	// Under the session's lock, which shutdown holds to find the
	// segments it unmaps.
	c.s.mu.Lock()
	err = c.s.err
	if err == nil {
		c.shm = x
	}
	c.s.mu.Unlock()
	if err != nil {
		x.close()
		return err
	}
	return nil
}

// shmWaitSlice bounds one sleep on a doorbell: what else ends a wait
// (a context, a deadline, Close, an Error pushed on the socket) is seen
// within it.
const shmWaitSlice = 5 * time.Millisecond

// slice is how long the next sleep may be.
func slice(ctx context.Context, dc chan struct{}) time.Duration {
	d := shmWaitSlice
	if t, ok := ctx.Deadline(); ok {
		d = min(d, max(0, time.Until(t)))
	}
	if dc != nil && closedChan(dc) {
		d = 0
	}
	return d
}

// callRights is call for a reply that may carry descriptors; the caller
// owns them.
func (s *session) callRights(ctx context.Context, f *frame.Frame) (frame.Frame, []int, error) {
	type result struct {
		f   frame.Frame
		fds []int
		err error
	}
	ch := make(chan result, 1)
	err := s.async(f, func(r frame.Frame, err error) {
		var fds []int
		if err == nil { // on the reader goroutine, which owns rights
			fds, s.rights = s.rights, nil
		}
		ch <- result{r, fds, err}
	})
	if err != nil {
		return frame.Frame{}, nil, err
	}
	req := f.Req
	select {
	case r := <-ch:
		return r.f, r.fds, r.err
	case <-ctx.Done():
		s.mu.Lock()
		delete(s.pending, req)
		s.mu.Unlock()
		select {
		case r := <-ch: // the reply raced the cancellation
			shm.CloseFDs(r.fds)
		default:
		}
		return frame.Frame{}, nil, ctx.Err()
	}
}

// take is the receiver's take on the RX ring, where EOF and failures
// the agent meets come in order after the messages; one the socket
// reports (the session broke) is c's.
func (x *shmConn) take(c *Conn, to sink) (Message, int, bool, error) {
	if m, n, ok, err := x.recv(c, to); ok || err != nil {
		return m, n, ok, err
	}
	c.mu.Lock()
	err := c.ended()
	c.mu.Unlock()
	return Message{}, 0, err != nil, err
}

func (x *shmConn) spins() bool { return true }

// wait sleeps on RX's doorbell, a slice at a time.
func (x *shmConn) wait(ctx context.Context, c *Conn, dc chan struct{}) error {
	if closedChan(dc) {
		return os.ErrDeadlineExceeded
	}
	if err := x.sleepRX(slice(ctx, dc)); err != nil {
		// Shut down (Close) or the agent dropped the segment: wait for
		// the reason on the socket's side.
		return socketRX{}.wait(ctx, c, dc)
	}
	return nil
}

// sleepRX announces the receiver sleeps and sleeps on RX's doorbell, for
// at most d: nil when woken, rung or not.
func (x *shmConn) sleepRX(d time.Duration) error {
	x.rmu.Lock()
	if x.closed {
		x.rmu.Unlock()
		return net.ErrClosed
	}
	ready := x.rx.Arm()
	x.rmu.Unlock()
	if ready {
		return nil
	}
	x.wmu.RLock()
	defer x.wmu.RUnlock()
	if x.closed {
		return net.ErrClosed
	}
	_, err := x.rx.Wait(d)
	return err
}

// recv takes the next descriptor, if any: a message, EOF or the vconn's
// failure. A message is copied out, so the slab room goes back to the
// agent at once (into to.into, Read's buffer, and its rest into c.cur,
// where to.into is set), or handed to to.fn in place, its room given back
// when fn returns.
func (x *shmConn) recv(c *Conn, to sink) (Message, int, bool, error) {
	x.rmu.Lock()
	defer x.rmu.Unlock()
	if x.closed {
		return Message{}, 0, false, net.ErrClosed
	}
	d, p, ok, err := x.rx.Peek()
	if err != nil {
		return Message{}, 0, false, &Error{Code: CodeAgentGone, Message: err.Error()}
	}
	if !ok {
		return Message{}, 0, false, nil
	}
	defer x.rx.Release()
	switch {
	case d.Flags&shm.FlagEOF != 0:
		c.mu.Lock()
		c.eof = true
		c.mu.Unlock()
		return Message{}, 0, true, io.EOF
	case d.Flags&shm.FlagError != 0:
		err := &Error{Code: Code(d.Imm), Message: string(p)}
		c.mu.Lock()
		if c.err == nil {
			c.err = err
		}
		c.mu.Unlock()
		return Message{}, 0, true, err
	}
	m := Message{Imm: d.Imm, HasImm: d.Flags&shm.FlagImm != 0}
	if to.fn != nil {
		m.Data = p[:len(p):len(p)]
		return Message{}, putToFn, true, to.fn(m)
	}
	if into := to.into; into != nil && len(p) > 0 {
		n := copy(into, p)
		c.spare = append(c.spare[:0], p[n:]...)
		c.cur = c.spare
		return Message{}, n, true, nil
	}
	m.Data = append([]byte(nil), p...)
	return m, 0, true, nil
}

// shmSend is send on shared memory: it returns once the message is in the
// ring; a failure the agent meets later is the vconn's (Err, and the next
// call's error).
func (c *Conn) shmSend(ctx context.Context, dl *deadline, data []byte, imm uint32, hasImm bool) error {
	x := c.shm
	var flags uint32
	if hasImm {
		flags = shm.FlagImm
	}
	x.tmu.Lock()
	defer x.tmu.Unlock()
	if x.closed {
		return net.ErrClosed
	}
	var dc chan struct{}
	if dl != nil {
		dc = dl.wait()
	}
	// The slice bounds each sleep for a vconn that failed on the agent:
	// it stops draining the ring and rings no bell.
	stop := func() (time.Duration, error) {
		switch {
		case c.isClosed():
			return 0, net.ErrClosed
		case !c.s.alive():
			return 0, c.s.failure()
		case ctx.Err() != nil:
			return 0, ctx.Err()
		case dc != nil && closedChan(dc):
			return 0, os.ErrDeadlineExceeded
		}
		return slice(ctx, dc), c.Err()
	}
	for {
		err := x.tx.PushWait(data, imm, flags, stop)
		switch {
		case errors.Is(err, shm.ErrShut):
			time.Sleep(shmWaitSlice) // shut down: stop ends it
		case errors.Is(err, shm.ErrTooLarge):
			return &Error{Code: CodeTooLarge, Message: err.Error()}
		case errors.Is(err, shm.ErrCorrupt):
			return &Error{Code: CodeAgentGone, Message: err.Error()}
		default:
			return err
		}
	}
}

// drain waits until the agent took every message of the TX ring.
func (x *shmConn) drain(c *Conn, timeout time.Duration) {
	end := time.Now().Add(timeout)
	for time.Now().Before(end) && c.s.alive() && c.Err() == nil {
		x.tmu.Lock()
		empty := x.closed || x.tx.Empty()
		x.tmu.Unlock()
		if empty {
			return
		}
		time.Sleep(50 * time.Microsecond)
	}
}

// close unmaps the segment and closes its doorbells once no sender or
// receiver is inside the rings or asleep on a doorbell (the shutdown
// wakes the sleepers).
func (x *shmConn) close() { x.closeOnce.Do(x.unmap) }

func (x *shmConn) unmap() {
	x.seg.Shutdown()
	x.tmu.Lock()
	x.rmu.Lock()
	x.wmu.Lock()
	x.closed = true
	x.wmu.Unlock()
	x.rmu.Unlock()
	x.tmu.Unlock()
	_ = x.seg.Close()
}
