package engine

import (
	"context"
	"encoding/binary"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/rdmavisor/rdmavisor/internal/verbs/soft/wire"
	"github.com/rdmavisor/rdmavisor/internal/vqpn"
)

// TestCloseReuseNeverMisdelivers opens and closes vconns while their
// messages are in flight, in a table small enough that vQPNs are reused
// within milliseconds: every message that arrives must carry the nonce of
// the vconn it is delivered to.
func TestCloseReuseNeverMisdelivers(t *testing.T) {
	a, b := testEngines(t, wire.Faults{Seed: 3, Loss: 0.01, Reorder: 0.05, Delay: 50 * time.Microsecond, Jitter: 50 * time.Microsecond},
		Config{MaxVConns: 48, QPsPerPeer: 2, CloseTimeout: 2 * time.Second})
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute) // under -race with 1 ms timers it takes ~55 s
	defer cancel()
	const (
		workers = 8
		rounds  = 300
		msgs    = 6
	)
	var delivered, misdelivered atomic.Uint64
	var wg sync.WaitGroup
	for w := 0; w < workers; w++ {
		wg.Add(1)
		go func(w int) {
			defer wg.Done()
			for r := 0; r < rounds; r++ {
				nonce := uint64(w)<<32 | uint64(r)
				handler := func(_ *VConn, m Message) {
					if len(m.Data) != 8 || binary.BigEndian.Uint64(m.Data) != nonce {
						misdelivered.Add(1)
					}
					delivered.Add(1)
					m.Release()
				}
				va, vb, err := Pair(ctx, a, b, VConnOptions{}, VConnOptions{Handler: handler})
				for errors.Is(err, vqpn.ErrFull) {
					// Closed vconns free their vQPNs once both FINs are
					// through; wait for one.
					if ctx.Err() != nil {
						t.Errorf("round %d: every vQPN stayed live until the deadline (%d vconns on A, %d on B)", r, a.Stats().VConns, b.Stats().VConns)
						return
					}
					time.Sleep(100 * time.Microsecond)
					va, vb, err = Pair(ctx, a, b, VConnOptions{}, VConnOptions{Handler: handler})
				}
				if err != nil {
					t.Error(err)
					return
				}
				var buf [8]byte
				binary.BigEndian.PutUint64(buf[:], nonce)
				for i := 0; i < msgs; i++ {
					if err := va.Send(ctx, buf[:]); err != nil {
						t.Error(err)
						return
					}
				}
				if r%2 == 0 {
					// Close both ends with the messages still in flight.
					_ = va.Close()
					_ = vb.Close()
					continue
				}
				// Abort the receiver mid-stream: its vQPN is reused at
				// once while the sender's messages are still arriving.
				vb.Abort()
				for i := 0; i < msgs; i++ {
					if err := va.Send(ctx, buf[:]); err != nil {
						if !errors.Is(err, ErrReset) {
							t.Error(err)
						}
						break
					}
				}
				_ = va.Close()
			}
		}(w)
	}
	wg.Wait()
	if n := misdelivered.Load(); n != 0 {
		t.Fatalf("%d of %d messages delivered to the wrong vconn", n, delivered.Load())
	}
	waitFor(t, func() bool { return a.Stats().VConns == 0 && b.Stats().VConns == 0 }, "every vQPN released")
	sa, sb := a.Stats(), b.Stats()
	t.Logf("%d delivered, %d stale completions dropped at the receiver, %d at the sender", delivered.Load(), sb.StaleDropped, sa.StaleDropped)
	if delivered.Load() == 0 {
		t.Fatal("nothing delivered")
	}
	if sb.StaleDropped == 0 {
		t.Fatal("no message arrived for an aborted vconn: the test did not exercise vQPN reuse")
	}
}
