package engine

import (
	"encoding/binary"
	"fmt"
	"sync"
	"sync/atomic"

	"github.com/rdmavisor/rdmavisor/internal/engine/format"
	"github.com/rdmavisor/rdmavisor/internal/verbs"
)

// bufPool is the engine's registered memory: one MR carved into size
// classes. A buffer is named by its bufSlot, which is what a work request's
// wr_id carries to free it on completion.
//
// Ownership: get hands a buffer to the caller; it stays the caller's (or
// the device's, once posted) until put. Buffers are never touched after
// put; a double put panics, as a refcount gone wrong must not corrupt data.
// A buffer with several owners at once (an Auto datagram, held until
// acknowledged and posted perhaps more than once) is shared: share sets
// its owners, unshare drops one and says whether it was the last.
type bufPool struct {
	mr      verbs.MR
	classes []bufClass
	// lent is, for each buffer of class 0, the staged payload its
	// header goes with (lend.go); touched by the buffer's owner only.
	lent []lentRef
}

type bufClass struct {
	size uint32
	base uint64 // offset of the class in the MR
	n    uint32

	mu      sync.Mutex
	free    []uint32       // indexes; guarded by mu
	inUse   []bool         // guarded by mu
	refs    []atomic.Int32 // owners of shared buffers (see share)
	lowest  int            // fewest free ever; guarded by mu
	waiters int            // goroutines in wait; guarded by mu
	wakeAt  int            // free buffers that wake the waiters
	freed   chan struct{}  // closed (and replaced) by a put while waiters wait; guarded by mu
}

// bufSlot names a buffer of the pool: its class in the top byte, its index
// in the class below. It fits the 28 bits a send's wr_id tag leaves it
// (format.Tag) with up to 16 classes.
type bufSlot uint32

// noSlot is no buffer.
const noSlot = ^bufSlot(0)

const slotIndexBits = 24

func makeSlot(class int, index uint32) bufSlot { return bufSlot(class)<<slotIndexBits | bufSlot(index) }

func (s bufSlot) class() int { return int(s >> slotIndexBits) }

func (s bufSlot) index() uint32 { return uint32(s) & (1<<slotIndexBits - 1) }

// classSpec asks for n buffers of size bytes.
type classSpec struct {
	size, n int
}

func newBufPool(pd verbs.PD, specs []classSpec) (*bufPool, error) {
	if len(specs) > format.TagSlotMask>>slotIndexBits+1 {
		return nil, fmt.Errorf("engine: %d buffer classes, more than a send tag holds: %w", len(specs), verbs.ErrInvalid)
	}
	total := 0
	for _, s := range specs {
		if s.size <= 0 || s.n <= 0 || s.n >= 1<<slotIndexBits {
			return nil, fmt.Errorf("engine: buffer class %+v: %w", s, verbs.ErrInvalid)
		}
		total += s.size * s.n
	}
	mr, err := pd.RegMR(total, verbs.AccessLocalWrite)
	if err != nil {
		return nil, fmt.Errorf("engine: register %d-byte buffer pool: %w", total, err)
	}
	p := &bufPool{mr: mr, classes: make([]bufClass, len(specs))}
	off := uint64(0)
	for i, s := range specs {
		c := &p.classes[i]
		c.size, c.base, c.n = uint32(s.size), off, uint32(s.n)
		c.free = make([]uint32, s.n)
		for j := range c.free {
			c.free[j] = uint32(s.n - 1 - j)
		}
		c.inUse = make([]bool, s.n)
		c.refs = make([]atomic.Int32, s.n)
		c.lowest = s.n
		// Many waiters wake once a batch of buffers is free, not on
		// every put: under sustained pressure a wake per buffer would
		// cost a channel per message. A few wake once there is one
		// each. (Waiters also look again every 10 ms.)
		c.wakeAt = max(1, min(32, s.n/16))
		off += uint64(s.size) * uint64(s.n)
	}
	p.lent = make([]lentRef, specs[0].n)
	return p, nil
}

// class returns the smallest class whose buffers hold n bytes, or -1.
func (p *bufPool) class(n int) int {
	for i := range p.classes {
		if int(p.classes[i].size) >= n {
			return i
		}
	}
	return -1
}

// get takes a buffer of class ci; ok is false when the class is empty.
func (p *bufPool) get(ci int) (slot bufSlot, ok bool) {
	c := &p.classes[ci]
	c.mu.Lock()
	k := len(c.free)
	if k == 0 {
		c.mu.Unlock()
		return 0, false
	}
	idx := c.free[k-1]
	c.free = c.free[:k-1]
	c.inUse[idx] = true
	c.lowest = min(c.lowest, k-1)
	c.mu.Unlock()
	return makeSlot(ci, idx), true
}

func (p *bufPool) put(slot bufSlot) {
	c := &p.classes[slot.class()]
	idx := slot.index()
	c.mu.Lock()
	if !c.inUse[idx] {
		c.mu.Unlock()
		panic(fmt.Sprintf("engine: buffer %#x returned twice", slot))
	}
	c.inUse[idx] = false
	c.free = append(c.free, idx)
	if c.waiters > 0 && len(c.free) >= min(c.wakeAt, c.waiters) {
		close(c.freed)
		c.freed = make(chan struct{})
	}
	c.mu.Unlock()
}

// share gives a buffer the caller got n owners, the caller among them.
func (p *bufPool) share(slot bufSlot, n int32) {
	p.classes[slot.class()].refs[slot.index()].Store(n)
}

// ref adds an owner to a shared buffer.
func (p *bufPool) ref(slot bufSlot) {
	p.classes[slot.class()].refs[slot.index()].Add(1)
}

// unshare drops an owner of a shared buffer and reports whether it was the
// last, for buffers that go elsewhere than back to the pool (a receive
// buffer is reposted).
func (p *bufPool) unshare(slot bufSlot) bool {
	n := p.classes[slot.class()].refs[slot.index()].Add(-1)
	if n < 0 {
		panic(fmt.Sprintf("engine: shared buffer %#x released once too often", slot))
	}
	return n == 0
}

// wait blocks until class ci may have a free buffer, or done is closed.
func (p *bufPool) wait(ci int, done <-chan struct{}) {
	c := &p.classes[ci]
	c.mu.Lock()
	if len(c.free) > 0 {
		c.mu.Unlock()
		return
	}
	if c.freed == nil {
		c.freed = make(chan struct{})
	}
	c.waiters++
	ch := c.freed
	c.mu.Unlock()
	select {
	case <-ch:
	case <-done:
	}
	c.mu.Lock()
	c.waiters--
	c.mu.Unlock()
}

// valid reports whether slot names a buffer of this pool.
func (p *bufPool) valid(slot bufSlot) bool {
	ci := slot.class()
	return ci < len(p.classes) && slot.index() < p.classes[ci].n
}

func (p *bufPool) size(slot bufSlot) uint32 { return p.classes[slot.class()].size }

func (p *bufPool) offset(slot bufSlot) uint64 {
	c := &p.classes[slot.class()]
	return c.base + uint64(slot.index())*uint64(c.size)
}

// bytes is the buffer's memory.
func (p *bufPool) bytes(slot bufSlot) []byte {
	off := p.offset(slot)
	return p.mr.Bytes()[off : off+uint64(p.size(slot)) : off+uint64(p.size(slot))]
}

// sge describes n bytes of the buffer.
func (p *bufPool) sge(slot bufSlot, n uint32) verbs.SGE {
	return verbs.SGE{Addr: p.mr.Addr() + p.offset(slot), Length: n, LKey: p.mr.LKey()}
}

// inUse counts buffers handed out, per class.
func (p *bufPool) inUse() []int {
	out := make([]int, len(p.classes))
	for i := range p.classes {
		c := &p.classes[i]
		c.mu.Lock()
		out[i] = int(c.n) - len(c.free)
		c.mu.Unlock()
	}
	return out
}

func (p *bufPool) close() error { return p.mr.Close() }

// A gathered bundle's header buffer lists, after its header, the slot and
// length of each of its messages' buffers, gatherLen bytes each.
const gatherLen = 8

func putGathered(b []byte, i int, s bufSlot, n uint32) {
	off := format.HeaderLen + gatherLen*i
	binary.BigEndian.PutUint32(b[off:], uint32(s))
	binary.BigEndian.PutUint32(b[off+4:], n)
}

func gathered(b []byte, i int) (bufSlot, uint32) {
	off := format.HeaderLen + gatherLen*i
	return bufSlot(binary.BigEndian.Uint32(b[off:])), binary.BigEndian.Uint32(b[off+4:])
}

// opMarker in a vconn's ring says "post the pending one-sided WRs here",
// which keeps one-sided operations in order with the vconn's messages.
const opMarker = ^bufSlot(0)

// stagedSlot is the wr_id tag's slot of a work request on staging memory:
// no buffer of the pool (whose classes hold fewer than 2^24-1 buffers, so
// the last index of the last class is never one).
const stagedSlot = bufSlot(format.TagSlotMask)

// gatherMin is the length (header included) from which queued messages
// are bundled by gathering rather than copied: the bundle's work request
// lists their buffers after its header (up to verbs.MaxSGE-1 of them), and
// the device reads them as it sends, as a NIC does by DMA. Shorter ones
// are copied, a ring's worth at most: copying a kilobyte or two costs less
// than the work requests it saves, and a bundle of them would need more
// scatter/gather entries than a QP has. Measured on the soft provider, one
// vconn, auto over uc: 1 KiB messages copied 15 to a bundle ran 1.11-1.18x,
// gathered 3 to a bundle 0.88-1.11x (the low end when the host was slow);
// 2 KiB ones copied 0.75x, gathered 0.91x.
const gatherMin = 2048
