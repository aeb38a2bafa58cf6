package engine

import (
	"context"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/go-logr/logr"

	"github.com/rdmavisor/rdmavisor/internal/transport"
	"github.com/rdmavisor/rdmavisor/internal/verbs/soft/wire"
)

// BenchmarkTransport is one vconn's message rate per transport and size on
// the in-memory fabric.
func BenchmarkTransport(b *testing.B) {
	for _, size := range []int{16, 256, 1024, 4000} {
		for _, tr := range []transport.Kind{transport.RC, transport.UC, transport.UD, transport.Auto} {
			b.Run(fmt.Sprintf("%v/size=%d", tr, size), func(b *testing.B) {
				ea, eb := testEngines(b, wire.Faults{}, Config{Log: logr.Discard()})
				ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
				defer cancel()
				var got atomic.Int64
				va, _, err := Pair(ctx, ea, eb, VConnOptions{Transport: tr}, VConnOptions{Transport: tr, Handler: func(_ *VConn, m Message) {
					m.Release()
					got.Add(1)
				}})
				if err != nil {
					b.Fatal(err)
				}
				msg := make([]byte, size)
				b.SetBytes(int64(size))
				b.ReportAllocs()
				b.ResetTimer()
				start := time.Now()
				for range b.N {
					if err := va.Send(ctx, msg); err != nil {
						b.Fatal(err)
					}
				}
				// Unreliable transports may drop: count what arrived.
				deadline := time.Now().Add(2 * time.Second)
				for got.Load() < int64(b.N) && time.Now().Before(deadline) {
					time.Sleep(100 * time.Microsecond)
				}
				el := time.Since(start)
				b.ReportMetric(float64(got.Load())/el.Seconds(), "delivered/s")
				b.ReportMetric(float64(int64(b.N)-got.Load())/float64(b.N), "lost")
			})
		}
	}
}
