package vqpn

import (
	"errors"
	"math/rand/v2"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
)

// owner is a vconn in the stress test. Owners are never reused, so a Lookup
// that returns one can be checked against the ID it was looked up by.
type owner struct {
	id  atomic.Uint32 // its ID, set by the allocating worker after Alloc
	inc uint32        // how many times its vQPN had been allocated, itself included
}

// published is an ID handed to "completion" goroutines.
type published struct {
	id       ID
	owner    *owner
	released atomic.Bool // set after Release returned
}

// TestStress runs workers that allocate, look up and release IDs while
// completers look up recently published IDs, live and stale.
//
// In "growing" the table never wraps a generation (each vQPN is allocated
// fewer than 255 times, asserted), so the check is exact: a Lookup returns
// the value an ID was allocated with, and only before its Release returned.
// In "full with wraps" the table runs at capacity with Alloc hitting
// ErrFull and generations wrapping; a Lookup must still never return an owner
// whose ID differs from the one looked up, and any return of an owner other
// than the published one must be a full 255-allocation wrap (the documented
// alias), which is counted and logged.
func TestStress(t *testing.T) {
	ops := 3000
	if testing.Short() {
		ops = 500
	}
	tests := []struct {
		name     string
		capacity int
		shift    uint32
		reuse    uint32
		maxHeld  int
		strict   bool
	}{
		{"growing", 4096, 4, 128, 24, true},
		{"full with wraps", 32, 4, 4, 8, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			stress(t, newTable[owner](tt.capacity, tt.shift, tt.reuse), ops, tt.maxHeld, tt.strict)
		})
	}
}

func stress(t *testing.T, tbl *Table[owner], ops, maxHeld int, strict bool) {
	const (
		workers    = 8
		completers = 4
		ringSize   = 256
	)
	var (
		ring     [ringSize]atomic.Pointer[published]
		ringNext atomic.Uint32
		owned    = make([]atomic.Bool, tbl.Cap()+1)   // vQPN has a live owner
		allocs   = make([]atomic.Uint32, tbl.Cap()+1) // allocations per vQPN
		misses   atomic.Uint64                        // failed Lookups made by the test
		aliases  atomic.Uint64
		full     atomic.Uint64
		stop     atomic.Bool
		held     = make([][]*published, workers)
	)
	fail := func(format string, args ...any) {
		t.Errorf(format, args...)
		stop.Store(true)
	}

	release := func(p *published) {
		v := p.id.VQPN()
		if !owned[v].CompareAndSwap(true, false) {
			fail("releasing %v: vQPN not marked owned", p.id)
		}
		if err := tbl.Release(p.id); err != nil {
			fail("Release(%v) = %v", p.id, err)
		}
		p.released.Store(true)
	}

	var wg, cg sync.WaitGroup
	for w := range workers {
		wg.Go(func() {
			rng := rand.New(rand.NewPCG(uint64(w), 1))
			var mine []*published
			var lastReleased *published
			for i := 0; i < ops && !stop.Load(); i++ {
				switch {
				case len(mine) < maxHeld && (len(mine) == 0 || rng.IntN(2) == 0):
					o := &owner{}
					id, err := tbl.Alloc(o)
					if errors.Is(err, ErrFull) {
						full.Add(1)
						continue
					}
					if err != nil {
						fail("Alloc: %v", err)
						return
					}
					v := id.VQPN()
					if !owned[v].CompareAndSwap(false, true) {
						fail("Alloc handed out %v while its vQPN is owned", id)
						return
					}
					n := allocs[v].Add(1)
					if want := Gen((n-1)%255 + 1); id.Gen() != want {
						fail("allocation %d of vQPN %#x got gen %d, want %d", n, v, id.Gen(), want)
					}
					o.inc = n
					o.id.Store(uint32(id))
					p := &published{id: id, owner: o}
					mine = append(mine, p)
					ring[ringNext.Add(1)%ringSize].Store(p)
				default:
					k := rng.IntN(len(mine))
					p := mine[k]
					mine[k] = mine[len(mine)-1]
					mine = mine[:len(mine)-1]
					release(p)
					lastReleased = p
				}
				// Own live IDs always resolve to their owner.
				if len(mine) > 0 {
					p := mine[rng.IntN(len(mine))]
					if got, ok := tbl.Lookup(p.id); !ok || got != p.owner {
						fail("Lookup of live %v = %p, %v; want %p", p.id, got, ok, p.owner)
					}
				}
				// An ID this worker released fails (no wrap when strict).
				if strict && lastReleased != nil {
					if got, ok := tbl.Lookup(lastReleased.id); ok {
						fail("Lookup of released %v returned %p", lastReleased.id, got)
					} else {
						misses.Add(1)
					}
				}
			}
			held[w] = mine
		})
	}
	for c := range completers {
		cg.Go(func() {
			rng := rand.New(rand.NewPCG(uint64(c), 2))
			for !stop.Load() {
				p := ring[rng.IntN(ringSize)].Load()
				if p == nil {
					runtime.Gosched()
					continue
				}
				wasReleased := p.released.Load()
				got, ok := tbl.Lookup(p.id)
				if !ok {
					misses.Add(1)
					continue
				}
				if got == p.owner {
					if wasReleased {
						fail("Lookup of %v after its Release returned the old owner", p.id)
					}
					continue
				}
				// Another owner: only a full generation wrap may do that.
				if strict {
					fail("stale %v returned a new owner (inc %d, published inc %d)", p.id, got.inc, p.owner.inc)
					continue
				}
				gotID := got.id.Load()
				for gotID == 0 && !stop.Load() { // its worker is between Alloc and Store
					runtime.Gosched()
					gotID = got.id.Load()
				}
				if ID(gotID) != p.id {
					fail("Lookup(%v) returned the owner of %v", p.id, ID(gotID))
				} else if (got.inc-p.owner.inc)%255 != 0 {
					fail("Lookup(%v) returned allocation %d of its vQPN, published was %d", p.id, got.inc, p.owner.inc)
				} else {
					aliases.Add(1)
				}
			}
		})
	}
	wg.Wait()
	stop.Store(true)
	cg.Wait()
	if t.Failed() {
		return
	}

	var nheld int
	for _, mine := range held {
		nheld += len(mine)
	}
	if tbl.Len() != nheld {
		t.Errorf("Len = %d, workers hold %d", tbl.Len(), nheld)
	}
	if got, want := tbl.Stale(), misses.Load(); got != want {
		t.Errorf("Stale() = %d, test counted %d failed Lookups", got, want)
	}
	var maxAllocs uint32
	for v := range allocs {
		maxAllocs = max(maxAllocs, allocs[v].Load())
	}
	if strict && maxAllocs >= 255 {
		t.Errorf("a vQPN was allocated %d times: generations wrapped, exact check invalid", maxAllocs)
	}
	t.Logf("hwm %d, max allocations of one vQPN %d, stale lookups %d, aliases after wrap %d, ErrFull %d",
		tbl.hwm, maxAllocs, tbl.Stale(), aliases.Load(), full.Load())

	for _, mine := range held {
		for _, p := range mine {
			release(p)
		}
	}
	if tbl.Len() != 0 {
		t.Errorf("Len = %d after releasing all", tbl.Len())
	}
	checkFreeList(t, tbl)
}

// checkFreeList verifies the allocator's invariants: the free list holds
// exactly the non-live slots up to the high-water mark, each once.
func checkFreeList[T any](t *testing.T, tbl *Table[T]) {
	t.Helper()
	tbl.mu.Lock()
	defer tbl.mu.Unlock()
	seen := make(map[uint32]bool)
	last := uint32(0)
	for v := tbl.freeHead; v != 0; v = stateNext(tbl.slot(v).state.Load()) {
		if seen[v] || v > tbl.hwm {
			t.Fatalf("free list revisits or overruns at %d", v)
		}
		seen[v] = true
		if tbl.slot(v).state.Load()&liveBit != 0 || tbl.slot(v).val.Load() != nil {
			t.Fatalf("free vQPN %d is live or holds a value", v)
		}
		last = v
	}
	if last != tbl.freeTail || uint32(len(seen)) != tbl.freeLen {
		t.Fatalf("free list: tail %d (walked to %d), len %d (walked %d)", tbl.freeTail, last, tbl.freeLen, len(seen))
	}
	if int(tbl.freeLen)+tbl.Len() != int(tbl.hwm) {
		t.Fatalf("free %d + live %d != hwm %d", tbl.freeLen, tbl.Len(), tbl.hwm)
	}
}
