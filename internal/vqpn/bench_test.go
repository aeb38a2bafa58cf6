package vqpn

import (
	"testing"
)

// liveTable returns a table with n live IDs.
func liveTable(b *testing.B, n int) (*Table[conn], []ID) {
	b.Helper()
	tbl := New[conn](MaxCapacity)
	c := &conn{}
	ids := make([]ID, n)
	for i := range ids {
		id, err := tbl.Alloc(c)
		if err != nil {
			b.Fatal(err)
		}
		ids[i] = id
	}
	return tbl, ids
}

// BenchmarkLookup is the completion path: live IDs spread over 64 Ki vconns,
// looked up from every P.
func BenchmarkLookup(b *testing.B) {
	tbl, ids := liveTable(b, 1<<16)
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		i := 0
		for pb.Next() {
			if _, ok := tbl.Lookup(ids[i&(1<<16-1)]); !ok {
				b.Fatal("miss")
			}
			i += 7919
		}
	})
}

// BenchmarkLookupStale is a flood of completions for closed vconns: every
// Lookup fails and bumps the shared Stale counter.
func BenchmarkLookupStale(b *testing.B) {
	tbl, ids := liveTable(b, 1<<10)
	for i := range ids {
		if err := tbl.Release(ids[i]); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		i := 0
		for pb.Next() {
			if _, ok := tbl.Lookup(ids[i&(1<<10-1)]); ok {
				b.Fatal("hit")
			}
			i++
		}
	})
}

// BenchmarkDecodeLookup is one completion: split wr_id, look up the vconn.
func BenchmarkDecodeLookup(b *testing.B) {
	tbl, ids := liveTable(b, 1<<10)
	wrids := make([]uint64, len(ids))
	for i, id := range ids {
		wrids[i] = WRID(id, uint32(i))
	}
	b.ReportAllocs()
	var sink uint32
	i := 0
	for b.Loop() {
		id, slot := SplitWRID(wrids[i&(1<<10-1)])
		if _, ok := tbl.Lookup(id); ok {
			sink += slot
		}
		i++
	}
	_ = sink
}

// BenchmarkAllocRelease is a vconn opened and closed, in steady state.
func BenchmarkAllocRelease(b *testing.B) {
	tbl, ids := liveTable(b, MinReuseDistance+1024)
	for _, id := range ids[:MinReuseDistance+8] {
		if err := tbl.Release(id); err != nil {
			b.Fatal(err)
		}
	}
	c := &conn{}
	b.ReportAllocs()
	for b.Loop() {
		id, err := tbl.Alloc(c)
		if err != nil {
			b.Fatal(err)
		}
		if err := tbl.Release(id); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkAllocReleaseParallel is the same from every P, all contending for
// the allocator's mutex.
func BenchmarkAllocReleaseParallel(b *testing.B) {
	tbl, ids := liveTable(b, MinReuseDistance+1024)
	for _, id := range ids[:MinReuseDistance+8] {
		if err := tbl.Release(id); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		c := &conn{}
		for pb.Next() {
			id, err := tbl.Alloc(c)
			if err != nil {
				b.Fatal(err)
			}
			if err := tbl.Release(id); err != nil {
				b.Fatal(err)
			}
		}
	})
}
