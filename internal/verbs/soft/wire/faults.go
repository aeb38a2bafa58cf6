package wire

import (
	"math"
	"math/rand/v2"
	"sync"
	"time"

	"github.com/rdmavisor/rdmavisor/internal/verbs"
)

// Faults is a network's misbehaviour, applied per packet on Send.
//
// Decisions come from a PCG generator seeded with Seed and the sender's GID,
// drawn in a fixed order (loss, duplicate, then per copy reorder and delay),
// so one sender sending the same sequence with the same Faults sees the same
// faults. Hold deadlines (ReorderHold) depend on the clock; run under
// testing/synctest for bit-exact runs that involve time.
type Faults struct {
	Seed uint64
	// Loss is the probability a packet is dropped.
	Loss float64
	// Duplicate is the probability a surviving packet is sent twice.
	Duplicate float64
	// Reorder is the probability a copy is held back and delivered after
	// the next packet to the same destination that is not held itself
	// (consecutive held packets are released together, in order), or after
	// ReorderHold if none comes.
	Reorder float64
	// Delay is added to every delivery; with Jitter the delay is uniform in
	// [Delay-Jitter, Delay+Jitter], floored at zero. Delayed packets are
	// delivered by a timer goroutine in due order, so jitter reorders.
	Delay, Jitter time.Duration
}

// ReorderHold bounds how long a packet held for reordering waits for a
// later packet to overtake it.
const ReorderHold = time.Millisecond

// normalize clamps probabilities to [0, 1] (NaN to 0) and durations to
// non-negative values.
func (f Faults) normalize() Faults {
	p := func(v float64) float64 {
		if !(v > 0) { // also NaN
			return 0
		}
		return math.Min(v, 1)
	}
	f.Loss, f.Duplicate, f.Reorder = p(f.Loss), p(f.Duplicate), p(f.Reorder)
	f.Delay, f.Jitter = max(f.Delay, 0), max(f.Jitter, 0)
	return f
}

func (f Faults) active() bool {
	return f.Loss > 0 || f.Duplicate > 0 || f.timed()
}

// timed reports whether the faults need the timer goroutine.
func (f Faults) timed() bool { return f.Reorder > 0 || f.Delay > 0 || f.Jitter > 0 }

// outPkt is a packet leaving the fault model: either still in the caller's
// buffer (ref, valid only during the Send that produced it) or in a pooled
// buffer (buf, owned by whoever holds the outPkt).
type outPkt struct {
	ref *Packet
	buf *pbuf
}

func (o *outPkt) dst() verbs.GID {
	if o.buf != nil {
		return o.buf.dst
	}
	return o.ref.Addr
}

func (o *outPkt) data() []byte {
	if o.buf != nil {
		return o.buf.data()
	}
	return o.ref.Buf[:o.ref.N]
}

// faulter is the fault model of one sender, shared by the fabric (one per
// endpoint) and the WithFaults decorator. Everything in it is guarded by mu,
// which is also the sender's send lock: it serialises Send, the timer
// goroutine's deliveries and the sink.
type faulter struct {
	mu    sync.Mutex
	cfg   Faults
	salt  uint64
	pcg   rand.PCG
	rng   *rand.Rand
	held  map[verbs.GID]*heldList
	nheld int
	out   []outPkt // what leaves now, drained by flush
	cache cache
	sched *sched
	// sink puts packets on the network below the fault model, in order.
	// It is called with mu held and owns every buf in out on return: it
	// frees them (into cache) or passes them on.
	sink func(out []outPkt)
	st   Stats // counted since the last flush
	cnt  *counters
}

type heldList struct{ head, tail *pbuf }

func newFaulter(cfg Faults, local verbs.GID, p *pool, s *sched, cnt *counters, sink func([]outPkt)) *faulter {
	f := &faulter{
		salt:  saltOf(local),
		held:  make(map[verbs.GID]*heldList),
		cache: cache{p: p},
		sched: s,
		sink:  sink,
		cnt:   cnt,
	}
	f.rng = rand.New(&f.pcg)
	f.configure(cfg)
	return f
}

// saltOf is FNV-1a of a GID: the second half of the PCG seed, so senders
// on one fabric draw independent sequences.
func saltOf(g verbs.GID) uint64 {
	h := uint64(14695981039346656037)
	for _, b := range g {
		h ^= uint64(b)
		h *= 1099511628211
	}
	return h
}

// configure replaces the faults and restarts the generator from the seed.
// Packets already held or scheduled keep their fate. Call with mu held (or
// before the faulter is shared).
func (f *faulter) configure(cfg Faults) {
	f.cfg = cfg.normalize()
	f.pcg.Seed(f.cfg.Seed, f.salt)
}

// send runs one packet through the fault model. Call with mu held; the
// packet must be no longer than MaxPacketLen.
// sendAll passes a batch through the fault model and hands what leaves
// now to the sink. Oversized packets are dropped and counted. Call with mu
// held.
func (f *faulter) sendAll(pkts []Packet) {
	var now int64
	if f.cfg.timed() {
		now = f.sched.now()
	}
	for i := range pkts {
		p := &pkts[i]
		if p.N > MaxPacketLen {
			f.st.DropOversize++
			continue
		}
		_ = p.Buf[:p.N] // a bad N panics here, in the caller's frame, not later
		f.send(p, now)
	}
	f.flush()
}

func (f *faulter) send(p *Packet, now int64) {
	if !f.cfg.active() {
		f.out = append(f.out, outPkt{ref: p})
		return
	}
	if f.cfg.Loss > 0 && f.rng.Float64() < f.cfg.Loss {
		f.st.DropLoss++
		return
	}
	copies := 1
	if f.cfg.Duplicate > 0 && f.rng.Float64() < f.cfg.Duplicate {
		copies = 2
		f.st.Duplicated++
	}
	for range copies {
		if f.cfg.Reorder > 0 && f.rng.Float64() < f.cfg.Reorder {
			b := f.cache.load(p.Buf[:p.N])
			b.dst = p.Addr
			if f.hold(b, now) {
				f.st.Reordered++
				continue
			}
			f.emit(outPkt{buf: b}, now)
		} else {
			f.emit(outPkt{ref: p}, now)
		}
		if f.nheld > 0 {
			f.release(p.Addr, now)
		}
	}
}

// emit sends o now, or schedules it when a delay is drawn.
func (f *faulter) emit(o outPkt, now int64) {
	if f.cfg.Delay > 0 || f.cfg.Jitter > 0 {
		d := int64(f.cfg.Delay)
		if j := int64(f.cfg.Jitter); j > 0 {
			d += f.rng.Int64N(2*j+1) - j
		}
		if d > 0 {
			b := o.buf
			if b == nil {
				b = f.cache.load(o.data())
				b.dst = o.ref.Addr
			}
			if f.sched.push(b, f, schedDelay, now+d) {
				f.st.Delayed++
				return
			}
			o = outPkt{buf: b}
		}
	}
	f.out = append(f.out, o)
}

// hold appends b to its destination's held list until a later packet to
// that destination, or ReorderHold, releases it.
func (f *faulter) hold(b *pbuf, now int64) bool {
	if !f.sched.push(b, f, schedHold, now+int64(ReorderHold)) {
		return false
	}
	l := f.held[b.dst]
	if l == nil {
		l = new(heldList)
		f.held[b.dst] = l
	}
	if l.tail == nil {
		l.head = b
	} else {
		l.tail.next = b
	}
	l.tail = b
	b.held = true
	f.nheld++
	return true
}

// release emits, in order, every packet held for dst: a later packet has
// just overtaken them.
func (f *faulter) release(dst verbs.GID, now int64) {
	l := f.held[dst]
	if l == nil {
		return
	}
	b := l.head
	l.head, l.tail = nil, nil
	for b != nil {
		next := b.next
		f.sched.cancel(b)
		b.next, b.held = nil, false
		f.nheld--
		f.emit(outPkt{buf: b}, now)
		b = next
	}
}

// unhold takes b out of its held list.
func (f *faulter) unhold(b *pbuf) {
	l := f.held[b.dst]
	var prev *pbuf
	for c := l.head; c != nil; prev, c = c, c.next {
		if c != b {
			continue
		}
		if prev == nil {
			l.head = c.next
		} else {
			prev.next = c.next
		}
		if l.tail == c {
			l.tail = prev
		}
		break
	}
	b.next, b.held = nil, false
	f.nheld--
}

// fire takes packets from the timer goroutine: delayed ones are due, held
// ones were overtaken by nothing within ReorderHold. Both go out now.
func (f *faulter) fire(fired []firedPbuf) {
	f.mu.Lock()
	for _, fp := range fired {
		b := fp.b
		if !f.sched.claim(b) {
			continue // taken back by release or close
		}
		if b.kind == schedHold {
			f.unhold(b)
		}
		f.out = append(f.out, outPkt{buf: b})
	}
	f.flush()
	f.mu.Unlock()
}

// flush hands what leaves now to the sink and publishes the counters.
// Call with mu held.
func (f *faulter) flush() {
	if len(f.out) > 0 {
		f.sink(f.out)
		clear(f.out)
		f.out = f.out[:0]
	}
	if f.st != (Stats{}) {
		f.cnt.add(&f.st)
		f.st = Stats{}
	}
}

// releaseAll empties the held lists at close: delivered if deliver, else
// dropped. Call with mu held; flush afterwards.
func (f *faulter) releaseAll(deliver bool) {
	for _, l := range f.held {
		b := l.head
		l.head, l.tail = nil, nil
		for b != nil {
			next := b.next
			f.sched.cancel(b)
			b.next, b.held = nil, false
			f.nheld--
			if deliver {
				f.out = append(f.out, outPkt{buf: b})
			} else {
				f.st.DropClosed++
				f.cache.put(b)
			}
			b = next
		}
	}
}
