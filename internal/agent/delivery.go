package agent

import (
	"context"
	"fmt"

	"github.com/rdmavisor/rdmavisor/internal/engine"
)

// carrier takes a vconn's received messages to its pod: socketRX (Data
// frames on the session's socket, within the window the pod granted), the
// vconn's shared-memory RX ring (shmVConn), or a bridge's stream socket
// (bridgeRX). Its methods are called by
// deliver only, on the vconn's delivery goroutine.
type carrier interface {
	// ready waits until the pod can take a message: false once the vconn
	// is done.
	ready() bool
	// put hands the pod one message, of at most limit bytes; deliver
	// releases m afterwards. False ends the delivery (the vconn is done
	// or the pod's side broke).
	put(m engine.Message) bool
	// end tells the pod the vconn ended: io.EOF when the peer closed,
	// else why it failed.
	end(err error)
	// limit is the largest message the carrier takes, and its name for
	// the error that refuses a larger one.
	limit() (max int, name string)
}

// deliver hands the vconn's received messages to its pod over c until the
// vconn ends. It runs on the vconn's delivery goroutine: the pump for the
// socket (started by add), serveRX for shared memory (started by
// openShm, while the pump, never granted window, waits idle). It reads
// the engine only once c is ready, so an application that does not read
// holds its vconn's engine credits, not agent memory. The message it holds
// counts against the allocation's limits.queuedBytes (claimRx).
func (h *vconnHandle) deliver(c carrier) { deliver(h.ctx, h.vc, h.s.al, c) }

// deliver is the loop of a vconn of allocation al, until ctx ends; the
// bridge's delivery runs it too (bridge.go).
func deliver(ctx context.Context, vc *engine.VConn, al *allocation, c carrier) {
	for c.ready() {
		m, err := vc.Recv(ctx)
		if ctx.Err() != nil {
			if err == nil {
				m.Release()
				al.stats.dropReceived()
			}
			return
		}
		if err != nil {
			al.failed(err)
			c.end(err) // io.EOF, or the engine's failure
			return
		}
		if max, name := c.limit(); len(m.Data) > max {
			n := len(m.Data)
			m.Release()
			al.stats.dropReceived()
			c.end(tooLarge{n: n, max: max, carrier: name})
			vc.Abort()
			return
		}
		// Past the allocation's limits.queuedBytes the message waits
		// here unreleased: its credit holds the peer back.
		n := int64(len(m.Data))
		if err := al.claimRx(ctx, n); err != nil {
			m.Release() // the vconn ended
			al.stats.dropReceived()
			return
		}
		ok := c.put(m)
		m.Release()
		al.stats.received(int(n), ok)
		al.releaseRx(n)
		if !ok {
			return
		}
	}
}

// tooLarge is a received message larger than its carrier takes; it is of
// engine.ErrTooLarge's class (codeOf: frame.CodeTooLarge).
type tooLarge struct {
	n, max  int
	carrier string
}

func (e tooLarge) Error() string {
	return fmt.Sprintf("received a message of %d bytes: %s carries at most %d", e.n, e.carrier, e.max)
}

func (e tooLarge) Is(target error) bool { return target == engine.ErrTooLarge }

var (
	_ carrier = socketRX{}
	_ carrier = (*shmVConn)(nil)
	_ carrier = bridgeRX{}
)
