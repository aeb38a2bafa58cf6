package soft

import (
	"fmt"
	"math/rand/v2"
	"sync"
	"sync/atomic"

	"github.com/rdmavisor/rdmavisor/internal/verbs"
)

// A key is a 24-bit index into the device's table and an 8-bit tag, as
// mlx5's are. The tag is drawn at random, never the one the index had
// before, so a stale key fails as on hardware instead of reaching a new
// region, and a key is not the previous one plus one.
//
// Regions and memory windows have a table each, over halves of the index
// space (as rxe gives MRs and MWs index ranges of their own), so the index
// of a remote key says which table to look in.
const (
	keyChunkBits = 12
	keyChunkLen  = 1 << keyChunkBits
	keyChunks    = 1 << (24 - keyChunkBits)

	mwIndexBase = 1 << 23 // indices of memory windows; those below are MRs'
)

// isMWKey reports whether a key is a memory window's.
func isMWKey(key uint32) bool { return key>>8 >= mwIndexBase }

// keyed is what a key table holds: a region or a window, which knows its
// current key (a window's low 8 bits change with every bind).
type keyed[T any] interface {
	*T
	keyOf() uint32
	setKey(uint32)
}

type keyChunk[T any] [keyChunkLen]atomic.Pointer[T]

// keyTable maps keys to regions or windows: fixed chunks of slots, so
// registering and deregistering write one slot (never a copy of the table,
// however many entries there are) while every packet reads it without a
// lock. The zero value gives MR indices; windows' tables start at
// mwIndexBase (first).
type keyTable[T any, P keyed[T]] struct {
	chunks [keyChunks]atomic.Pointer[keyChunk[T]]

	first, limit uint32 // index range; zero: [1, mwIndexBase)

	mu   sync.Mutex
	next uint32   // the next index never used; guarded by mu
	free []uint32 // keys whose index is free again, oldest first; guarded by mu
}

type (
	mrKeys = keyTable[mr, *mr]
	mwKeys = keyTable[mw, *mw]
)

func (t *keyTable[T, P]) bounds() (first, limit uint32) {
	if t.limit == 0 {
		return 1, mwIndexBase // key 0 is never valid
	}
	return t.first, t.limit
}

// add gives m a key and makes it reachable by it.
func (t *keyTable[T, P]) add(m P) error {
	t.mu.Lock()
	defer t.mu.Unlock()
	first, limit := t.bounds()
	var idx, tag uint32
	if len(t.free) > 0 {
		old := t.free[0]
		t.free = t.free[1:]
		idx = old >> 8
		if tag = uint32(rand.IntN(255)); tag >= old&0xff {
			tag++
		}
	} else {
		if t.next < first {
			t.next = first
		}
		if t.next >= limit {
			return fmt.Errorf("soft: %w: %d keys", verbs.ErrNoResources, limit-first)
		}
		idx, tag = t.next, uint32(rand.IntN(256))
		t.next++
	}
	c := t.chunks[idx>>keyChunkBits].Load()
	if c == nil {
		c = new(keyChunk[T])
		t.chunks[idx>>keyChunkBits].Store(c)
	}
	m.setKey(idx<<8 | tag)
	c[idx&(keyChunkLen-1)].Store((*T)(m))
	return nil
}

// remove makes m unreachable by its key and frees its index.
func (t *keyTable[T, P]) remove(m P) {
	key := m.keyOf()
	idx := key >> 8
	t.mu.Lock()
	defer t.mu.Unlock()
	if c := t.chunks[idx>>keyChunkBits].Load(); c != nil {
		c[idx&(keyChunkLen-1)].CompareAndSwap((*T)(m), nil)
	}
	t.free = append(t.free, key)
}

// at returns the live entry at a key's index, whatever its tag.
func (t *keyTable[T, P]) at(idx uint32) P {
	if idx >= 1<<24 {
		return nil
	}
	c := t.chunks[idx>>keyChunkBits].Load()
	if c == nil {
		return nil
	}
	return c[idx&(keyChunkLen-1)].Load()
}

// lookup returns the live entry with exactly this key.
func (t *keyTable[T, P]) lookup(key uint32) P {
	m := t.at(key >> 8)
	if m == nil || m.keyOf() != key {
		return nil
	}
	return m
}
