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
const (
	keyChunkBits = 12
	keyChunkLen  = 1 << keyChunkBits
	keyChunks    = 1 << (24 - keyChunkBits)
)

type keyChunk [keyChunkLen]atomic.Pointer[mr]

// keyTable maps keys to regions: fixed chunks of slots, so registering
// and deregistering write one slot (never a copy of the table, however
// many regions there are) while every packet reads it without a lock.
type keyTable struct {
	chunks [keyChunks]atomic.Pointer[keyChunk]

	mu   sync.Mutex
	next uint32   // the next index never used; guarded by mu
	free []uint32 // keys whose index is free again, oldest first; guarded by mu
}

// add gives m a key and makes it reachable by it.
func (t *keyTable) add(m *mr) error {
	t.mu.Lock()
	defer t.mu.Unlock()
	var idx, tag uint32
	if len(t.free) > 0 {
		old := t.free[0]
		t.free = t.free[1:]
		idx = old >> 8
		if tag = uint32(rand.IntN(255)); tag >= old&0xff {
			tag++
		}
	} else {
		if t.next == 0 {
			t.next = 1 // key 0 is never valid
		}
		if t.next >= 1<<24 {
			return fmt.Errorf("soft: reg mr: %w: 2^24 regions", verbs.ErrNoResources)
		}
		idx, tag = t.next, uint32(rand.IntN(256))
		t.next++
	}
	c := t.chunks[idx>>keyChunkBits].Load()
	if c == nil {
		c = new(keyChunk)
		t.chunks[idx>>keyChunkBits].Store(c)
	}
	m.key = idx<<8 | tag
	c[idx&(keyChunkLen-1)].Store(m)
	return nil
}

// remove makes m unreachable by its key and frees its index.
func (t *keyTable) remove(m *mr) {
	idx := m.key >> 8
	t.mu.Lock()
	defer t.mu.Unlock()
	if c := t.chunks[idx>>keyChunkBits].Load(); c != nil {
		c[idx&(keyChunkLen-1)].CompareAndSwap(m, nil)
	}
	t.free = append(t.free, m.key)
}

// lookup returns the live region with exactly this key.
func (t *keyTable) lookup(key uint32) *mr {
	idx := key >> 8
	c := t.chunks[idx>>keyChunkBits].Load()
	if c == nil {
		return nil
	}
	m := c[idx&(keyChunkLen-1)].Load()
	if m == nil || m.key != key {
		return nil
	}
	return m
}
