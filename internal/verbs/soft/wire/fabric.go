package wire

import (
	"fmt"
	"sync"
	"sync/atomic"

	"github.com/rdmavisor/rdmavisor/internal/verbs"
)

// RxQueueLen is the receive queue of a fabric endpoint, in packets. A packet
// that finds it full is dropped and counted in the receiver's
// Stats.DropQueueFull, as a NIC's RX ring overflows: senders never block.
const RxQueueLen = 4096

// Fabric is an in-memory network for deterministic tests: endpoints
// attached by GID, each with a bounded receive queue, and one fault model
// per sending endpoint.
//
// Send copies each packet into a buffer from the fabric's pool; the packet
// then belongs to the fabric (held, delayed or queued) until Recv copies it
// into the caller's buffer and returns the pool buffer. With no faults, or
// with loss, duplication and reordering, Send and Recv allocate nothing in
// steady state.
//
// When the faults include reordering, delay or jitter, a timer goroutine
// runs until Close (or until SetFaults turns them off and nothing is
// pending): close every Fabric that had timed faults.
type Fabric struct {
	pool  pool
	sched *sched

	mu     sync.Mutex
	faults Faults      // guarded by mu
	all    []*endpoint // every endpoint ever attached, for Stats; guarded by mu
	closed bool        // guarded by mu
	// eps maps GIDs to attached endpoints; replaced (copy on write) under
	// mu, read lock-free by senders.
	eps atomic.Pointer[map[verbs.GID]*endpoint]
}

// NewFabric returns an empty fabric applying f to every sender.
func NewFabric(f Faults) *Fabric {
	fb := &Fabric{sched: newSched(), faults: f.normalize()}
	m := make(map[verbs.GID]*endpoint)
	fb.eps.Store(&m)
	if fb.faults.timed() {
		fb.sched.setEnabled(true)
	}
	return fb
}

// Attach connects a new endpoint with address gid. It fails with
// ErrGIDInUse if gid is attached, and with net.ErrClosed after Close. The
// endpoint is detached by its Close; its GID may then be attached again.
func (fb *Fabric) Attach(gid verbs.GID) (Wire, error) {
	fb.mu.Lock()
	defer fb.mu.Unlock()
	if fb.closed {
		return nil, fmt.Errorf("wire: attach %v: %w", gid, errClosed)
	}
	old := *fb.eps.Load()
	if _, ok := old[gid]; ok {
		return nil, fmt.Errorf("wire: attach %v: %w", gid, ErrGIDInUse)
	}
	e := &endpoint{
		fab:    fb,
		gid:    gid,
		done:   make(chan struct{}),
		wake:   make(chan struct{}, 1),
		rcache: cache{p: &fb.pool},
	}
	e.rx.ring = make([]*pbuf, RxQueueLen)
	e.rx.limit = RxQueueLen
	e.f = newFaulter(fb.faults, gid, &fb.pool, fb.sched, &e.cnt, e.transmit)
	m := make(map[verbs.GID]*endpoint, len(old)+1)
	for g, o := range old {
		m[g] = o
	}
	m[gid] = e
	fb.eps.Store(&m)
	fb.all = append(fb.all, e)
	return e, nil
}

func (fb *Fabric) detach(e *endpoint) {
	fb.mu.Lock()
	defer fb.mu.Unlock()
	old := *fb.eps.Load()
	if old[e.gid] != e {
		return
	}
	m := make(map[verbs.GID]*endpoint, len(old))
	for g, o := range old {
		if o != e {
			m[g] = o
		}
	}
	fb.eps.Store(&m)
}

// SetFaults replaces the fault model of every endpoint, present and future.
// Each sender's generator restarts from the new seed; packets already held
// or delayed keep their fate.
func (fb *Fabric) SetFaults(f Faults) {
	f = f.normalize()
	fb.mu.Lock()
	defer fb.mu.Unlock()
	fb.faults = f
	for _, e := range fb.all {
		e.f.mu.Lock()
		e.f.configure(f)
		e.f.mu.Unlock()
	}
	fb.sched.setEnabled(f.timed() && !fb.closed)
}

// Stats sums the counters of every endpoint the fabric has had.
func (fb *Fabric) Stats() Stats {
	fb.mu.Lock()
	defer fb.mu.Unlock()
	var s Stats
	for _, e := range fb.all {
		es := e.cnt.snapshot()
		s.add(&es)
	}
	return s
}

// Close closes every endpoint (held packets are delivered first, to
// whoever is still attached) and stops the timer goroutine, dropping the
// packets it still had (Stats.DropClosed of their senders). Later Attach
// calls fail. Close is idempotent.
func (fb *Fabric) Close() error {
	fb.mu.Lock()
	if fb.closed {
		fb.mu.Unlock()
		return nil
	}
	fb.closed = true
	all := append([]*endpoint(nil), fb.all...)
	fb.mu.Unlock()
	for _, e := range all {
		e.Close()
	}
	for _, b := range fb.sched.close() {
		b.owner.cnt.dropClosed.Add(1)
		fb.pool.put(b)
	}
	return nil
}

// endpoint is a Wire attached to a Fabric.
//
// Send side: f.mu is the send lock; it guards the faulter, batch and the
// sender's buffer cache. Receive side: recvMu serialises Recv and guards
// take and rcache; rx.mu guards the queue, which senders fill.
type endpoint struct {
	fab    *Fabric
	gid    verbs.GID
	f      *faulter
	cnt    counters
	closed atomic.Bool
	done   chan struct{} // closed by Close

	batch []*pbuf // packets for one destination, guarded by f.mu

	rx struct {
		mu      sync.Mutex
		ring    []*pbuf // len RxQueueLen
		head, n int
		limit   int  // packets the queue holds: len(ring) unless SetRxQueueLen
		waiting bool // Recv found the queue empty and waits on wake
		closed  bool
	}
	wake chan struct{} // capacity 1

	recvMu sync.Mutex
	take   []*pbuf
	rcache cache
}

var _ Wire = (*endpoint)(nil)

func (e *endpoint) LocalGID() verbs.GID { return e.gid }

func (e *endpoint) Stats() Stats { return e.cnt.snapshot() }

// Send passes each packet through the fault model, then copies what leaves
// now into pool buffers and queues it at its destination.
func (e *endpoint) Send(pkts []Packet) (int, error) {
	f := e.f
	f.mu.Lock()
	defer f.mu.Unlock()
	if e.closed.Load() {
		return 0, errClosed
	}
	f.sendAll(pkts)
	return len(pkts), nil
}

// transmit is the endpoint's sink: it queues packets at their destinations,
// one queue lock per run of packets to the same destination.
func (e *endpoint) transmit(out []outPkt) {
	f := e.f
	m := *e.fab.eps.Load()
	var dst *endpoint
	var dstGID verbs.GID
	for i := range out {
		o := &out[i]
		if g := o.dst(); i == 0 || g != dstGID {
			e.deliver(dst)
			dst, dstGID = m[g], g
		}
		if dst == nil {
			f.st.DropUnknown++
			if o.buf != nil {
				f.cache.put(o.buf)
			}
			continue
		}
		b := o.buf
		if b == nil {
			b = f.cache.load(o.data())
			b.dst = dstGID
		}
		b.src = e.gid
		e.batch = append(e.batch, b)
	}
	e.deliver(dst)
}

// deliver queues e.batch at dst. Packets that find the queue full are
// dropped at dst; a closed dst means the destination just went away.
func (e *endpoint) deliver(dst *endpoint) {
	if len(e.batch) == 0 {
		return
	}
	f := e.f
	// Count before the push: once queued, the receiver may take a buffer
	// and reuse it at once.
	var bytes uint64
	for _, b := range e.batch {
		bytes += uint64(b.n)
	}
	k, closed := dst.push(e.batch)
	rest := e.batch[k:]
	if closed {
		for _, b := range rest {
			bytes -= uint64(b.n)
		}
		f.st.DropUnknown += uint64(len(rest))
		f.st.TxPackets += uint64(k)
	} else {
		f.st.TxPackets += uint64(len(e.batch))
		if len(rest) > 0 {
			dst.cnt.dropQueueFull.Add(uint64(len(rest)))
		}
	}
	f.st.TxBytes += bytes
	for _, b := range rest {
		f.cache.put(b)
	}
	clear(e.batch)
	e.batch = e.batch[:0]
}

// push appends as many of bs as fit to the receive queue and returns how
// many; closed reports the endpoint closed (none taken).
func (e *endpoint) push(bs []*pbuf) (k int, closed bool) {
	r := &e.rx
	r.mu.Lock()
	if r.closed {
		r.mu.Unlock()
		return 0, true
	}
	k = max(0, min(len(bs), r.limit-r.n))
	tail := (r.head + r.n) & (len(r.ring) - 1)
	c := copy(r.ring[tail:], bs[:k])
	copy(r.ring, bs[c:k])
	r.n += k
	wake := r.waiting && k > 0
	if wake {
		r.waiting = false
	}
	r.mu.Unlock()
	if wake {
		select {
		case e.wake <- struct{}{}:
		default:
		}
	}
	return k, false
}

// SetRxQueueLen bounds the endpoint's receive queue at n packets, 1 to
// RxQueueLen: a device modelling a NIC's receive ring sets its depth.
func (e *endpoint) SetRxQueueLen(n int) error {
	if n < 1 || n > RxQueueLen {
		return fmt.Errorf("wire: receive queue of %d packets: want 1..%d", n, RxQueueLen)
	}
	e.rx.mu.Lock()
	e.rx.limit = n
	e.rx.mu.Unlock()
	return nil
}

// pop moves up to len(into) queued packets into into. When it finds the
// queue empty it marks the receiver waiting, so the next push wakes it.
func (e *endpoint) pop(into []*pbuf) (k int, closed bool) {
	r := &e.rx
	r.mu.Lock()
	if r.closed {
		r.mu.Unlock()
		return 0, true
	}
	k = min(len(into), r.n)
	if k == 0 {
		r.waiting = true
	} else {
		c := copy(into[:k], r.ring[r.head:])
		copy(into[c:k], r.ring)
		if c >= k {
			clear(r.ring[r.head : r.head+k])
		} else {
			clear(r.ring[r.head:])
			clear(r.ring[:k-c])
		}
		r.head = (r.head + k) & (len(r.ring) - 1)
		r.n -= k
	}
	r.mu.Unlock()
	return k, false
}

// Recv copies queued packets into pkts; it blocks while the queue is empty.
func (e *endpoint) Recv(pkts []Packet) (int, error) {
	e.recvMu.Lock()
	defer e.recvMu.Unlock()
	if len(pkts) == 0 {
		if e.closed.Load() {
			return 0, errClosed
		}
		return 0, nil
	}
	want := min(len(pkts), RxQueueLen)
	if len(e.take) < want {
		e.take = make([]*pbuf, want)
	}
	for {
		k, closed := e.pop(e.take[:want])
		if closed {
			return 0, errClosed
		}
		if k == 0 {
			select {
			case <-e.wake:
			case <-e.done:
			}
			continue
		}
		var st Stats
		j := 0
		for _, b := range e.take[:k] {
			if p := &pkts[j]; b.n > len(p.Buf) {
				st.DropTruncated++
			} else {
				copy(p.Buf, b.data())
				p.N, p.Addr = b.n, b.src
				st.RxPackets++
				st.RxBytes += uint64(b.n)
				j++
			}
			e.rcache.put(b)
		}
		clear(e.take[:k])
		e.cnt.add(&st)
		if j > 0 {
			return j, nil
		}
	}
}

// Close detaches the endpoint, delivers what its fault model held back,
// drops what was queued for it (Stats.DropClosed) and unblocks Recv.
func (e *endpoint) Close() error {
	if e.closed.Swap(true) {
		return nil
	}
	e.fab.detach(e)

	e.f.mu.Lock()
	e.f.releaseAll(true)
	e.f.flush()
	e.f.mu.Unlock()

	r := &e.rx
	r.mu.Lock()
	r.closed = true
	var dropped uint64
	for r.n > 0 {
		b := r.ring[r.head]
		r.ring[r.head] = nil
		r.head = (r.head + 1) & (len(r.ring) - 1)
		r.n--
		dropped++
		e.fab.pool.put(b)
	}
	r.mu.Unlock()
	e.cnt.dropClosed.Add(dropped)
	close(e.done)
	return nil
}
