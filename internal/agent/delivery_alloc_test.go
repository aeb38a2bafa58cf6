//go:build !race

// Allocation counts are only meaningful without the race detector, which
// allocates on its own.

package agent

import (
	"runtime"
	"testing"

	"github.com/rdmavisor/rdmavisor/internal/engine"
)

// TestDeliverAllocatesNothing: the delivery loop adds no allocation to the
// engine's receive path.
func TestDeliverAllocatesNothing(t *testing.T) {
	ctx, h, peer := deliveryPair(t, engine.Config{SpinPolls: 1 << 30}) // pollers that never sleep, as the engine's own test
	c := &countRX{max: 64, ended: make(chan error, 1)}
	go h.deliver(c)
	msg := make([]byte, 64)
	round := func() {
		want := c.n.Load() + 1
		if err := peer.Send(ctx, msg); err != nil {
			t.Fatal(err)
		}
		for c.n.Load() < want {
			runtime.Gosched()
		}
	}
	for range 2000 {
		round() // warm up the engine's pools
	}
	if n := testing.AllocsPerRun(2000, round); n != 0 {
		t.Fatalf("%.2f allocations per message delivered; want 0", n)
	}
	// The per-pod counters counted every message: AllocsPerRun runs
	// round once more than asked.
	if got, want := recvCounts(&h.s.al.stats), [3]uint64{4001, 4001 * 64, 0}; got != want {
		t.Fatalf("the allocation counts %v messages, bytes, drops received; want %v", got, want)
	}
}

// TestForwardAllocatesNothing: the send loop, counting for the pod's
// metrics, adds no allocation to the engine's send path.
func TestForwardAllocatesNothing(t *testing.T) {
	ctx, h, peer := deliveryPair(t, engine.Config{SpinPolls: 1 << 30})
	src := newChanTX(&h.s.al.stats)
	go forward(ctx, h.vc, src)
	defer close(src.in)
	msg := make([]byte, 64)
	round := func() {
		src.in <- msg
		m, err := peer.Recv(ctx)
		if err != nil {
			t.Fatal(err)
		}
		m.Release()
	}
	for range 2000 {
		round()
	}
	if n := testing.AllocsPerRun(2000, round); n != 0 {
		t.Fatalf("%.2f allocations per message sent; want 0", n)
	}
	if got, want := sendCounts(&h.s.al.stats), [3]uint64{4001, 4001 * 64, 0}; got != want {
		t.Fatalf("the allocation counts %v messages, bytes, drops sent; want %v", got, want)
	}
}
