package vconn_test

import (
	"fmt"
	"testing"
)

// BenchmarkRegion measures a region's four paths through two agents, at
// 4 KiB and 64 KiB: the exporting pod's ReadAt and WriteAt of its own
// region, and the peer's RDMA READ and WRITE of it (ReadRegion,
// WriteRegion). Each reports bytes/s (SetBytes) and its allocations.
func BenchmarkRegion(b *testing.B) {
	const size = 1 << 20
	p := newRegionPair(b, size, true)
	ctx, r, c, id := p.ctx, p.r, p.c, p.id
	for _, n := range []int{4 << 10, 64 << 10} {
		buf := make([]byte, n)
		for _, p := range []struct {
			name string
			do   func(off int64) error
		}{
			{"WriteAt", func(off int64) error { return r.WriteAt(ctx, buf, off) }},
			{"ReadAt", func(off int64) error { return r.ReadAt(ctx, buf, off) }},
			{"WriteRegion", func(off int64) error { return c.WriteRegion(ctx, id, uint64(off), buf) }},
			{"ReadRegion", func(off int64) error { return c.ReadRegion(ctx, id, uint64(off), buf) }},
		} {
			b.Run(fmt.Sprintf("%s/%dKiB", p.name, n>>10), func(b *testing.B) {
				b.SetBytes(int64(n))
				b.ReportAllocs()
				for i := 0; b.Loop(); i++ {
					if err := p.do(int64(i*n) % (size - int64(n) + 1)); err != nil {
						b.Fatal(err)
					}
				}
			})
		}
	}
}
