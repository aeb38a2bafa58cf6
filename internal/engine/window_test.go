package engine

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/rdmavisor/rdmavisor/internal/transport"
	"github.com/rdmavisor/rdmavisor/internal/verbs/soft/wire"
)

// stream sends n messages of msg on each of vcs, concurrently.
func stream(t *testing.T, ctx context.Context, n int, msg []byte, vcs ...*VConn) {
	t.Helper()
	var wg sync.WaitGroup
	for _, vc := range vcs {
		wg.Go(func() {
			for i := 0; i < n; i++ {
				if err := vc.Send(ctx, msg); err != nil {
					t.Error(err)
					return
				}
			}
		})
	}
	wg.Wait()
}

// TestCreditWindowGrows: a vconn whose sender uses every credit while its
// reader keeps up gets a larger window, never past MaxCredits; the growth
// comes from the engine's budget and goes back to it when the vconn ends.
// A window set by hand stays as set.
func TestCreditWindowGrows(t *testing.T) {
	for _, tc := range []struct {
		name     string
		cfg      Config
		tr       transport.Kind
		min, max uint32
		size     int
	}{
		{"rc", Config{}, transport.RC, defaultCredits + 1, defaultMaxCredits, 16},
		// Messages over half a chunk go alone: a bundle of small ones
		// takes one credit, and a sender slowed down (by the race
		// detector) may then never use all of its window.
		{"auto", Config{}, transport.Auto, defaultCredits + 1, defaultMaxCredits, DefaultChunkSize/2 + 1},
		{"fixed", Config{Credits: 8}, transport.RC, 8, 8, 16},
	} {
		t.Run(tc.name, func(t *testing.T) {
			a, b := testEngines(t, wire.Faults{}, tc.cfg)
			timeout := 30 * time.Second
			if openVerbsDevice != nil {
				timeout = 120 * time.Second // rxe in an emulated guest: 20,000 messages take a while
			}
			ctx, cancel := context.WithTimeout(context.Background(), timeout)
			defer cancel()
			var got sync.WaitGroup
			n := min(20000, 64<<20/tc.size)
			got.Add(n)
			release := func(_ *VConn, m Message) { m.Release(); got.Done() }
			va, vb, err := Pair(ctx, a, b, VConnOptions{Transport: tc.tr}, VConnOptions{Transport: tc.tr, Handler: release})
			if err != nil {
				t.Fatal(err)
			}
			budget := vb.windowBudget()
			start := budget.Left()
			stream(t, ctx, n, make([]byte, tc.size), va)
			// A send that failed leaves messages that never come: wait
			// for the context then, rather than hang the test binary.
			done := make(chan struct{})
			go func() { got.Wait(); close(done) }()
			select {
			case <-done:
			case <-ctx.Done():
				t.Fatalf("%d messages not all read: %v", n, ctx.Err())
			}
			w := vb.window.Size()
			if w < tc.min || w > tc.max {
				t.Fatalf("window %d after %d messages read at once: want %d..%d", w, n, tc.min, tc.max)
			}
			if lent := start - budget.Left(); lent != int64(w)-int64(b.cfg.Credits) {
				t.Errorf("budget lent %d for a window of %d over %d credits", lent, w, b.cfg.Credits)
			}
			_ = va.Close()
			_ = vb.Close()
			waitFor(t, func() bool { return budget.Left() == start }, "window growth returned to the budget")
		})
	}
}

// TestCreditWindowBudget: however many vconns stream at once, their
// windows together grow by no more than the budget, half the receive
// buffers their messages use.
func TestCreditWindowBudget(t *testing.T) {
	a, b := testEngines(t, wire.Faults{}, Config{RecvBuffers: 256})
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	release := func(_ *VConn, m Message) { m.Release() }
	var senders, receivers []*VConn
	for range 6 {
		va, vb, err := Pair(ctx, a, b, VConnOptions{}, VConnOptions{Handler: release})
		if err != nil {
			t.Fatal(err)
		}
		senders, receivers = append(senders, va), append(receivers, vb)
	}
	stream(t, ctx, 5000, []byte("credit window"), senders...)
	extra, grown := 0, 0
	for _, vc := range receivers {
		if w := int(vc.window.Size()); w > b.cfg.Credits {
			extra += w - b.cfg.Credits
			grown++
		}
	}
	if left := b.windowBudget[0].Left(); left < 0 || int(left)+extra != 256/2 {
		t.Errorf("budget left %d with %d lent: want them to add up to %d", left, extra, 256/2)
	}
	if grown == 0 {
		t.Error("no window grew")
	}
	t.Logf("%d of %d windows grew, by %d credits", grown, len(receivers), extra)
}
