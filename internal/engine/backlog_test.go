package engine

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/rdmavisor/rdmavisor/internal/verbs/soft/wire"
)

// TestSlowReadersDoNotThrottleOthers: messages waiting for a slow reader's
// credits do not count in their QP's backlog, so vconns whose readers keep
// up still send on the QP they share.
func TestSlowReadersDoNotThrottleOthers(t *testing.T) {
	a, b := testEngines(t, wire.Faults{}, Config{QPsPerPeer: 1, SQDepth: 16, Credits: 2})
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	msg := make([]byte, 64)
	// Eight vconns whose reader never reads: each sends its two credits'
	// worth and queues a ringful behind them, 128 messages in all, eight
	// times the QP's backlog bound.
	for range 8 {
		slow, _, err := Pair(ctx, a, b, VConnOptions{}, VConnOptions{})
		if err != nil {
			t.Fatal(err)
		}
		for queued := 0; queued < 2+ringSize; {
			ok, err := slow.TrySend(msg)
			if err != nil {
				t.Fatal(err)
			}
			if ok {
				queued++
			} else {
				time.Sleep(time.Millisecond)
			}
		}
	}
	var got atomic.Int64
	fast, _, err := Pair(ctx, a, b, VConnOptions{}, VConnOptions{Handler: func(_ *VConn, m Message) {
		m.Release()
		got.Add(1)
	}})
	if err != nil {
		t.Fatal(err)
	}
	sctx, scancel := context.WithTimeout(ctx, 5*time.Second)
	defer scancel()
	for i := range 200 {
		if err := fast.Send(sctx, msg); err != nil {
			t.Fatalf("send %d on the fast vconn: %v", i, err)
		}
	}
	for got.Load() < 200 {
		if sctx.Err() != nil {
			t.Fatalf("%d of 200 messages delivered on the fast vconn", got.Load())
		}
		time.Sleep(time.Millisecond)
	}
}
