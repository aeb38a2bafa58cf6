package engine

import (
	"context"

	"github.com/rdmavisor/rdmavisor/internal/engine/format"
)

// enqueue puts a vconn on the run queue and wakes the poller if it sleeps.
// Any goroutine (through VConn.schedule): it takes inbox.mu.
func (p *poller) enqueue(vc *VConn) {
	p.inbox.mu.Lock()
	p.inbox.runq = append(p.inbox.runq, vc)
	p.inbox.queued.Store(true)
	p.inbox.mu.Unlock()
	p.kick()
}

// repostRecv queues a receive buffer for the SRQ. Any goroutine (a
// reader's Release): it takes inbox.mu.
func (p *poller) repostRecv(slot bufSlot) {
	p.inbox.mu.Lock()
	p.inbox.repost = append(p.inbox.repost, slot)
	n := len(p.inbox.repost)
	p.inbox.queued.Store(true)
	p.inbox.mu.Unlock()
	if n == 1 || n >= 32 {
		p.kick()
	}
}

// took accounts for an entry taken from vc's ring. The poller, which
// consumes the ring.
func (p *poller) took(vc *VConn) {
	if vc.uncounted.Load() > 0 {
		vc.uncounted.Add(-1) // not in the backlog: see uncounted
		return
	}
	p.sched.popped++
}

// throttle blocks a sender while its QP's backlog is full; it returns
// ctx's error if ctx ends first. Messages queued beyond what the QP takes
// soon only wait, and go cold in the cache meanwhile: with thousands of
// vconns each holding a message or a few, a backlog bounded only by the
// buffer pool (16,384 small buffers) made every message a handful of
// cache misses. Bounding it keeps what the poller serves warm (as byte
// queue limits bound a NIC's queue), and costs senders nothing while it
// is not full. The sender's goroutine, before it takes sendMu.
func (q *sendQP) throttle(ctx context.Context) error {
	p := q.p
	for q.backlog.Load() >= q.maxBacklog && !p.loop.stopping.Load() {
		p.inbox.mu.Lock()
		q.throttled.Store(true)
		if q.backlog.Load() < q.maxBacklog || p.loop.stopping.Load() {
			p.inbox.mu.Unlock()
			return nil
		}
		if q.unthrottled == nil {
			q.unthrottled = make(chan struct{})
		}
		ch := q.unthrottled
		p.inbox.mu.Unlock()
		p.kick()
		select {
		case <-ch:
		case <-p.loop.done:
			return nil
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	return nil
}

// dequeued takes n messages the poller took from the rings of q's vconns
// off q's backlog, and wakes throttled senders once it is down to half.
// q's poller only.
func (q *sendQP) dequeued(n int32) {
	if n == 0 {
		return
	}
	if b := q.backlog.Add(-n); b <= q.maxBacklog/2 && q.throttled.Load() {
		p := q.p
		p.inbox.mu.Lock()
		q.throttled.Store(false)
		if q.unthrottled != nil {
			close(q.unthrottled)
			q.unthrottled = nil
		}
		p.inbox.mu.Unlock()
	}
}

// queue appends vc to its QP's run queue. The poller only.
func (p *poller) queue(vc *VConn) {
	q := vc.sq
	if !q.active {
		q.active = true
		p.sched.active = append(p.sched.active, q)
	}
	q.runq = append(q.runq, vc)
}

// serveQP serves q's run queue in order until a vconn cannot go on for
// lack of room (it went on p.sched.later, and so to the queue's tail next
// round). The poller only.
func (p *poller) serveQP(q *sendQP) {
	if q.outstanding+len(q.batch) >= p.e.cfg.SQDepth || p.tx.budget <= 0 {
		return // no room: the queue waits for completions
	}
	i := q.runHead
	for i < len(q.runq) {
		if (i-q.runHead)%touchAhead == 0 {
			p.touch(q.runq[i:min(i+touchAhead, len(q.runq))])
		}
		vc := q.runq[i]
		q.runq[i] = nil
		i++
		vc.scheduled.Store(false)
		n := len(p.sched.later)
		p.serve(vc)
		if len(p.sched.later) > n {
			break
		}
	}
	q.dequeued(p.sched.popped)
	p.sched.popped = 0
	switch {
	case i == len(q.runq):
		q.runq, q.runHead = q.runq[:0], 0
	case i > len(q.runq)/2:
		m := copy(q.runq, q.runq[i:])
		clear(q.runq[m:])
		q.runq, q.runHead = q.runq[:m], 0
	default:
		q.runHead = i
	}
}

// touchAhead is how many vconns the poller touches at once before
// serving them.
const touchAhead = 16

// touch reads the hot cache lines of vconns about to be served. With many
// vconns each is touched about once per message, long after the last time,
// so it is rarely in cache; loads that do not depend on each other let the
// CPU wait for those misses together instead of one after another. The
// poller only; it only reads.
func (p *poller) touch(vcs []*VConn) {
	var x uint32
	for _, vc := range vcs {
		x += vc.state.Load() + vc.remote.Load() // the two hot lines
	}
	// Then the oldest queued buffer of each, which its sender just wrote.
	pool := p.e.pool
	for _, vc := range vcs {
		if ent, ok := vc.ring.peek(&vc.ents); ok && ent.slot() != opMarker {
			x += uint32(format.Raw(pool.bytes(ent.slot())).Type())
		}
	}
	p.rx.sink += x
}
