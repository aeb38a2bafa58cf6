package wire

import (
	"sync"

	"github.com/rdmavisor/rdmavisor/internal/verbs"
)

// Buffer size classes: control packets (ACKs, NAKs, small sends) take the
// small class so a queue full of them does not pin 4 KiB each.
const (
	smallBuf   = 256
	poolRetain = 1 << 14 // free buffers a pool keeps per class; more go to the GC
	cacheBatch = 32      // buffers moved between a local cache and the pool at once
)

// pbuf is a packet in a pool-owned buffer. At any time exactly one party
// owns it: a sender's cache, a fault model (held or scheduled), a receive
// queue, or a receiver's cache. Whoever owns it may touch its fields, except
// idx, owner and gen, which only the scheduler's lock guards.
type pbuf struct {
	b        []byte // len is the class size
	n        int
	src, dst verbs.GID
	class    uint8

	// Fault model state, guarded by the owning faulter's lock.
	next *pbuf // held list
	held bool
	kind uint8 // schedHold or schedDelay

	// Scheduler state, guarded by sched.mu.
	due   int64
	seq   uint64
	idx   int // heap index; or idxNone, idxFired, idxCancelled
	owner *faulter
}

func (b *pbuf) data() []byte { return b.b[:b.n] }

// pool is a bounded free list of pbufs in two size classes. It never blocks:
// when empty it allocates, and beyond poolRetain free buffers per class it
// lets the GC have them.
type pool struct {
	mu   sync.Mutex
	free [2][]*pbuf // guarded by mu
}

func classOf(n int) uint8 {
	if n <= smallBuf {
		return 0
	}
	return 1
}

func newPbuf(class uint8) *pbuf {
	size := smallBuf
	if class == 1 {
		size = MaxPacketLen
	}
	return &pbuf{b: make([]byte, size), class: class, idx: idxNone}
}

// fill moves up to cacheBatch free buffers of class into dst (a local cache,
// empty on entry) and returns it; it allocates the ones it lacks.
func (p *pool) fill(class uint8, dst []*pbuf) []*pbuf {
	p.mu.Lock()
	f := p.free[class]
	k := min(len(f), cacheBatch)
	dst = append(dst, f[len(f)-k:]...)
	clear(f[len(f)-k:])
	p.free[class] = f[:len(f)-k]
	p.mu.Unlock()
	for len(dst) < cacheBatch {
		dst = append(dst, newPbuf(class))
	}
	return dst
}

// drain moves the buffers of a local cache back to the pool.
func (p *pool) drain(class uint8, src []*pbuf) {
	p.mu.Lock()
	f := p.free[class]
	k := min(len(src), poolRetain-len(f))
	if k > 0 {
		p.free[class] = append(f, src[:k]...)
	}
	p.mu.Unlock()
}

// put returns one buffer to the pool (the slow paths: close).
func (p *pool) put(b *pbuf) {
	b.next, b.held = nil, false
	p.mu.Lock()
	if len(p.free[b.class]) < poolRetain {
		p.free[b.class] = append(p.free[b.class], b)
	}
	p.mu.Unlock()
}

// cache is a goroutine-local stack of free pbufs in front of a pool, so a
// batch costs one pool lock, not one per packet. Its owner's lock guards it.
type cache struct {
	p    *pool
	free [2][]*pbuf
}

func (c *cache) get(n int) *pbuf {
	cl := classOf(n)
	f := c.free[cl]
	if len(f) == 0 {
		f = c.p.fill(cl, f)
	}
	b := f[len(f)-1]
	f[len(f)-1] = nil
	c.free[cl] = f[:len(f)-1]
	b.n = n
	return b
}

// load copies data into a buffer from the cache.
func (c *cache) load(data []byte) *pbuf {
	b := c.get(len(data))
	copy(b.b, data)
	return b
}

func (c *cache) put(b *pbuf) {
	b.next, b.held = nil, false
	f := append(c.free[b.class], b)
	if len(f) >= 2*cacheBatch {
		c.p.drain(b.class, f[cacheBatch:])
		clear(f[cacheBatch:])
		f = f[:cacheBatch]
	}
	c.free[b.class] = f
}
