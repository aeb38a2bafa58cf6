package wire

import (
	"math"
	"sync"
	"time"
)

// Kinds of scheduled packet.
const (
	schedDelay = iota + 1 // deliver at due
	schedHold             // held back for reordering: release at due if no later packet did
)

// pbuf.idx outside the heap.
const (
	idxNone      = -1 // never scheduled, or claimed by the timer goroutine
	idxFired     = -2 // popped by the timer goroutine, not yet claimed
	idxCancelled = -3 // popped, then taken back by its faulter before the goroutine claimed it
)

// sched is the timer heap of a fault model: delayed packets and the
// deadlines of held ones. One goroutine serves it, started when the first
// packet is pushed and running while timed faults are configured (enabled)
// or packets are pending; close stops it.
//
// Lock order: a faulter's mu, then sched.mu. The goroutine pops under mu
// alone, then claims each popped packet under its faulter's mu and mu.
type sched struct {
	start time.Time // clock origin: now() is nanoseconds since start

	mu      sync.Mutex
	heap    []*pbuf // min-heap by (due, seq); guarded by mu
	seq     uint64  // guarded by mu
	enabled bool    // guarded by mu
	running bool    // guarded by mu
	closed  bool    // guarded by mu
	nextDue int64   // when the goroutine wakes next (MaxInt64: only when signalled); guarded by mu

	wake chan struct{} // capacity 1
	wg   sync.WaitGroup

	fired []firedPbuf // the goroutine's own
}

type firedPbuf struct {
	b *pbuf
	f *faulter
}

func newSched() *sched {
	return &sched{start: time.Now(), wake: make(chan struct{}, 1)}
}

func (s *sched) now() int64 { return int64(time.Since(s.start)) }

// setEnabled keeps the goroutine alive (on) or lets it exit once the heap
// drains (off).
func (s *sched) setEnabled(on bool) {
	s.mu.Lock()
	s.enabled = on
	if on {
		s.startLocked()
	}
	s.mu.Unlock()
	s.signal()
}

func (s *sched) startLocked() {
	if !s.running && !s.closed {
		s.running = true
		s.wg.Add(1)
		go s.run()
	}
}

func (s *sched) signal() {
	select {
	case s.wake <- struct{}{}:
	default:
	}
}

// push schedules b for its owner f at due. It reports false when the
// scheduler is closed; b is then still the caller's.
func (s *sched) push(b *pbuf, f *faulter, kind uint8, due int64) bool {
	b.kind = kind
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return false
	}
	b.due, b.seq, b.owner = due, s.seq, f
	s.seq++
	b.idx = len(s.heap)
	s.heap = append(s.heap, b)
	s.up(b.idx)
	wake := s.heap[0] == b && (!s.running || due < s.nextDue)
	if wake {
		s.nextDue = due
		s.startLocked()
	}
	s.mu.Unlock()
	if wake {
		s.signal()
	}
	return true
}

// cancel takes b back from the scheduler: out of the heap, or away from
// the goroutine if it has popped but not claimed it. The caller owns b.
func (s *sched) cancel(b *pbuf) {
	s.mu.Lock()
	switch {
	case b.idx >= 0:
		s.remove(b.idx)
	case b.idx == idxFired:
		b.idx = idxCancelled
	}
	s.mu.Unlock()
}

// claim reports whether b, popped by the goroutine, is still its to process.
func (s *sched) claim(b *pbuf) bool {
	s.mu.Lock()
	ok := b.idx == idxFired
	if ok {
		b.idx = idxNone
	}
	s.mu.Unlock()
	return ok
}

// close stops the goroutine and returns what was pending, for the caller
// to count and free. Later pushes fail.
func (s *sched) close() []*pbuf {
	s.mu.Lock()
	s.closed = true
	pending := s.heap
	s.heap = nil
	for _, b := range pending {
		b.idx = idxNone
	}
	s.mu.Unlock()
	s.signal()
	s.wg.Wait()
	return pending
}

func (s *sched) run() {
	defer s.wg.Done()
	var t *time.Timer
	for {
		s.mu.Lock()
		if s.closed || (!s.enabled && len(s.heap) == 0) {
			s.running = false
			s.mu.Unlock()
			if t != nil {
				t.Stop()
			}
			return
		}
		now := s.now()
		for len(s.heap) > 0 && s.heap[0].due <= now {
			b := s.heap[0]
			s.remove(0)
			b.idx = idxFired
			s.fired = append(s.fired, firedPbuf{b, b.owner})
		}
		wait := time.Duration(-1)
		s.nextDue = math.MaxInt64
		if len(s.heap) > 0 {
			s.nextDue = s.heap[0].due
			wait = time.Duration(s.nextDue - now)
		}
		s.mu.Unlock()

		if len(s.fired) > 0 {
			s.deliver()
			continue
		}
		if wait >= 0 {
			if t == nil {
				t = time.NewTimer(wait)
			} else {
				t.Reset(wait)
			}
			select {
			case <-s.wake:
			case <-t.C:
			}
			t.Stop()
		} else {
			<-s.wake
		}
	}
}

// deliver hands fired packets to their faulters, one lock per run of
// packets from the same faulter.
func (s *sched) deliver() {
	fired := s.fired
	for i := 0; i < len(fired); {
		f := fired[i].f
		j := i
		for j < len(fired) && fired[j].f == f {
			j++
		}
		f.fire(fired[i:j])
		i = j
	}
	clear(fired)
	s.fired = fired[:0]
}

// Heap of *pbuf ordered by (due, seq); each element knows its index.

func (s *sched) less(i, j int) bool {
	a, b := s.heap[i], s.heap[j]
	return a.due < b.due || (a.due == b.due && a.seq < b.seq)
}

func (s *sched) swap(i, j int) {
	h := s.heap
	h[i], h[j] = h[j], h[i]
	h[i].idx = i
	h[j].idx = j
}

func (s *sched) up(j int) {
	for j > 0 {
		i := (j - 1) / 2
		if !s.less(j, i) {
			break
		}
		s.swap(i, j)
		j = i
	}
}

func (s *sched) down(i int) bool {
	i0, n := i, len(s.heap)
	for {
		l := 2*i + 1
		if l >= n {
			break
		}
		j := l
		if r := l + 1; r < n && s.less(r, l) {
			j = r
		}
		if !s.less(j, i) {
			break
		}
		s.swap(i, j)
		i = j
	}
	return i > i0
}

// remove deletes heap[i]; its idx becomes idxNone.
func (s *sched) remove(i int) {
	n := len(s.heap) - 1
	b := s.heap[i]
	if i != n {
		s.swap(i, n)
	}
	s.heap[n] = nil
	s.heap = s.heap[:n]
	if i != n && !s.down(i) {
		s.up(i)
	}
	b.idx = idxNone
}
