//go:build !race

// Allocation counts are only meaningful without the race detector, which
// allocates on its own; hack/test.sh runs these in a second, non-race pass.

package engine

import (
	"context"
	"runtime"
	"sync/atomic"
	"testing"
	"time"

	"github.com/rdmavisor/rdmavisor/internal/verbs/soft/wire"
)

// TestHotPathAllocatesNothing: a message's way through the engine — queue
// on the vconn, post by the poller, deliver through the soft device, poll,
// demultiplex by imm_data, hand to the handler, release and repost — does
// not allocate.
func TestHotPathAllocatesNothing(t *testing.T) {
	a, b := testEngines(t, wire.Faults{}, Config{SpinPolls: 1 << 30})
	var got atomic.Uint64
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	va, _, err := Pair(ctx, a, b, VConnOptions{}, VConnOptions{Handler: func(_ *VConn, m Message) {
		m.Release()
		got.Add(1)
	}})
	if err != nil {
		t.Fatal(err)
	}
	msg := make([]byte, 64)
	round := func() {
		want := got.Load() + 1
		if err := va.Send(ctx, msg); err != nil {
			t.Fatal(err)
		}
		for got.Load() < want {
			runtime.Gosched()
		}
	}
	for range 2000 {
		round() // warm up pools and slices
	}
	if n := testing.AllocsPerRun(2000, round); n != 0 {
		t.Fatalf("%.2f allocations per message; want 0", n)
	}
}
