package engine

import (
	"context"
	"testing"
	"time"

	"github.com/rdmavisor/rdmavisor/internal/engine/format"
	"github.com/rdmavisor/rdmavisor/internal/transport"
	"github.com/rdmavisor/rdmavisor/internal/verbs/soft"
	"github.com/rdmavisor/rdmavisor/internal/verbs/soft/wire"
)

// TestBundles: messages an Auto vconn's sender queues faster than they go
// out travel in bundles, copied or gathered, and each arrives whole, once,
// in order, with its immediate; no buffer is left behind. The fixed
// transports never bundle. UC may drop, but only where a drop is counted
// (recvUC).
func TestBundles(t *testing.T) {
	for _, tr := range []transport.Kind{transport.RC, transport.Auto, transport.UC} {
		t.Run(tr.String(), func(t *testing.T) {
			ctx, a, b, va, vb, fb := testPairOnFabric(t, tr, 30*time.Second)
			const n = 5000
			size := func(i int) int {
				if i%3 == 0 {
					return gatherMin + i%3000 // gathered, not copied
				}
				return 1 + i%700
			}
			go sendNumbered(ctx, t, va, n, size)
			if tr != transport.Auto {
				defer func() {
					if s := a.Stats(); s.Bundled != 0 {
						t.Errorf("a %v vconn bundled %d messages", tr, s.Bundled)
					}
				}()
			}
			if tr == transport.UC {
				recvUC(ctx, t, a, b, fb, vb, n, size)
				return
			}
			recvNumbered(ctx, t, vb, n, size)
			s := a.Stats()
			if tr == transport.Auto && (s.Bundled == 0 || s.Gathered == 0 || s.Gathered == s.Bundled) {
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
	va, vb, err := Pair(ctx, a, b, VConnOptions{Transport: transport.Auto}, VConnOptions{Transport: transport.Auto})
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
	taken, returned := va.srv.sent, vb.window.Consumed()
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

// recvUC receives what sendNumbered sent on a UC vconn from a to b over
// a fabric that loses nothing, and accounts for every message. UC has no
// flow control: a sender faster than the receiver overruns it, and a
// message is dropped where that happened, each time counted: at b's vconn,
// whose queue was full (RejectOverflow), or at b's device for want of a
// posted receive or of CQ room (RxNoRecvDrop, CQOverruns), once for the
// message; or at b's receive queue on the fabric (DropQueueFull), once for
// each packet, and a UC message that lost one packet is lost whole (the
// next starts afresh). So the messages missing are at least the drops of
// the first kind and at most all drops counted: exactly the first kind
// when the fabric dropped nothing. What arrives comes whole, once, in
// order.
//
// On rxe (fb nil) the drops of the kernel's rxe are not counted here:
// the count is logged, not checked.
func recvUC(ctx context.Context, t *testing.T, a, b *Engine, fb *wire.Fabric, vb *VConn, n int, size func(int) int) {
	t.Helper()
	dev, _ := b.dev.(*soft.Device)
	if fb == nil {
		dev = nil
	}
	// perMessage: the drops counted once for the message they took.
	perMessage := func() uint64 {
		d := b.RejectStats()[RejectOverflow]
		if dev != nil {
			ds := dev.Stats()
			d += ds.RxNoRecvDrop + ds.CQOverruns
		}
		return d
	}
	got, last := 0, -1
	progress := time.Now()
	for uint64(got)+perMessage() < uint64(n) {
		rctx, rcancel := context.WithTimeout(ctx, 50*time.Millisecond)
		m, err := vb.Recv(rctx)
		rcancel()
		if err != nil {
			if ctx.Err() != nil {
				t.Fatalf("%d of %d UC messages arrived, %d dropped: %v", got, n, perMessage(), ctx.Err())
			}
			// What has not come long after all was handed to the device
			// was dropped on the fabric (or, on rxe, by rxe).
			if a.Stats().MsgsSent == uint64(n) && time.Since(progress) > 2*time.Second {
				break
			}
			continue
		}
		i := int(m.Imm)
		if i <= last || i >= n || len(m.Data) != size(i) || m.Data[0] != byte(i) || m.Data[len(m.Data)-1] != byte(i) {
			t.Fatalf("after message %d came %d with %d bytes", last, i, len(m.Data))
		}
		last = i
		got++
		progress = time.Now()
		m.Release()
	}
	// The last messages may be read before the sender polled their
	// completions (seen on rxe): counted sent soon, not at once.
	waitFor(t, func() bool { return a.Stats().MsgsSent == uint64(n) }, "every UC message counted sent once")
	lost, once := uint64(n-got), perMessage()
	if dev == nil {
		t.Logf("%d of %d UC messages arrived on %s, %d dropped by a full vconn queue", got, n, b.dev.Attr().Name, once)
		return
	}
	ds, ws := dev.Stats(), fb.Stats()
	t.Logf("%d of %d UC messages arrived; dropped: vconn queue full %d, no receive posted %d, CQ full %d; fabric packets at a full queue %d",
		got, n, b.RejectStats()[RejectOverflow], ds.RxNoRecvDrop, ds.CQOverruns, ws.DropQueueFull)
	if other := ws.Dropped() - ws.DropQueueFull; other != 0 {
		t.Errorf("the fault-free fabric dropped %d packets other than at a full queue: %+v", other, ws)
	}
	if lost < once || lost > once+ws.DropQueueFull {
		t.Errorf("%d of %d UC messages missing; %d drops counted once a message, %d packets dropped by the fabric: want %d to %d missing",
			lost, n, once, ws.DropQueueFull, once, once+ws.DropQueueFull)
	}
}

// testPairOnFabric is testPair on a fault-free fabric it also returns;
// on rxe (openVerbsDevice), the pair is rxe's and the fabric nil.
func testPairOnFabric(t *testing.T, tr transport.Kind, timeout time.Duration) (context.Context, *Engine, *Engine, *VConn, *VConn, *wire.Fabric) {
	t.Helper()
	if openVerbsDevice != nil {
		ctx, a, b, va, vb := testPair(t, wire.Faults{}, tr, timeout)
		return ctx, a, b, va, vb, nil
	}
	fb := wire.NewFabric(wire.Faults{})
	t.Cleanup(func() { _ = fb.Close() })
	a, b := testEnginesOn(t, fb, Config{})
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	t.Cleanup(cancel)
	va, vb, err := Pair(ctx, a, b, VConnOptions{Transport: tr}, VConnOptions{Transport: tr})
	if err != nil {
		t.Fatal(err)
	}
	return ctx, a, b, va, vb, fb
}

// TestBundleFitsRing: a bundle carries at most a ring's worth of messages,
// which is what the format's count allows.
func TestBundleFitsRing(t *testing.T) {
	if maxBundle != format.MaxBundle {
		t.Fatalf("maxBundle (a ring: %d) and format.MaxBundle (%d) parted", maxBundle, format.MaxBundle)
	}
}
