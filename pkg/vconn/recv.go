package vconn

import (
	"context"
	"net"

	"github.com/rdmavisor/rdmavisor/internal/shm"
)

// next waits for the next message; io.EOF after the peer closed. It runs
// on the receiving caller's goroutine (RecvMsg, Read), as do its
// receiver's methods; a receiver that spins (shared memory) spins here.
// A receiver that can puts the message where to says instead of
// returning it.
func (c *Conn) next(ctx context.Context, dl *deadline, to sink) (Message, int, error) {
	var rx receiver = socketRX{}
	if c.shm != nil {
		rx = c.shm
	}
	var spin shm.Spinner
	spins := rx.spins()
	for {
		if c.isClosed() {
			return Message{}, 0, net.ErrClosed
		}
		if m, n, ok, err := rx.take(c, to); ok || err != nil {
			return m, n, err
		}
		if err := ctx.Err(); err != nil {
			return Message{}, 0, err
		}
		if spins && spin.More() {
			continue
		}
		var dc chan struct{}
		if dl != nil {
			dc = dl.wait()
		}
		if err := rx.wait(ctx, c, dc); err != nil {
			return Message{}, 0, err
		}
	}
}

// receiver is where a vconn's received messages wait for the application:
// socketRX, the queue the session's reader fills from the socket (deliver),
// or shmConn, the shared-memory RX ring.
type receiver interface {
	// take returns the next message (ok), or, with none, io.EOF or the
	// vconn's failure once the vconn ended; or it puts the message where
	// to says, if it can, and returns n: the bytes copied into to.into,
	// or putToFn with to.fn's error.
	take(c *Conn, to sink) (m Message, n int, ok bool, err error)
	// spins: next polls take a while (shm.Spinner) before it sleeps in
	// wait.
	spins() bool
	// wait sleeps until a message may be there, or c closes; it fails
	// when ctx ends or dc (the read deadline) closes.
	wait(ctx context.Context, c *Conn, dc chan struct{}) error
}

// putToFn is take's n when it gave the message to its sink's fn.
const putToFn = -1

// sink is where a receiver may put a message rather than return it:
// into, Read's buffer (c.rmu held; the message's rest goes to c.cur), or
// fn, RecvMsgFunc's, called with the message in place.
type sink struct {
	into []byte
	fn   func(Message) error
}

var (
	_ receiver = socketRX{}
	_ receiver = (*shmConn)(nil)
)
