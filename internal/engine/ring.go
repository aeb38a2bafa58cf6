package engine

import "sync/atomic"

// ringSize is the depth of a vconn's submission ring. With credits bounding
// what a vconn has in flight, a deep ring would only hold memory.
const ringSize = 16

// ringSpins is how many times a sender finding the ring full yields before
// it parks: one streaming vconn's sender parked every 15-30 messages, and
// parking and waking cost more than the few yields it takes the poller to
// make room (8% more messages a second on the soft provider).
const ringSpins = 4

// ring is a single-producer, single-consumer queue of send buffers: the
// producer is the vconn's sender (serialised by VConn.sendMu), the consumer
// its QP's poller. The indexes live with the
// vconn's hot fields and the entries (ringEntries) apart, after them: a
// message touches one entry, but every path reads the indexes.
type ring struct {
	head atomic.Uint32 // next to consume; written by the consumer
	tail atomic.Uint32 // next to fill; written by the producer
}

type ringEntries [ringSize]ringEntry

// ringEntry is a queued send: a buffer's slot and the length of what it
// holds, or opMarker (onesided.go).
type ringEntry uint64

func newEntry(s bufSlot, n uint32) ringEntry { return ringEntry(s)<<32 | ringEntry(n) }

func (e ringEntry) slot() bufSlot { return bufSlot(e >> 32) }

func (e ringEntry) len() uint32 { return uint32(e) }

func (r *ring) free() int { return ringSize - int(r.tail.Load()-r.head.Load()) }

// push appends; the caller checked free. The producer only (sendMu held).
func (r *ring) push(e *ringEntries, v ringEntry) {
	t := r.tail.Load()
	e[t%ringSize] = v
	r.tail.Store(t + 1)
}

// peek returns the oldest entry without consuming it. The consumer (the
// QP's poller) only.
func (r *ring) peek(e *ringEntries) (ringEntry, bool) {
	h := r.head.Load()
	if h == r.tail.Load() {
		return 0, false
	}
	return e[h%ringSize], true
}

// at returns the entry i places behind the oldest, if there is one. The
// consumer only.
func (r *ring) at(e *ringEntries, i int) (ringEntry, bool) {
	h := r.head.Load()
	if int(r.tail.Load()-h) <= i {
		return 0, false
	}
	return e[(h+uint32(i))%ringSize], true
}

// pop consumes the oldest entry. The consumer only.
func (r *ring) pop() { r.head.Add(1) }

// len is the number of entries queued; free, the room left; empty, none
// queued. Either side (the producer's view may only grow free, the
// consumer's only shrink it).
func (r *ring) len() int { return int(r.tail.Load() - r.head.Load()) }

func (r *ring) empty() bool { return r.head.Load() == r.tail.Load() }
