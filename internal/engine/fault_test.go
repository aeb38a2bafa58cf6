package engine

import (
	"context"
	"errors"
	"syscall"
	"testing"
	"time"

	"github.com/rdmavisor/rdmavisor/internal/verbs/soft/wire"
)

// TestIdleEngineSleeps: once traffic stops, the pollers block on their
// completion channels: the process uses next to no CPU.
func TestIdleEngineSleeps(t *testing.T) {
	a, b := testEngines(t, wire.Faults{}, Config{})
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	va, vb, err := Pair(ctx, a, b, VConnOptions{}, VConnOptions{})
	if err != nil {
		t.Fatal(err)
	}
	for range 100 {
		if err := va.Send(ctx, []byte("x")); err != nil {
			t.Fatal(err)
		}
		m, err := vb.Recv(ctx)
		if err != nil {
			t.Fatal(err)
		}
		m.Release()
	}
	waitFor(t, func() bool { return a.pollers[0].loop.sleeping.Load() && b.pollers[0].loop.sleeping.Load() }, "pollers to sleep")
	before := cpuTime(t)
	time.Sleep(time.Second)
	used := cpuTime(t) - before
	// Busy pollers would burn a whole core (1 s); sleeping ones nothing.
	// In the rxe VM's emulated CPUs the Go runtime's own timers cost more
	// (15 to 120 ms seen there): still far from a busy poller.
	limit := 100 * time.Millisecond
	if openVerbsDevice != nil {
		limit = 300 * time.Millisecond
	}
	if used > limit {
		t.Fatalf("an idle engine pair used %v of CPU in 1 s", used)
	}
	t.Logf("idle CPU in 1 s: %v", used)
	// And it wakes up for the next message.
	if err := va.Send(ctx, []byte("wake")); err != nil {
		t.Fatal(err)
	}
	if m, err := vb.Recv(ctx); err != nil || string(m.Data) != "wake" {
		t.Fatalf("after idling: %q, %v", m.Data, err)
	}
}

func cpuTime(t *testing.T) time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		t.Fatal(err)
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// TestPeerFailFailsVConns: the control plane declaring a peer dead fails
// its vconns at once, with a clear error, and blocked calls return.
func TestPeerFailFailsVConns(t *testing.T) {
	a, b := testEngines(t, wire.Faults{}, Config{})
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	va, _, err := Pair(ctx, a, b, VConnOptions{}, VConnOptions{})
	if err != nil {
		t.Fatal(err)
	}
	errc := make(chan error, 1)
	go func() {
		_, err := va.Recv(ctx)
		errc <- err
	}()
	time.Sleep(10 * time.Millisecond)
	va.Peer().Fail(errors.New("heartbeats stopped"))
	select {
	case err := <-errc:
		if !errors.Is(err, ErrPeerGone) {
			t.Fatalf("blocked Recv returned %v, want ErrPeerGone", err)
		}
	case <-time.After(2 * time.Second):
		t.Fatal("a blocked Recv did not return when its peer failed")
	}
	if err := va.Send(ctx, []byte("x")); !errors.Is(err, ErrPeerGone) {
		t.Fatalf("send after the peer failed: %v", err)
	}
	if err := va.Close(); err != nil {
		t.Fatal(err)
	}
	waitFor(t, func() bool { return a.Stats().VConns == 0 }, "the failed vconn's vQPN to be released")
}

// TestDeadPeerTimesOut: a peer that vanishes without a word (its engine
// and device gone) is detected by the QPs' retransmission timeouts: the
// vconns fail, no call hangs.
func TestDeadPeerTimesOut(t *testing.T) {
	fb := wire.NewFabric(wire.Faults{})
	t.Cleanup(func() { _ = fb.Close() })
	a, b := testEnginesOn(t, fb, Config{})
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	va, _, err := Pair(ctx, a, b, VConnOptions{}, VConnOptions{})
	if err != nil {
		t.Fatal(err)
	}
	_ = b
	// The network between the nodes goes dark.
	fb.SetFaults(wire.Faults{Loss: 1})
	start := time.Now()
	if err := va.Send(ctx, []byte("into the void")); err != nil {
		t.Fatal(err)
	}
	_, err = va.Recv(ctx)
	if !errors.Is(err, ErrQPFailed) {
		t.Fatalf("Recv on a vconn to a dead peer: %v, want ErrQPFailed", err)
	}
	if el := time.Since(start); el > 5*time.Second {
		t.Fatalf("took %v to notice the dead peer", el)
	}
}

// TestFailedPeerIsReplaced: after a peer failed (its agent restarted), the
// next Peer call gives a fresh peer with new QPs, and traffic flows again;
// the old QPs are taken out of service.
func TestFailedPeerIsReplaced(t *testing.T) {
	a, b := testEngines(t, wire.Faults{}, Config{QPsPerPeer: 2})
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	va, vb, err := Pair(ctx, a, b, VConnOptions{}, VConnOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if err := va.Send(ctx, []byte("before")); err != nil {
		t.Fatal(err)
	}
	old := va.Peer()
	old.Fail(errors.New("agent restarted"))
	vb.Peer().Fail(errors.New("agent restarted"))
	_ = va.Close()
	_ = vb.Close()

	va, vb, err = Pair(ctx, a, b, VConnOptions{}, VConnOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if va.Peer() == old {
		t.Fatal("the failed peer was reused")
	}
	if err := va.Send(ctx, []byte("after")); err != nil {
		t.Fatal(err)
	}
	m, err := vb.Recv(ctx)
	if err != nil || string(m.Data) != "after" {
		t.Fatalf("after the peer was replaced: %q, %v", m.Data, err)
	}
	m.Release()
	if s := a.Stats(); s.Peers != 1 {
		t.Fatalf("%d peers, want 1", s.Peers)
	}
}

// TestCloseTimeout: a vconn closed on one side whose peer never closes
// (or failed without a word) gives its vQPN back after CloseTimeout.
func TestCloseTimeout(t *testing.T) {
	a, b := testEngines(t, wire.Faults{}, Config{CloseTimeout: 200 * time.Millisecond})
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	va, vb, err := Pair(ctx, a, b, VConnOptions{}, VConnOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if err := va.Close(); err != nil {
		t.Fatal(err)
	}
	if _, err := vb.Recv(ctx); err == nil {
		t.Fatal("the peer's Recv after our close: no EOF")
	}
	waitFor(t, func() bool { return a.Stats().VConns == 0 }, "the closed vconn's vQPN, its peer silent")
	if b.Stats().VConns != 1 {
		t.Fatalf("the peer that has not closed holds %d vconns, want 1", b.Stats().VConns)
	}
}

// TestPollerSleepsWaitingForRoom: a poller whose QP's send queue is full
// and whose completions do not come (the network went dark) sleeps on its
// CQ rather than yield to the scheduler forever: a goroutine that only
// yields keeps its P from checking the runtime's network poller, where a
// UDP device's receive loop waits, so the completions it waited for came
// late (a 10 ms tick), and 64 producers sharing a QP ran at a tenth of
// their rate. The QP has not failed yet: that takes 7 retries of 268 ms.
func TestPollerSleepsWaitingForRoom(t *testing.T) {
	fb := wire.NewFabric(wire.Faults{})
	t.Cleanup(func() { _ = fb.Close() })
	a, b := testEnginesOn(t, fb, Config{SQDepth: 16})
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	va, _, err := Pair(ctx, a, b, VConnOptions{}, VConnOptions{})
	if err != nil {
		t.Fatal(err)
	}
	fb.SetFaults(wire.Faults{Loss: 1})
	go func() {
		for i := 0; i < 30; i++ { // more than the send queue holds
			if va.Send(ctx, []byte("waiting for room")) != nil {
				return
			}
		}
	}()
	waitFor(t, func() bool { return a.Stats().WRsPosted >= 16 }, "the send queue to fill")
	before := a.Stats().Sleeps
	waitFor(t, func() bool { return a.Stats().Sleeps > before }, "the poller to sleep")
	// A poller that only yields sleeps once the QP failed and its vconns
	// with it, which is too late.
	if err := va.Err(); err != nil {
		t.Fatalf("the poller slept only after the vconn failed (%v): it yielded while it waited for room", err)
	}
}
