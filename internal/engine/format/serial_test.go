package format

import (
	"sync"
	"sync/atomic"
	"testing"
)

func TestAdvance(t *testing.T) {
	for _, tc := range []struct {
		from, to uint32
		moved    bool
	}{
		{0, 1, true},
		{5, 5, false},
		{5, 4, false},
		{^uint32(0), 0, true},          // across the wrap
		{0, ^uint32(0), false},         // behind, across the wrap
		{0, 1<<31 - 1, true},           // the furthest ahead
		{0, 1 << 31, false},            // half way round reads as behind
		{1 << 31, 1<<31 + 1<<30, true}, // ahead of a large value
	} {
		var a atomic.Uint32
		a.Store(tc.from)
		moved := Advance(&a, tc.to)
		want := tc.from
		if tc.moved {
			want = tc.to
		}
		if moved != tc.moved || a.Load() != want || After(tc.to, tc.from) != tc.moved {
			t.Errorf("Advance(%d, %d) = %v, now %d; want %v, %d", tc.from, tc.to, moved, a.Load(), tc.moved, want)
		}
	}
}

// Concurrent advances end at the latest value, whichever order they run in.
func TestAdvanceConcurrent(t *testing.T) {
	base := ^uint32(0) - 500
	var a atomic.Uint32
	a.Store(base)
	var wg sync.WaitGroup
	for g := range 4 {
		wg.Go(func() {
			for i := uint32(g); i < 1000; i += 4 {
				Advance(&a, base+i)
			}
		})
	}
	wg.Wait()
	if got := a.Load(); got != base+999 {
		t.Fatalf("ended at %d, want %d", got, base+999)
	}
}
