package agent

import (
	"context"
	"errors"
	"io"

	"github.com/rdmavisor/rdmavisor/internal/engine"
)

// source is where a vconn's outgoing messages come from in the agent, as
// carrier is where its received ones go: the session's queue of
// operations (opSource), the shared-memory TX ring (shmTX) or a bridge's
// stream socket (bridgeTX). Its methods are called by forward only, on
// the vconn's sending goroutine.
type source interface {
	// next waits for the next message to send. Its bytes stay valid
	// until sent returns. An error ends the loop (io.EOF: the pod's side
	// stopped sending).
	next() (outgoing, error)
	// sent takes the engine's answer to the message next returned; false
	// ends the loop.
	sent(err error) bool
	// end is told next's error.
	end(err error)
	// rate is the limiter of the vconn's allocation (nil: no rates).
	rate() *rateLimiter
	// tenant is the allocation's counters its messages count in.
	tenant() *tenantStats
}

// outgoing is one message of a source: its bytes, or send, which hands
// the next message to the vconn's engine itself (the bridge: its reads go
// straight into the engine's send buffers, engine.VConn.SendFrom) and
// returns its size.
type outgoing struct {
	data   []byte
	imm    uint32
	hasImm bool
	send   func() (int, error)
}

// forward is the agent's one send loop: it hands the messages of src to
// the engine, in order, blocking while the vconn's queue is full (the
// peer's reader holds its credits) or the allocation is past its rates
// (limits.messageRate, limits.byteRate), until src ends or ctx does.
func forward(ctx context.Context, vc *engine.VConn, src source) {
	rate := src.rate()
	st := src.tenant()
	for {
		m, err := src.next()
		if err != nil {
			src.end(err)
			return
		}
		n := len(m.data)
		switch err = rate.take(ctx, n); {
		case err != nil: // ctx ended while the rate held the message
		case m.send != nil:
			// Its size is known once read: the rate counted it as
			// empty, and the rest is owed (the next message waits).
			n, err = m.send()
			switch {
			case n > 0:
				rate.owe(n)
			case errors.Is(err, io.EOF): // the source's read: its end
				src.end(err)
				return
			}
		case m.hasImm:
			err = vc.SendImm(ctx, m.data, m.imm)
		default:
			err = vc.Send(ctx, m.data)
		}
		st.sent(n, err)
		if !src.sent(err) {
			return
		}
	}
}

var (
	_ source = (*opSource)(nil)
	_ source = shmTX{}
	_ source = (*bridgeTX)(nil)
)
