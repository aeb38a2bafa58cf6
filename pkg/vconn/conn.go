package vconn

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"github.com/rdmavisor/rdmavisor/internal/frame"
)

// recvWindow is how many messages of one vconn the agent may push ahead of
// the application's reads.
const recvWindow = 32

// Message is one received message.
type Message struct {
	Data   []byte
	Imm    uint32
	HasImm bool
}

// Conn is a vconn: a net.Conn whose Read and Write are a byte stream over
// messages, plus SendMsg and RecvMsg, which keep message boundaries, and
// one-sided access to regions the peer exported. Methods are safe for
// concurrent use; concurrent writers interleave whole messages.
type Conn struct {
	s             *session
	h             uint32
	info          frame.VConnInfo // transport and largest message, from the agent
	local, remote Addr
	rd, wd        *deadline
	sem           chan struct{} // one token per operation the agent has not answered
	closing       chan struct{} // closed by Close
	closeOnce     sync.Once
	closeErr      error
	shm           *shmConn // the shared-memory path; nil on the socket; set before use

	rmu   sync.Mutex // serialises stream reads; guards cur and spare
	cur   []byte     // rest of the message a stream Read is in
	spare []byte     // where a shared-memory Read keeps a message's rest

	mu       sync.Mutex
	q        []Message     // received, unread; guarded by mu
	eof      bool          // the peer closed; guarded by mu
	err      error         // the vconn failed; guarded by mu
	sendErr  error         // an asynchronous send failed; guarded by mu
	consumed int           // read since the last grant; guarded by mu
	notify   chan struct{} // signalled on delivery
	// mapped are the regions mapped here (FlagMemfd), to unmap at the
	// vconn's Close or the session's end (unmapped, from then on).
	// Guarded by mu.
	mapped   map[*Region]struct{}
	unmapped bool

	stg      atomic.Pointer[stage] // the staging memory (stage.go); stored under mu, unless unmapped
	stgMu    sync.Mutex
	stgAsked chan struct{} // closed once the agent answered Stage; nil before it was asked; guarded by stgMu
}

var _ net.Conn = (*Conn)(nil)

func (c *Conn) grantInitial() {
	_ = c.s.write(&frame.Frame{Op: frame.OpGrant, Handle: c.h, Arg: recvWindow})
}

// deliver takes a pushed frame; on the session's reader goroutine.
func (c *Conn) deliver(f frame.Frame) {
	c.mu.Lock()
	switch f.Op {
	case frame.OpData:
		c.q = append(c.q, Message{Data: f.Payload, Imm: f.Arg, HasImm: f.Flags&frame.FlagImm != 0})
	case frame.OpEOF:
		c.eof = true
	case frame.OpError:
		if c.err == nil {
			c.err = errOf(&f)
		}
	}
	c.mu.Unlock()
	c.wake()
}

func (c *Conn) wake() {
	select {
	case c.notify <- struct{}{}:
	default:
	}
}

func (c *Conn) fail(err error) {
	c.mu.Lock()
	if c.err == nil {
		c.err = err
	}
	c.mu.Unlock()
	c.wake()
}

func (c *Conn) isClosed() bool {
	select {
	case <-c.closing:
		return true
	default:
		return false
	}
}

// socketRX is the socket's receiver: messages the reader queued on c.
type socketRX struct{}

func (socketRX) take(c *Conn, _ sink) (Message, int, bool, error) {
	c.mu.Lock()
	if len(c.q) == 0 {
		// Under the lock that queued the messages: EOF and Error come
		// after them.
		err := c.ended()
		c.mu.Unlock()
		return Message{}, 0, err != nil, err
	}
	m := c.q[0]
	c.q[0] = Message{}
	c.q = c.q[1:]
	c.consumed++
	grant := 0
	if c.consumed >= recvWindow/2 {
		grant, c.consumed = c.consumed, 0
	}
	c.mu.Unlock()
	if grant > 0 {
		_ = c.s.write(&frame.Frame{Op: frame.OpGrant, Handle: c.h, Arg: uint32(grant)})
	}
	return m, 0, true, nil
}

func (socketRX) spins() bool { return false }

func (socketRX) wait(ctx context.Context, c *Conn, dc chan struct{}) error {
	select {
	case <-c.notify:
	case <-c.closing:
	case <-ctx.Done():
		return ctx.Err()
	case <-dc:
		return os.ErrDeadlineExceeded
	}
	return nil
}

// ended is io.EOF once the peer closed, else why the vconn failed, or
// nil; c.mu held.
func (c *Conn) ended() error {
	if c.eof {
		return io.EOF
	}
	return c.err
}

// RecvMsg returns the next message whole: io.EOF once the peer closed.
func (c *Conn) RecvMsg(ctx context.Context) (Message, error) {
	m, _, err := c.next(ctx, c.rd, sink{})
	return m, err
}

// RecvMsgFunc calls fn with the next message, without copying it where
// the vconn can: on shared memory, m.Data is the receive ring's memory,
// valid only while fn runs (fn must not keep it, nor receive on c; Close
// waits for it), and its room goes back to the agent when fn returns; on
// the socket, m is what RecvMsg returns. It returns fn's error, or why no
// message came (io.EOF once the peer closed).
func (c *Conn) RecvMsgFunc(ctx context.Context, fn func(m Message) error) error {
	m, n, err := c.next(ctx, c.rd, sink{fn: fn})
	if err != nil || n == putToFn {
		return err
	}
	return fn(m)
}

// Read reads the vconn as a byte stream. On a vconn whose transport may
// lose messages (uc, ud) it fails with ErrNotStream: use RecvMsg.
func (c *Conn) Read(b []byte) (int, error) {
	if err := c.streamable(); err != nil {
		return 0, c.opErr("read", err)
	}
	c.rmu.Lock()
	defer c.rmu.Unlock()
	for len(c.cur) == 0 {
		if len(b) == 0 {
			return 0, nil
		}
		// On shared memory the message is copied once, from the ring
		// into b (next's into).
		m, n, err := c.next(context.Background(), c.rd, sink{into: b})
		if err != nil {
			return 0, c.opErr("read", err)
		}
		if n > 0 {
			return n, nil
		}
		c.cur = m.Data
	}
	n := copy(b, c.cur)
	c.cur = c.cur[n:]
	return n, nil
}

func (c *Conn) opErr(op string, err error) error {
	if errors.Is(err, io.EOF) {
		return io.EOF
	}
	return &net.OpError{Op: op, Net: "vconn", Source: c.local, Addr: c.remote, Err: err}
}

// acquire takes a window token: the agent answers at most the window of
// operations per vconn at once.
func (c *Conn) acquire(ctx context.Context, dl *deadline) error {
	var dc chan struct{}
	if dl != nil {
		dc = dl.wait()
	}
	select {
	case c.sem <- struct{}{}:
		return nil
	default:
	}
	select {
	case c.sem <- struct{}{}:
		return nil
	case <-c.closing:
		return net.ErrClosed
	case <-c.s.done:
		return c.s.failure()
	case <-ctx.Done():
		return ctx.Err()
	case <-dc:
		return os.ErrDeadlineExceeded
	}
}

func (c *Conn) release() { <-c.sem }

// send queues one message; a failure the agent reports later is returned
// by the next send.
func (c *Conn) send(ctx context.Context, dl *deadline, data []byte, imm uint32, hasImm bool) error {
	if max := c.MaxMessage(); len(data) > max {
		return &Error{Code: CodeTooLarge, Message: fmt.Sprintf("message of %d bytes, at most %d on this %s vconn", len(data), max, c.info.Transport)}
	}
	if c.isClosed() {
		return net.ErrClosed
	}
	c.mu.Lock()
	err := c.sendErr
	if err == nil {
		err = c.err
	}
	c.mu.Unlock()
	if err != nil {
		return err
	}
	if c.shm != nil {
		return c.shmSend(ctx, dl, data, imm, hasImm)
	}
	if err := c.acquire(ctx, dl); err != nil {
		return err
	}
	f := &frame.Frame{Op: frame.OpSend, Handle: c.h, Payload: data}
	if hasImm {
		f.Flags, f.Arg = frame.FlagImm, imm
	}
	err = c.s.async(f, func(_ frame.Frame, err error) {
		if err != nil {
			c.mu.Lock()
			if c.sendErr == nil {
				c.sendErr = err
			}
			c.mu.Unlock()
		}
		c.release()
	})
	if err != nil {
		c.release()
	}
	return err
}

// SendMsg sends data as one message, of at most MaxMessage bytes (larger
// ones fail with ErrTooLarge), on every transport. It
// returns once the message is handed to the agent; a failure the agent
// reports afterwards is returned by a later call.
func (c *Conn) SendMsg(ctx context.Context, data []byte) error {
	return c.send(ctx, c.wd, data, 0, false)
}

// SendMsgImm sends a message with an application immediate.
func (c *Conn) SendMsgImm(ctx context.Context, data []byte, imm uint32) error {
	return c.send(ctx, c.wd, data, imm, true)
}

// Write writes b as a byte stream, in messages of at most MaxMessage
// bytes. On a vconn whose transport may lose messages (uc, ud) it fails
// with ErrNotStream, writing nothing: use SendMsg.
func (c *Conn) Write(b []byte) (int, error) {
	if err := c.streamable(); err != nil {
		return 0, c.opErr("write", err)
	}
	max := c.MaxMessage()
	n := 0
	for n < len(b) || len(b) == 0 {
		k := min(len(b)-n, max)
		if err := c.send(context.Background(), c.wd, b[n:n+k], 0, false); err != nil {
			return n, c.opErr("write", err)
		}
		n += k
		if len(b) == 0 {
			break
		}
	}
	return n, nil
}

// op runs one request in the vconn's order and waits for its reply.
func (c *Conn) op(ctx context.Context, f *frame.Frame) (frame.Frame, error) {
	if c.isClosed() {
		return frame.Frame{}, net.ErrClosed
	}
	if err := c.acquire(ctx, nil); err != nil {
		return frame.Frame{}, err
	}
	f.Handle = c.h
	type result struct {
		f   frame.Frame
		err error
	}
	ch := make(chan result, 1)
	// The slot goes back with the agent's answer, not when ctx ends: the
	// agent counts the operation in the send window until it answers, and
	// a slot given back sooner let a later operation past the window
	// (CodeWindow). The session's end answers every operation.
	err := c.s.async(f, func(r frame.Frame, err error) {
		c.release()
		ch <- result{r, err}
	})
	if err != nil {
		c.release()
		return frame.Frame{}, err
	}
	select {
	case r := <-ch:
		return r.f, r.err
	case <-ctx.Done():
		return frame.Frame{}, ctx.Err()
	}
}

// drain waits until the agent answered every operation sent.
func (c *Conn) drain(timeout time.Duration) {
	if c.shm != nil {
		c.shm.drain(c, timeout)
	}
	t := time.NewTimer(timeout)
	defer t.Stop()
	for i := 0; i < cap(c.sem); i++ {
		select {
		case c.sem <- struct{}{}:
		case <-c.s.done:
			return
		case <-t.C:
			return
		}
	}
}

// Close closes the vconn after what was written has been handed over; the
// peer reads io.EOF after the last message. It frees the vconn's slot of
// the quota.
func (c *Conn) Close() error {
	c.closeOnce.Do(func() {
		c.drain(5 * time.Second)
		close(c.closing)
		c.wake()
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_, err := c.s.call(ctx, &frame.Frame{Op: frame.OpClose, Handle: c.h})
		c.s.mu.Lock()
		delete(c.s.conns, c.h)
		c.s.mu.Unlock()
		if c.shm != nil {
			c.shm.close()
		}
		c.unmapRegions(net.ErrClosed)
		if err != nil && !errors.Is(err, ErrAgentGone) && !errors.Is(err, &Error{Code: CodeNoHandle}) {
			c.closeErr = c.opErr("close", err)
		}
	})
	return c.closeErr
}

// Err returns why the vconn failed, or nil.
func (c *Conn) Err() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.err
}

// LocalAddr is this node and the listener's port, or this node.
func (c *Conn) LocalAddr() net.Addr { return c.local }

// RemoteAddr is the address dialled, or the dialling node.
func (c *Conn) RemoteAddr() net.Addr { return c.remote }

// SetDeadline sets the read and write deadlines.
func (c *Conn) SetDeadline(t time.Time) error {
	c.rd.set(t)
	c.wd.set(t)
	return nil
}

// SetReadDeadline bounds Read and RecvMsg.
func (c *Conn) SetReadDeadline(t time.Time) error { c.rd.set(t); return nil }

// SetWriteDeadline bounds Write and SendMsg (waiting for window).
func (c *Conn) SetWriteDeadline(t time.Time) error { c.wd.set(t); return nil }
