package vqpn

import (
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// TestLookupRacesReuse hammers the window Lookup's version check closes: one
// vQPN released and reallocated as fast as possible while readers look up
// the live ID of the moment and the next one. Every value returned must carry the ID it was
// looked up by; the owner of the next generation must never come back.
func TestLookupRacesReuse(t *testing.T) {
	d := 300 * time.Millisecond
	if testing.Short() {
		d = 50 * time.Millisecond
	}
	tbl := New[ID](1)
	var cur atomic.Uint32 // the ID live now, or about to be
	var stop atomic.Bool
	var hits, misses atomic.Uint64
	var wg sync.WaitGroup
	wg.Go(func() {
		deadline := time.Now().Add(d)
		for i := 0; !stop.Load(); i++ {
			if i%1024 == 0 && time.Now().After(deadline) {
				break
			}
			// The value is the ID it will be allocated under: the next
			// generation of vQPN 1 (capacity 1, so no other choice).
			next := MakeID(1, ID(cur.Load()).Gen().next())
			val := new(ID)
			*val = next
			id, err := tbl.Alloc(val)
			if err != nil || id != next {
				t.Errorf("Alloc = %v, %v; want %v", id, err, next)
				break
			}
			cur.Store(uint32(id))
			if err := tbl.Release(id); err != nil {
				t.Errorf("Release(%v): %v", id, err)
				break
			}
		}
		stop.Store(true)
	})
	for range 2 {
		wg.Go(func() {
			for i := 0; !stop.Load(); i++ {
				// The live ID, or the one being allocated next.
				id := ID(cur.Load())
				if i%2 == 1 {
					id = MakeID(1, id.Gen().next())
				}
				if p, ok := tbl.Lookup(id); ok {
					hits.Add(1)
					if p == nil {
						t.Errorf("Lookup(%v) returned nil, true", id)
						stop.Store(true)
					} else if *p != id {
						t.Errorf("Lookup(%v) returned the value of %v", id, *p)
						stop.Store(true)
					}
				} else {
					misses.Add(1)
				}
			}
		})
	}
	wg.Wait()
	t.Logf("hits %d, misses %d, stale %d", hits.Load(), misses.Load(), tbl.Stale())
	if tbl.Stale() != misses.Load() {
		t.Errorf("Stale() = %d, counted %d", tbl.Stale(), misses.Load())
	}
}
