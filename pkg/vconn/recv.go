package vconn

import (
	"context"
	"net"
	"runtime"
	"time"
)

// next waits for the next message; io.EOF after the peer closed. It runs
// on the receiving caller's goroutine (RecvMsg, Read), as do its
// receiver's methods; a receiver that spins (shared memory) spins here.
// With into (Read's buffer, c.rmu held), a receiver that can copies the
// message's bytes straight into it, its rest into c.cur, and returns how
// many it copied instead of the message.
func (c *Conn) next(ctx context.Context, dl *deadline, into []byte) (Message, int, error) {
	var rx receiver = socketRX{}
	if c.shm != nil {
		rx = c.shm
	}
	var (
		idle time.Time // when the first take found nothing
		spin time.Duration
	)
	for {
		if c.isClosed() {
			return Message{}, 0, net.ErrClosed
		}
		if m, n, ok, err := rx.take(c, into); ok || err != nil {
			return m, n, err
		}
		if err := ctx.Err(); err != nil {
			return Message{}, 0, err
		}
		if idle.IsZero() {
			idle, spin = time.Now(), rx.spin()
		}
		if spin > 0 && time.Since(idle) < spin {
			runtime.Gosched()
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
	// vconn's failure once the vconn ended. With into, it may instead
	// copy the message into it (n bytes), as next says.
	take(c *Conn, into []byte) (m Message, n int, ok bool, err error)
	// spin is how long next polls take before it sleeps in wait.
	spin() time.Duration
	// wait sleeps until a message may be there, or c closes; it fails
	// when ctx ends or dc (the read deadline) closes.
	wait(ctx context.Context, c *Conn, dc chan struct{}) error
}

var (
	_ receiver = socketRX{}
	_ receiver = (*shmConn)(nil)
)
