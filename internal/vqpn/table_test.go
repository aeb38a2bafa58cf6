package vqpn

import (
	"errors"
	"sync/atomic"
	"testing"
	"unsafe"
)

type conn struct{ name string }

func mustAlloc[T any](t *testing.T, tb *Table[T], v *T) ID {
	t.Helper()
	id, err := tb.Alloc(v)
	if err != nil {
		t.Fatalf("Alloc: %v", err)
	}
	return id
}

func TestTableBasics(t *testing.T) {
	tb := New[conn](100)
	if tb.Cap() != 100 || tb.Len() != 0 || tb.Stale() != 0 {
		t.Fatalf("new table: Cap %d Len %d Stale %d", tb.Cap(), tb.Len(), tb.Stale())
	}
	a, b := &conn{"a"}, &conn{"b"}
	ida := mustAlloc(t, tb, a)
	idb := mustAlloc(t, tb, b)
	if ida != MakeID(1, 1) || idb != MakeID(2, 1) {
		t.Fatalf("first IDs = %v, %v; want 0x000001/1, 0x000002/1", ida, idb)
	}
	if tb.Len() != 2 {
		t.Fatalf("Len = %d, want 2", tb.Len())
	}
	if p, ok := tb.Lookup(ida); !ok || p != a {
		t.Fatalf("Lookup(%v) = %p, %v; want a", ida, p, ok)
	}
	if p, ok := tb.Lookup(FromImm(Imm(idb))); !ok || p != b {
		t.Fatalf("Lookup by imm = %p, %v; want b", p, ok)
	}
	if id, _ := SplitWRID(WRID(idb, 42)); id != idb {
		t.Fatalf("wr_id round trip")
	}
	if tb.Stale() != 0 {
		t.Fatalf("Stale = %d after live lookups", tb.Stale())
	}
	if err := tb.Release(ida); err != nil {
		t.Fatalf("Release: %v", err)
	}
	if p, ok := tb.Lookup(ida); ok || p != nil {
		t.Fatalf("Lookup of released ID = %p, %v", p, ok)
	}
	if tb.Stale() != 1 || tb.Len() != 1 {
		t.Fatalf("Stale %d Len %d, want 1 1", tb.Stale(), tb.Len())
	}
	if err := tb.Release(ida); !errors.Is(err, ErrStale) {
		t.Fatalf("double Release = %v, want ErrStale", err)
	}
	if _, err := tb.Alloc(nil); !errors.Is(err, ErrNilValue) {
		t.Fatalf("Alloc(nil) = %v, want ErrNilValue", err)
	}
}

// IDs that are not live fail Lookup (counted) and Release (ErrStale).
func TestNotLive(t *testing.T) {
	tb := newTable[conn](10000, 4, MinReuseDistance)
	c := &conn{}
	live := mustAlloc(t, tb, c)
	released := mustAlloc(t, tb, c)
	if err := tb.Release(released); err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name string
		id   ID
	}{
		{"zero", 0},
		{"zero wr_id", func() ID { id, _ := SplitWRID(0); return id }()},
		{"vQPN 0 gen 1", MakeID(0, 1)},
		{"live vQPN gen 0", MakeID(live.VQPN(), 0)},
		{"live vQPN next gen", MakeID(live.VQPN(), live.Gen()+1)},
		{"live vQPN gen 255", MakeID(live.VQPN(), 255)},
		{"released", released},
		{"allocated page, never allocated", MakeID(3, 1)},
		{"unallocated page", MakeID(5000, 1)},
		{"capacity", MakeID(10000, 1)},
		{"beyond capacity", MakeID(10001, 1)},
		{"max vQPN", MakeID(MaxVQPN, 255)},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			before := tb.Stale()
			if p, ok := tb.Lookup(tt.id); ok || p != nil {
				t.Errorf("Lookup(%v) = %p, true", tt.id, p)
			}
			if tb.Stale() != before+1 {
				t.Errorf("Stale went %d -> %d, want +1", before, tb.Stale())
			}
			if err := tb.Release(tt.id); !errors.Is(err, ErrStale) {
				t.Errorf("Release(%v) = %v, want ErrStale", tt.id, err)
			}
		})
	}
	if p, ok := tb.Lookup(live); !ok || p != c || tb.Len() != 1 {
		t.Fatalf("live ID disturbed: %p %v Len %d", p, ok, tb.Len())
	}
}

func TestFull(t *testing.T) {
	for _, capacity := range []int{1, 2, 7, 100} {
		tb := New[int](capacity)
		vals := make([]int, capacity)
		ids := make([]ID, capacity)
		for i := range vals {
			ids[i] = mustAlloc(t, tb, &vals[i])
			if ids[i].VQPN() != VQPN(i+1) {
				t.Fatalf("cap %d: alloc %d got %v", capacity, i, ids[i])
			}
		}
		if _, err := tb.Alloc(new(int)); !errors.Is(err, ErrFull) {
			t.Fatalf("cap %d: Alloc when full = %v, want ErrFull", capacity, err)
		}
		if err := tb.Release(ids[capacity/2]); err != nil {
			t.Fatal(err)
		}
		id := mustAlloc(t, tb, new(int))
		if id.VQPN() != ids[capacity/2].VQPN() || id.Gen() != 2 {
			t.Fatalf("cap %d: realloc got %v, want vQPN %#x gen 2", capacity, id, ids[capacity/2].VQPN())
		}
		if tb.Len() != capacity {
			t.Fatalf("Len %d, want %d", tb.Len(), capacity)
		}
	}
}

func TestMaxCapacity(t *testing.T) {
	tb := New[int](MaxCapacity)
	if tb.Cap() != MaxCapacity {
		t.Fatalf("Cap = %d", tb.Cap())
	}
	if n := len(tb.pages); n != 4096 {
		t.Fatalf("directory has %d pages, want 4096", n)
	}
	id := mustAlloc(t, tb, new(int))
	if _, ok := tb.Lookup(MakeID(MaxVQPN, 1)); ok {
		t.Fatal("Lookup of max vQPN in an empty page succeeded")
	}
	if _, ok := tb.Lookup(id); !ok {
		t.Fatal("Lookup failed")
	}
	for _, bad := range []int{0, -1, MaxCapacity + 1} {
		func() {
			defer func() {
				if recover() == nil {
					t.Errorf("New(%d) did not panic", bad)
				}
			}()
			New[int](bad)
		}()
	}
}

// When the table is at capacity, released vQPNs come back oldest first.
func TestFIFOReuse(t *testing.T) {
	tb := New[int](4)
	v := new(int)
	var ids [5]ID
	for i := 1; i <= 4; i++ {
		ids[i] = mustAlloc(t, tb, v)
	}
	for _, i := range []int{2, 4, 1} {
		if err := tb.Release(ids[i]); err != nil {
			t.Fatal(err)
		}
	}
	for _, want := range []VQPN{2, 4, 1} {
		if id := mustAlloc(t, tb, v); id.VQPN() != want || id.Gen() != 2 {
			t.Fatalf("reuse got %v, want vQPN %d gen 2", id, want)
		}
	}
	// Free list empty again: releases after a drain still queue in order.
	if err := tb.Release(MakeID(3, 1)); err != nil {
		t.Fatal(err)
	}
	if err := tb.Release(MakeID(1, 2)); err != nil {
		t.Fatal(err)
	}
	for _, want := range []ID{MakeID(3, 2), MakeID(1, 3)} {
		if id := mustAlloc(t, tb, v); id != want {
			t.Fatalf("got %v, want %v", id, want)
		}
	}
}

// While the table can grow, a released vQPN waits until MinReuseDistance
// vQPNs are free.
func TestReuseDistance(t *testing.T) {
	const reuse = 8
	tb := newTable[int](1000, maxPageShift, reuse)
	v := new(int)
	first := mustAlloc(t, tb, v)
	if err := tb.Release(first); err != nil {
		t.Fatal(err)
	}
	var released []ID
	released = append(released, first)
	// Alloc+Release in a loop: fresh vQPNs until `reuse` are free.
	for i := 0; i < reuse-1; i++ {
		id := mustAlloc(t, tb, v)
		if id.Gen() != 1 {
			t.Fatalf("alloc %d reused %v before %d were free", i, id, reuse)
		}
		released = append(released, id)
		if err := tb.Release(id); err != nil {
			t.Fatal(err)
		}
	}
	// Now `reuse` are free: reuse starts, oldest first.
	for _, old := range released {
		id := mustAlloc(t, tb, v)
		if id.VQPN() != old.VQPN() || id.Gen() != 2 {
			t.Fatalf("got %v, want reuse of %v", id, old)
		}
		if err := tb.Release(id); err != nil {
			t.Fatal(err)
		}
	}
	if tb.hwm != reuse {
		t.Fatalf("high-water mark %d, want %d", tb.hwm, reuse)
	}
}

// A single vQPN reused 600 times walks generations 1..255, 1..255, ...;
// every older ID in the last 254 fails.
func TestGenerationWrap(t *testing.T) {
	tb := New[int](1)
	vals := make([]int, 600)
	var history []ID
	want := Gen(1)
	for i := range vals {
		id := mustAlloc(t, tb, &vals[i])
		if id.VQPN() != 1 || id.Gen() != want {
			t.Fatalf("alloc %d = %v, want gen %d", i, id, want)
		}
		want = want.next()
		if p, ok := tb.Lookup(id); !ok || p != &vals[i] {
			t.Fatalf("alloc %d: live Lookup failed", i)
		}
		// The previous 254 IDs are distinct from id and must fail.
		for j := max(0, len(history)-254); j < len(history); j++ {
			if p, ok := tb.Lookup(history[j]); ok {
				t.Fatalf("alloc %d: stale %v returned %p (owner %d)", i, history[j], p, i)
			}
		}
		history = append(history, id)
		if err := tb.Release(id); err != nil {
			t.Fatal(err)
		}
	}
}

func TestPagesGrowLazily(t *testing.T) {
	tb := newTable[int](100000, 4, 1) // 16-slot pages, reuse as soon as one is free
	v := new(int)
	countPages := func() int {
		n := 0
		for i := range tb.pages {
			if tb.pages[i].Load() != nil {
				n++
			}
		}
		return n
	}
	if countPages() != 0 {
		t.Fatal("New allocated slots")
	}
	var ids []ID
	for range 40 { // vQPNs 1..40: pages 0, 1, 2
		ids = append(ids, mustAlloc(t, tb, v))
	}
	if n := countPages(); n != 3 {
		t.Fatalf("%d pages after 40 allocs, want 3", n)
	}
	p0 := tb.pages[0].Load()
	for _, id := range ids {
		if err := tb.Release(id); err != nil {
			t.Fatal(err)
		}
	}
	for range 40 {
		mustAlloc(t, tb, v)
	}
	if n := countPages(); n != 3 || tb.pages[0].Load() != p0 {
		t.Fatalf("reuse grew or moved pages: %d pages", n)
	}
}

// The engine's budget is 512 bytes of agent memory per vconn; a slot here
// must stay at 16.
func TestBytesPerEntry(t *testing.T) {
	const slotBytes = 16
	if n := unsafe.Sizeof(entry[conn]{}); n != slotBytes {
		t.Fatalf("entry is %d bytes, want %d", n, slotBytes)
	}
	dir := unsafe.Sizeof(atomic.Pointer[page[int]]{})
	perSlot := float64(slotBytes) + float64(dir)/(1<<maxPageShift)
	t.Logf("bytes per slot: %d (value pointer 8 + state 8) + %.4f directory", slotBytes, perSlot-slotBytes)

	// Measured: a table of full capacity with 100k vconns.
	const n = 100000
	vals := make([]int, n)
	tbl := New[int](MaxCapacity)
	for i := range vals {
		mustAlloc(t, tbl, &vals[i])
	}
	pages := 0
	for i := range tbl.pages {
		if pg := tbl.pages[i].Load(); pg != nil {
			pages += len(pg.e)
		}
	}
	bytes := uintptr(pages)*slotBytes + uintptr(len(tbl.pages))*dir
	t.Logf("%d vconns in a table of capacity %d: %d bytes, %.1f per vconn", n, MaxCapacity, bytes, float64(bytes)/n)
	if per := float64(bytes) / n; per > 17 {
		t.Errorf("%.1f bytes per vconn, want <= 17", per)
	}
}

func TestLookupAllocs(t *testing.T) {
	tbl := New[conn](1000)
	c := &conn{}
	live := mustAlloc(t, tbl, c)
	stale := mustAlloc(t, tbl, c)
	if err := tbl.Release(stale); err != nil {
		t.Fatal(err)
	}
	for _, tt := range []struct {
		name string
		id   ID
	}{{"live", live}, {"stale", stale}, {"invalid", 0}, {"out of range", MakeID(MaxVQPN, 1)}} {
		n := testing.AllocsPerRun(1000, func() { tbl.Lookup(tt.id) })
		if n != 0 {
			t.Errorf("Lookup(%s) allocates %v per run", tt.name, n)
		}
	}
}

func TestAllocReleaseAllocs(t *testing.T) {
	for _, tt := range []struct {
		name string
		tbl  *Table[conn]
		warm int
	}{
		{"at capacity", New[conn](64), 64},
		{"growable, past reuse distance", New[conn](MaxCapacity), MinReuseDistance + 10},
	} {
		t.Run(tt.name, func(t *testing.T) {
			c := &conn{}
			// Warm up: allocate every page steady state will touch.
			ids := make([]ID, tt.warm)
			for i := range ids {
				ids[i] = mustAlloc(t, tt.tbl, c)
			}
			for _, id := range ids {
				if err := tt.tbl.Release(id); err != nil {
					t.Fatal(err)
				}
			}
			n := testing.AllocsPerRun(1000, func() {
				id, err := tt.tbl.Alloc(c)
				if err != nil {
					t.Fatal(err)
				}
				if err := tt.tbl.Release(id); err != nil {
					t.Fatal(err)
				}
			})
			if n != 0 {
				t.Errorf("Alloc+Release allocates %v per run in steady state", n)
			}
		})
	}
}

func FuzzLookup(f *testing.F) {
	for _, raw := range []uint32{0, 1, 0x101, 0x102, 0x201, 0xFFFFFFFF, 0x1000001} {
		f.Add(raw)
	}
	f.Fuzz(func(t *testing.T, raw uint32) {
		tbl := newTable[int](300, 4, 2)
		v := new(int)
		live := make(map[ID]bool)
		for i := range 40 {
			id := mustAlloc(t, tbl, v)
			live[id] = true
			if i%3 == 0 {
				delete(live, id)
				if err := tbl.Release(id); err != nil {
					t.Fatal(err)
				}
			}
		}
		id := FromImm(raw)
		p, ok := tbl.Lookup(id)
		if ok != live[id] || (ok && p != v) {
			t.Fatalf("Lookup(%v) = %p, %v; live %v", id, p, ok, live[id])
		}
		if err := tbl.Release(id); (err == nil) != live[id] {
			t.Fatalf("Release(%v) = %v; live %v", id, err, live[id])
		}
	})
}
