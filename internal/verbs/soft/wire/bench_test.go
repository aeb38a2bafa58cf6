package wire

import (
	"fmt"
	"testing"
)

var benchSizes, benchBatches = []int{64, 1024, 4096}, []int{1, 64}

// benchWire sends a batch from a to b and receives it, b.N times, in one
// goroutine: the cost of moving packets, without scheduling noise. One op
// is one batch.
func benchWire(b *testing.B, a, r Wire, size, batch int) {
	pkts := mkPkts(batch, size, r.LocalGID(), 0)
	rx := slots(batch, MaxPacketLen)
	round := func() {
		if _, err := a.Send(pkts); err != nil {
			b.Fatal(err)
		}
		for r.Stats().RxPackets < a.Stats().TxPackets {
			if _, err := r.Recv(rx); err != nil {
				b.Fatal(err)
			}
		}
	}
	for range 100 {
		round()
	}
	b.SetBytes(int64(size * batch))
	b.ReportAllocs()
	b.ResetTimer()
	for b.Loop() {
		round()
	}
	b.StopTimer()
	pkts64 := float64(b.N) * float64(batch)
	b.ReportMetric(pkts64/b.Elapsed().Seconds(), "pkts/s")
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/pkts64, "ns/pkt")
}

func BenchmarkFabric(b *testing.B) {
	for _, tc := range []struct {
		name string
		f    Faults
	}{
		{"clean", Faults{}},
		{"faults", Faults{Seed: 1, Loss: 0.01, Duplicate: 0.01, Reorder: 0.01}},
	} {
		for _, size := range benchSizes {
			for _, batch := range benchBatches {
				b.Run(fmt.Sprintf("%s/size=%d/batch=%d", tc.name, size, batch), func(b *testing.B) {
					fb := NewFabric(tc.f)
					defer fb.Close()
					ws := attach(b, fb, gidA, gidB)
					benchWire(b, ws[0], ws[1], size, batch)
				})
			}
		}
	}
}
