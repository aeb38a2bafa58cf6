package vqpn

import (
	"fmt"
	"math/bits"
	"sync"
	"sync/atomic"
)

// MinReuseDistance is how many vQPNs must be free before a released vQPN is
// reused, while the table can still grow. See the package doc.
const MinReuseDistance = 1024

// maxPageShift makes pages of 4096 slots (64 KiB).
const maxPageShift = 12

// The state word of a slot. All writes happen under Table.mu; Lookup reads
// it with atomic loads.
//
//	| 63 ....... 33 | 32 ...... 9 |  8   | 7 ... 0 |
//	| version (31)  | next (24)   | live | gen (8) |
//
// gen is the generation of the current (live) or last (free) owner, 0 for a
// slot never allocated. next links free slots in FIFO order (0 ends the
// list, since vQPN 0 is never a slot) and is 0 while live. version is bumped
// by every Alloc and Release of the slot, never by a change of next.
const (
	liveBit      = 1 << genBits
	nextShift    = genBits + 1
	nextMask     = uint64(MaxVQPN) << nextShift
	versionShift = nextShift + 24
)

func stateGen(s uint64) Gen        { return Gen(s & genMask) }
func stateNext(s uint64) uint32    { return uint32((s & nextMask) >> nextShift) }
func stateVersion(s uint64) uint64 { return s >> versionShift }

func makeState(version uint64, live bool, next uint32, g Gen) uint64 {
	s := version<<versionShift | uint64(next)<<nextShift | uint64(g)
	if live {
		s |= liveBit
	}
	return s
}

// entry is one slot: 16 bytes.
type entry[T any] struct {
	val   atomic.Pointer[T]
	state atomic.Uint64
}

type page[T any] struct {
	e []entry[T]
}

// cacheLine separates the fields Lookup reads from those it and Alloc write.
const cacheLine = 64

// Table maps live IDs to values of type T. The zero value is not usable;
// create one with New. See the package doc for the concurrency contracts.
type Table[T any] struct {
	// Read-only after New.
	pages    []atomic.Pointer[page[T]] // set once each, under mu
	capacity uint32
	shift    uint32
	mask     uint32
	reuse    uint32 // MinReuseDistance, smaller in tests

	_     [cacheLine]byte
	stale atomic.Uint64
	_     [cacheLine - 8]byte

	live atomic.Int64 // written under mu

	mu       sync.Mutex // guards the fields below and all writes to slots
	hwm      uint32     // highest vQPN ever allocated
	freeHead uint32     // oldest released vQPN, 0 if none
	freeTail uint32     // newest released vQPN, 0 if none
	freeLen  uint32
}

// New returns a table for vQPNs 1..capacity. It allocates only its page
// directory (8 bytes per 4096 slots of capacity); slots are allocated as
// Alloc needs them. New panics if capacity is not in 1..MaxCapacity.
func New[T any](capacity int) *Table[T] {
	return newTable[T](capacity, maxPageShift, MinReuseDistance)
}

func newTable[T any](capacity int, maxShift uint32, reuse uint32) *Table[T] {
	if capacity < 1 || capacity > MaxCapacity {
		panic(fmt.Sprintf("vqpn: capacity %d out of range 1..%d", capacity, MaxCapacity))
	}
	// A table smaller than a page gets a single page just big enough for
	// indexes 0..capacity.
	shift := min(maxShift, uint32(bits.Len(uint(capacity))))
	return &Table[T]{
		pages:    make([]atomic.Pointer[page[T]], capacity>>shift+1),
		capacity: uint32(capacity),
		shift:    shift,
		mask:     1<<shift - 1,
		reuse:    reuse,
	}
}

// Lookup returns the value of a live ID. It fails, and counts the failure
// in Stale, if id's vQPN is free, out of range or 0, or its generation is
// not the live one. It is wait-free and allocates nothing.
func (t *Table[T]) Lookup(id ID) (*T, bool) {
	v := uint32(id.VQPN())
	// v-1 wraps for v == 0, so one comparison rejects 0 and > capacity.
	if v-1 < t.capacity {
		if pg := t.pages[v>>t.shift].Load(); pg != nil {
			e := &pg.e[v&t.mask]
			s := e.state.Load()
			if s&(liveBit|genMask) == liveBit|uint64(id.Gen()) {
				p := e.val.Load()
				// Unchanged state: p was stored by the Alloc that
				// made s (Alloc stores the value before the state)
				// and not yet cleared by a Release.
				if e.state.Load() == s {
					return p, true
				}
			}
		}
	}
	t.stale.Add(1)
	return nil, false
}

// Stale returns how many Lookups have failed: completions that found no live
// owner and were dropped.
func (t *Table[T]) Stale() uint64 { return t.stale.Load() }

// Len returns the number of live IDs.
func (t *Table[T]) Len() int { return int(t.live.Load()) }

// Cap returns the table's capacity: the largest vQPN it can allocate.
func (t *Table[T]) Cap() int { return int(t.capacity) }

// Alloc makes val live under a new ID and returns it: the oldest released
// vQPN when enough are free (see MinReuseDistance), else one never used,
// with the generation after its last. It returns ErrFull when every vQPN is
// live and ErrNilValue for a nil val. In steady state (no new page needed)
// it allocates nothing.
func (t *Table[T]) Alloc(val *T) (ID, error) {
	if val == nil {
		return 0, fmt.Errorf("vqpn: alloc: %w", ErrNilValue)
	}
	t.mu.Lock()
	defer t.mu.Unlock()

	var v uint32
	switch {
	case t.freeLen > 0 && (t.freeLen >= t.reuse || t.hwm == t.capacity):
		v = t.freeHead
		e := t.slot(v)
		t.freeHead = stateNext(e.state.Load())
		if t.freeHead == 0 {
			t.freeTail = 0
		}
		t.freeLen--
	case t.hwm < t.capacity:
		v = t.hwm + 1
		if pi := v >> t.shift; t.pages[pi].Load() == nil {
			// The last page holds only up to vQPN capacity.
			n := min(1<<t.shift, int(t.capacity)+1-int(pi<<t.shift))
			t.pages[pi].Store(&page[T]{e: make([]entry[T], n)})
		}
		t.hwm = v
	default:
		return 0, fmt.Errorf("vqpn: alloc: all %d vQPNs live: %w", t.capacity, ErrFull)
	}

	e := t.slot(v)
	s := e.state.Load()
	g := stateGen(s).next()
	// Value first, then the state that makes it visible (see Lookup).
	e.val.Store(val)
	e.state.Store(makeState(stateVersion(s)+1, true, 0, g))
	t.live.Add(1)
	return MakeID(VQPN(v), g), nil
}

// Release makes id free; Lookups that start after it returns fail for id.
// The vQPN is queued for reuse with a new generation. Release returns
// ErrStale if id is not live (released already, an older generation, never
// allocated, or out of range).
func (t *Table[T]) Release(id ID) error {
	v := uint32(id.VQPN())
	t.mu.Lock()
	defer t.mu.Unlock()

	if v == 0 || v > t.hwm {
		return fmt.Errorf("vqpn: release %v: vQPN never allocated: %w", id, ErrStale)
	}
	e := t.slot(v)
	s := e.state.Load()
	if s&liveBit == 0 {
		return fmt.Errorf("vqpn: release %v: already free: %w", id, ErrStale)
	}
	if g := stateGen(s); g != id.Gen() {
		return fmt.Errorf("vqpn: release %v: live generation is %d: %w", id, g, ErrStale)
	}
	// State first, so a Lookup that reads the cleared value also sees
	// the state change and fails.
	e.state.Store(makeState(stateVersion(s)+1, false, 0, stateGen(s)))
	e.val.Store(nil)

	if t.freeTail == 0 {
		t.freeHead = v
	} else {
		te := t.slot(t.freeTail)
		ts := te.state.Load()
		te.state.Store(ts&^nextMask | uint64(v)<<nextShift)
	}
	t.freeTail = v
	t.freeLen++
	t.live.Add(-1)
	return nil
}

// slot returns the slot of an allocated vQPN (1..hwm). Caller holds mu.
func (t *Table[T]) slot(v uint32) *entry[T] {
	return &t.pages[v>>t.shift].Load().e[v&t.mask]
}
