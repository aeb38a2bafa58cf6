package engine

import (
	"context"
	"testing"
	"time"

	"github.com/rdmavisor/rdmavisor/internal/verbs/soft/wire"
)

// TestBundles: messages an Auto vconn's sender queues faster than they go
// out travel in bundles, copied or gathered, and each arrives whole, once,
// in order, with its immediate; no buffer is left behind. The fixed
// transports never bundle.
func TestBundles(t *testing.T) {
	for _, tr := range []Transport{RC, Auto, UC} {
		t.Run(tr.String(), func(t *testing.T) {
			ctx, a, b, va, vb := testPair(t, wire.Faults{}, tr, 30*time.Second)
			const n = 5000
			size := func(i int) int {
				if i%3 == 0 {
					return gatherMin + i%3000 // gathered, not copied
				}
				return 1 + i%700
			}
			go sendNumbered(ctx, t, va, n, size)
			if tr != Auto {
				defer func() {
					if s := a.Stats(); s.Bundled != 0 {
						t.Errorf("a %v vconn bundled %d messages", tr, s.Bundled)
					}
				}()
			}
			if tr == UC {
				// Datagrams may be lost: count what comes, in order.
				last := -1
				for {
					rctx, rcancel := context.WithTimeout(ctx, 500*time.Millisecond)
					m, err := vb.Recv(rctx)
					rcancel()
					if err != nil {
						break
					}
					i := int(m.Imm)
					if i <= last || len(m.Data) != size(i) || m.Data[0] != byte(i) {
						t.Fatalf("after message %d came %d with %d bytes", last, i, len(m.Data))
					}
					last = i
					m.Release()
				}
				return
			}
			recvNumbered(ctx, t, vb, n, size)
			s := a.Stats()
			if tr == Auto && (s.Bundled == 0 || s.Gathered == 0 || s.Gathered == s.Bundled) {
				t.Fatalf("%d messages bundled, %d of them gathered: want both kinds of bundle", s.Bundled, s.Gathered)
			}
			t.Logf("%d of %d messages bundled, %d gathered", s.Bundled, n, s.Gathered)
			waitFor(t, func() bool { return a.Stats().MsgsSent == n }, "every message counted sent once")
			// No receive buffer is still held by a bundle's messages.
			for _, ci := range []int{b.recvClass, b.dgramClass} {
				for i := range b.pool.classes[ci].refs {
					if r := b.pool.classes[ci].refs[i].Load(); r != 0 {
						t.Fatalf("receive buffer %d of class %d still has %d owners", i, ci, r)
					}
				}
			}
			closeAll(t, a, b, va, vb)
		})
	}
}

// TestBundleCredits: a bundle takes one receive credit, as it takes one
// receive buffer, and the credit comes back once, with the buffer, after
// the last of its messages is released. With a small fixed window the
// sender runs out of credits, queues, and bundles more messages per credit;
// every credit it took comes back, and nothing overran the receive buffers
// (no datagram was lost, so no gap was reported).
func TestBundleCredits(t *testing.T) {
	a, b := testEngines(t, wire.Faults{}, Config{Credits: 4, DgramBuffers: 16})
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	va, vb, err := Pair(ctx, a, b, VConnOptions{Transport: Auto}, VConnOptions{Transport: Auto})
	if err != nil {
		t.Fatal(err)
	}
	const n = 3000
	size := func(i int) int { return 1 + i%700 }
	go sendNumbered(ctx, t, va, n, size)
	recvNumbered(ctx, t, vb, n, size)
	s := a.Stats()
	// The engines stop their pollers on Close: the sender's count of
	// credits taken is then safe to read.
	for _, e := range []*Engine{a, b} {
		if err := e.Close(); err != nil {
			t.Fatal(err)
		}
	}
	taken, returned := va.sent, vb.window.Consumed()
	t.Logf("%d messages, %d bundled, %d credits", n, s.Bundled, taken)
	if s.Bundled == 0 || taken >= n {
		t.Errorf("%d messages took %d credits (%d bundled): want fewer credits than messages", n, taken, s.Bundled)
	}
	if taken != returned {
		t.Errorf("the sender took %d credits, the receiver returned %d", taken, returned)
	}
	// A datagram lost on a lossless fabric was dropped for want of a
	// receive buffer, and the peer reported the gap. (A timeout may
	// resend in vain when the race detector stalls a poller.)
	if s.GapResends != 0 {
		t.Errorf("%d datagrams resent on gap reports on a lossless fabric: the window let the sender overrun the receive buffers", s.GapResends)
	}
}
