package engine

import (
	"context"
	"testing"
	"time"

	"github.com/rdmavisor/rdmavisor/internal/transport"
	"github.com/rdmavisor/rdmavisor/internal/verbs/soft/wire"
)

// TestCreditStallIsQuiet: a sender whose peer's reader does not read waits
// for credits without waking its poller. It used to ping-pong with it:
// the poller, serving the vconn, found no credit and woke the sender,
// which found the ring still full and scheduled the vconn again, each
// round a pair of wake-ups, for as long as the reader did not read (on a
// stream, 24 wake-ups a message, a fifth of its rate).
func TestCreditStallIsQuiet(t *testing.T) {
	for _, tr := range []transport.Kind{transport.RC, transport.Auto} {
		t.Run(tr.String(), func(t *testing.T) {
			a, b := testEngines(t, wire.Faults{}, Config{Credits: 4})
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			va, vb, err := Pair(ctx, a, b, VConnOptions{Transport: tr}, VConnOptions{Transport: tr})
			if err != nil {
				t.Fatal(err)
			}
			msg := make([]byte, 64<<10) // chunks on RC either way
			sent := make(chan error, 1)
			go func() {
				for {
					if err := va.Send(ctx, msg); err != nil {
						sent <- err
						return
					}
				}
			}()
			// Until the credits are used and the ring is full: the first
			// stall, then time for the sender to fill the ring.
			for a.Stats().CreditStalls == 0 {
				if ctx.Err() != nil {
					t.Fatal("the sender never stalled")
				}
				time.Sleep(10 * time.Millisecond)
			}
			time.Sleep(200 * time.Millisecond)
			before := a.Stats()
			time.Sleep(300 * time.Millisecond)
			after := a.Stats()
			if n := after.Sleeps - before.Sleeps; n > 5 {
				t.Errorf("the poller woke %d times in 300 ms while its only sender waited for credits; want at most 5", n)
			}
			if n := after.CreditStalls - before.CreditStalls; n > 5 {
				t.Errorf("the vconn stalled %d times in 300 ms with no grant; want at most 5", n)
			}
			// The reader reads: everything flows again.
			for i := 0; i < 50; i++ {
				m, err := vb.Recv(ctx)
				if err != nil {
					t.Fatalf("recv %d: %v", i, err)
				}
				if len(m.Data) != len(msg) {
					t.Fatalf("recv %d: %d bytes, want %d", i, len(m.Data), len(msg))
				}
				m.Release()
			}
			va.Abort()
			<-sent
		})
	}
}
