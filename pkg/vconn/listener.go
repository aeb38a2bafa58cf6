package vconn

import (
	"context"
	"net"
	"sync"
	"time"

	"github.com/rdmavisor/rdmavisor/internal/frame"
)

// Listener accepts vconns dialled to its port.
type Listener struct {
	s    *session
	h    uint32
	addr Addr

	mu     sync.Mutex
	q      []*Conn // accepted, not yet taken; guarded by mu
	err    error   // guarded by mu
	closed bool    // guarded by mu
	notify chan struct{}
}

var _ net.Listener = (*Listener)(nil)

func (l *Listener) push(c *Conn) {
	l.mu.Lock()
	if l.closed {
		l.mu.Unlock()
		go c.Close()
		return
	}
	l.q = append(l.q, c)
	l.mu.Unlock()
	l.wake()
}

func (l *Listener) wake() {
	select {
	case l.notify <- struct{}{}:
	default:
	}
}

func (l *Listener) fail(err error) {
	l.mu.Lock()
	if l.err == nil {
		l.err = err
	}
	l.mu.Unlock()
	l.wake()
}

// AcceptVConn waits for the next vconn.
func (l *Listener) AcceptVConn() (*Conn, error) {
	for {
		l.mu.Lock()
		if l.closed {
			l.mu.Unlock()
			return nil, &net.OpError{Op: "accept", Net: "vconn", Addr: l.addr, Err: net.ErrClosed}
		}
		if len(l.q) > 0 {
			c := l.q[0]
			l.q = l.q[1:]
			l.mu.Unlock()
			return c, nil
		}
		err := l.err
		l.mu.Unlock()
		if err != nil {
			return nil, &net.OpError{Op: "accept", Net: "vconn", Addr: l.addr, Err: err}
		}
		<-l.notify
	}
}

// Accept waits for the next vconn.
func (l *Listener) Accept() (net.Conn, error) {
	c, err := l.AcceptVConn()
	if err != nil {
		return nil, err
	}
	return c, nil
}

// Close stops listening; vconns accepted but not taken are closed.
func (l *Listener) Close() error {
	l.mu.Lock()
	if l.closed {
		l.mu.Unlock()
		return nil
	}
	l.closed = true
	q := l.q
	l.q = nil
	l.mu.Unlock()
	l.wake()
	for _, c := range q {
		_ = c.Close()
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	_, err := l.s.call(ctx, &frame.Frame{Op: frame.OpClose, Handle: l.h})
	l.s.mu.Lock()
	delete(l.s.lns, l.h)
	l.s.mu.Unlock()
	if err != nil && !errorsIsAgentGone(err) {
		return err
	}
	return nil
}

// Addr is "node:port".
func (l *Listener) Addr() net.Addr { return l.addr }
