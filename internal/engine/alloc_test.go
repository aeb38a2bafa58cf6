//go:build !race

// Allocation counts are only meaningful without the race detector, which
// allocates on its own; hack/test.sh runs these in a second, non-race pass.

package engine

import (
	"context"
	"fmt"
	"runtime"
	"sync/atomic"
	"testing"
	"time"

	"github.com/rdmavisor/rdmavisor/internal/transport"
	"github.com/rdmavisor/rdmavisor/internal/verbs/soft/wire"
)

// TestHotPathAllocatesNothing: a message's way through the engine — queue
// on the vconn, post by the poller, deliver through the soft device, poll,
// demultiplex by imm_data, hand to the handler, release and repost — does
// not allocate: on RC and Auto (datagrams, acknowledgements), one at a time
// and in bursts (which Auto sends as bundles).
func TestHotPathAllocatesNothing(t *testing.T) {
	for _, tc := range []struct {
		tr    transport.Kind
		burst int
		size  int
	}{{transport.RC, 1, 64}, {transport.RC, 8, 64}, {transport.RC, 3, 2000}, {transport.Auto, 1, 64}, {transport.Auto, 8, 64}, {transport.Auto, 3, 2000}} {
		t.Run(fmt.Sprintf("%v/burst=%d/size=%d", tc.tr, tc.burst, tc.size), func(t *testing.T) {
			a, b := testEngines(t, wire.Faults{}, Config{SpinPolls: 1 << 30})
			var got atomic.Uint64
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			va, _, err := Pair(ctx, a, b, VConnOptions{Transport: tc.tr}, VConnOptions{Transport: tc.tr, Handler: func(_ *VConn, m Message) {
				m.Release()
				got.Add(1)
			}})
			if err != nil {
				t.Fatal(err)
			}
			msg := make([]byte, tc.size)
			round := func() {
				want := got.Load() + uint64(tc.burst)
				for range tc.burst {
					if err := va.Send(ctx, msg); err != nil {
						t.Fatal(err)
					}
				}
				for got.Load() < want {
					runtime.Gosched()
				}
			}
			for range 2000 {
				round() // warm up pools and slices
			}
			if n := testing.AllocsPerRun(2000, round); n != 0 {
				t.Fatalf("%.2f allocations per round of %d messages; want 0", n, tc.burst)
			}
			if tc.tr == transport.Auto && tc.burst > 1 && a.Stats().Bundled == 0 {
				t.Errorf("bursts of %d went unbundled", tc.burst)
			}
		})
	}
}

// TestSendStagedAllocatesNothing: a staged send's round allocates nothing.
func TestSendStagedAllocatesNothing(t *testing.T) {
	for _, tr := range []transport.Kind{transport.RC, transport.Auto} {
		t.Run(tr.String(), func(t *testing.T) {
			a, b := testEngines(t, wire.Faults{}, Config{SpinPolls: 1 << 30})
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			var got, back atomic.Uint64
			va, _, err := Pair(ctx, a, b, VConnOptions{Transport: tr}, VConnOptions{Transport: tr, Handler: func(_ *VConn, m Message) {
				m.Release()
				got.Add(1)
			}})
			if err != nil {
				t.Fatal(err)
			}
			st, err := va.StageSends(mapShared(t, 64<<10), func(uint32) { back.Add(1) }, nil)
			if err != nil {
				t.Fatal(err)
			}
			defer st.Close()
			round := func() {
				want := got.Load() + 1
				if _, err := va.SendStaged(ctx, st, 128, 2000, 7, true, 1); err != nil {
					t.Fatal(err)
				}
				for got.Load() < want || back.Load() < want {
					runtime.Gosched()
				}
			}
			for range 2000 {
				round()
			}
			if n := testing.AllocsPerRun(2000, round); n != 0 {
				t.Fatalf("%.2f allocations per staged round trip; want 0", n)
			}
		})
	}
}
