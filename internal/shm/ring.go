package shm

import (
	"encoding/binary"
	"errors"
	"fmt"
	"sync/atomic"
	"time"
	"unsafe"
)

// Descriptor flags.
const (
	FlagImm   uint32 = 1 << 0 // Imm is an application immediate
	FlagEOF   uint32 = 1 << 1 // the peer closed; no payload, nothing follows
	FlagError uint32 = 1 << 2 // the vconn failed: Imm is the error code, the payload its message

	flagsKnown = FlagImm | FlagEOF | FlagError
)

// Desc is one descriptor: Len bytes at Off in the ring's slab.
type Desc struct {
	Off, Len, Imm, Flags uint32
}

// Errors.
var (
	// ErrCorrupt is an index or descriptor the other side wrote out of
	// bounds: the ring cannot be used any more.
	ErrCorrupt = errors.New("shm: ring corrupt")
	// ErrTooLarge is a message over the layout's MaxMessage.
	ErrTooLarge = errors.New("shm: message larger than the ring carries")
)

// ring is a view of one ring's area in the mapping.
type ring struct {
	tail, head, consWait, prodWait *atomic.Uint32
	descs                          []byte
	slab                           []byte
	mask                           uint32
	n                              uint32
	maxMsg                         uint32
}

// newRing views mem (one ring's area, 8-byte aligned, at least the
// layout's ringLen) as a ring.
func newRing(mem []byte, l Layout) ring {
	u32 := func(off int) *atomic.Uint32 { return (*atomic.Uint32)(unsafe.Pointer(&mem[off])) }
	dEnd := headerLen + int(l.Entries)*DescLen
	sEnd := dEnd + int(l.Slab)
	return ring{
		tail: u32(offTail), head: u32(offHead), consWait: u32(offConsWait), prodWait: u32(offProdWait),
		descs: mem[headerLen:dEnd:dEnd], slab: mem[dEnd:sEnd:sEnd],
		mask: l.Entries - 1, n: l.Entries, maxMsg: l.MaxMessage,
	}
}

// decode copies descriptor i out of shared memory and checks it, so what
// the caller uses cannot change under it or point outside the slab.
func (r *ring) decode(i uint32) (Desc, error) {
	o := (i & r.mask) * DescLen
	b := r.descs[o : o+DescLen : o+DescLen]
	d := Desc{Off: binary.LittleEndian.Uint32(b), Len: binary.LittleEndian.Uint32(b[4:]),
		Imm: binary.LittleEndian.Uint32(b[8:]), Flags: binary.LittleEndian.Uint32(b[12:])}
	return d, r.check(d)
}

func (r *ring) check(d Desc) error {
	switch slab := uint32(len(r.slab)); {
	case d.Flags&^flagsKnown != 0:
		return fmt.Errorf("%w: descriptor flags %#x", ErrCorrupt, d.Flags)
	case d.Len > r.maxMsg:
		return fmt.Errorf("%w: descriptor of %d bytes, at most %d", ErrCorrupt, d.Len, r.maxMsg)
	case d.Off > slab || d.Len > slab-d.Off:
		return fmt.Errorf("%w: descriptor of %d bytes at %d outside a slab of %d", ErrCorrupt, d.Len, d.Off, slab)
	}
	return nil
}

func (r *ring) encode(i uint32, d Desc) {
	o := (i & r.mask) * DescLen
	b := r.descs[o : o+DescLen : o+DescLen]
	binary.LittleEndian.PutUint32(b, d.Off)
	binary.LittleEndian.PutUint32(b[4:], d.Len)
	binary.LittleEndian.PutUint32(b[8:], d.Imm)
	binary.LittleEndian.PutUint32(b[12:], d.Flags)
}

// Producer is the writing end of a ring. It is not safe for concurrent
// use: one goroutine (or a caller's lock) at a time.
type Producer struct {
	r    ring
	bell *Bell
	tail uint32 // next descriptor; private, published to r.tail
	head uint32 // the consumer's head, as last checked
	// data counts slab bytes used so far (wrap padding included);
	// starts[i&mask] is where descriptor i's bytes (or padding) begin,
	// so the slab is free up to where the consumer's head descriptor
	// starts. Both private: nothing read back from shared memory.
	data   uint64
	starts []uint64
	room   func(uintptr) bool // for Wait: the consumer released, or the bell is down or rung
}

// Consumer is the reading end of a ring, with the same rule as Producer,
// except that Release may run on another goroutine than Peek and Hold
// (one at a time): a consumer that sends the payloads from the slab in
// place (the agent's TX) gives them back as their sends complete.
type Consumer struct {
	r    ring
	bell *Bell
	// head is the oldest descriptor not released, published to r.head;
	// read the next to peek, at or past head (Hold). Both private.
	head, read atomic.Uint32
	tail       uint32 // the producer's tail, as last checked; Peek's
	// For Wait: the producer published a descriptor, or the bell is
	// down or rung. It reads shared memory, atomics and the descriptor
	// only: goroutines that take turns on the consumer (a caller's lock)
	// may wait at once.
	more func(uintptr) bool
}

func newProducer(r ring, b *Bell) *Producer {
	p := &Producer{r: r, bell: b, starts: make([]uint64, r.n)}
	// Made once, so that Wait allocates nothing. p.head is what the last
	// Push saw, on the goroutine that waits.
	p.room = func(fd uintptr) bool { return p.r.head.Load() != p.head || b.Down() || rung(fd) }
	return p
}

func newConsumer(r ring, b *Bell) *Consumer {
	c := &Consumer{r: r, bell: b}
	c.more = func(fd uintptr) bool { return c.r.tail.Load() != c.read.Load() || b.Down() || rung(fd) }
	return c
}

// MaxMessage is the largest payload Push takes.
func (p *Producer) MaxMessage() int { return int(p.r.maxMsg) }

// sync reads the consumer's head: it may only have moved forward, and not
// past what was published.
func (p *Producer) sync() error {
	h := p.r.head.Load()
	if h-p.head > p.tail-p.head {
		return fmt.Errorf("%w: consumer head %d outside %d..%d", ErrCorrupt, h, p.head, p.tail)
	}
	p.head = h
	return nil
}

// Push copies b into the slab and publishes a descriptor for it, ringing
// the consumer's bell if it announced it sleeps. It reports false, without
// error, when the ring has no room now; an error is final.
func (p *Producer) Push(b []byte, imm, flags uint32) (bool, error) {
	if uint32(len(b)) > p.r.maxMsg {
		return false, fmt.Errorf("%w: %d bytes, at most %d", ErrTooLarge, len(b), p.r.maxMsg)
	}
	if err := p.sync(); err != nil {
		return false, err
	}
	if p.tail-p.head >= p.r.n {
		return false, nil
	}
	slab := uint64(len(p.r.slab))
	free := p.data // consumed up to here
	if p.head != p.tail {
		free = p.starts[p.head&p.r.mask]
	}
	// Each message takes whole cache lines, so two never share one, and
	// does not wrap: it starts over at 0 if it would.
	need := (uint64(len(b)) + CacheLine - 1) &^ (CacheLine - 1)
	start := p.data
	if pos := start % slab; pos+need > slab {
		start += slab - pos
	}
	if start+need-free > slab {
		return false, nil
	}
	off := uint32(start % slab)
	copy(p.r.slab[off:], b)
	p.r.encode(p.tail, Desc{Off: off, Len: uint32(len(b)), Imm: imm, Flags: flags & flagsKnown})
	p.starts[p.tail&p.r.mask] = p.data
	p.data = start + need
	p.tail++
	p.r.tail.Store(p.tail) // publishes the descriptor and its bytes
	if p.r.consWait.Load() != 0 && p.r.consWait.Swap(0) != 0 {
		p.bell.Ring()
	}
	return true, nil
}

// Empty reports whether the consumer has released every descriptor.
func (p *Producer) Empty() bool { return p.r.head.Load() == p.tail }

// Arm announces that the producer is about to sleep until the consumer
// frees room: the consumer's next Release rings the bell. The caller
// tries Push once more after Arm, then, if still Armed, waits on the bell.
func (p *Producer) Arm() { p.r.prodWait.Store(1) }

// Armed reports whether the producer's Arm still stands: no Release took
// it (and rang) since. One that took it may have made too little room
// for the message waiting, so the caller arms again before it sleeps.
func (p *Producer) Armed() bool { return p.r.prodWait.Load() != 0 }

// Wait sleeps until the consumer releases a descriptor after Arm (it rings
// the bell), the bell shuts down or timeout passes (negative: none). It
// reports whether it was woken before the timeout; an error means the
// bell is shut or the other side closed its end (a close ends the sleep
// it interrupts, and the next Wait reports it). The caller loops: Push,
// Arm, Push, Wait.
func (p *Producer) Wait(timeout time.Duration) (bool, error) {
	return p.bell.waitReady(timeout, p.room)
}

// Ready reports whether a descriptor may be waiting (Peek decides).
func (c *Consumer) Ready() bool { r := c.read.Load(); return r != c.tail || c.r.tail.Load() != r }

// Peek returns the next descriptor not yet held and its payload, which
// aliases shared memory and is valid until Release (as far as the
// producer is honest: the agent must treat it as bytes that can change
// under it). ok is false when the ring is empty; an error is final.
func (c *Consumer) Peek() (d Desc, payload []byte, ok bool, err error) {
	r := c.read.Load()
	if r == c.tail {
		t := c.r.tail.Load()
		if t-c.head.Load() > c.r.n {
			return Desc{}, nil, false, fmt.Errorf("%w: producer tail %d, head %d, %d entries", ErrCorrupt, t, c.head.Load(), c.r.n)
		}
		if c.tail = t; t == r {
			return Desc{}, nil, false, nil
		}
	}
	if d, err = c.r.decode(r); err != nil {
		return Desc{}, nil, false, err
	}
	return d, c.r.slab[d.Off : d.Off+d.Len : d.Off+d.Len], true, nil
}

// Hold moves past the descriptor Peek returned without releasing it: its
// bytes stay in place, and the producer's, until a Release gives it back.
// It returns the descriptor's index (Release gives back the oldest first).
func (c *Consumer) Hold() uint32 {
	r := c.read.Load()
	c.read.Store(r + 1)
	return r
}

// Release gives the oldest descriptor not released (and its bytes) back
// to the producer, ringing its bell if it waits for room: the one Peek
// returned, or the oldest held. It does nothing when none was peeked.
func (c *Consumer) Release() {
	h, r := c.head.Load(), c.read.Load()
	if h == r { // none held: the one Peek returned, if any
		if r == c.tail {
			return
		}
		c.read.Store(r + 1)
	}
	h++
	c.head.Store(h)
	c.r.head.Store(h)
	if c.r.prodWait.Load() != 0 && c.r.prodWait.Swap(0) != 0 {
		c.bell.Ring()
	}
}

// Slab is the ring's payload area, which descriptors' offsets point
// into: for a consumer that registers it to send from in place.
func (c *Consumer) Slab() []byte { return c.r.slab }

// Arm announces that the consumer is about to sleep until the producer
// pushes: the next Push rings the bell. It reports whether a descriptor
// arrived meanwhile, in which case the caller must not sleep.
func (c *Consumer) Arm() bool {
	c.r.consWait.Store(1)
	return c.Ready()
}

// Wait sleeps until the producer publishes a descriptor after Arm (it
// rings the bell), the bell shuts down or timeout passes (negative:
// none), as Producer.Wait. The caller loops: Peek, Arm, Wait.
func (c *Consumer) Wait(timeout time.Duration) (bool, error) {
	return c.bell.waitReady(timeout, c.more)
}

// Bell is the consumer's end of the ring's doorbell.
func (c *Consumer) Bell() *Bell { return c.bell }
