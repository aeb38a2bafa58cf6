package engine

import (
	"errors"
	"fmt"
	"os"
	"runtime"
	"time"

	"golang.org/x/sys/unix"

	"github.com/rdmavisor/rdmavisor/internal/engine/reliable"
	"github.com/rdmavisor/rdmavisor/internal/verbs"
)

func newPoller(e *Engine, idx int) (*poller, error) {
	cq, err := e.dev.CreateCQ(e.cfg.cqDepth)
	if err != nil {
		return nil, fmt.Errorf("engine: poller %d CQ: %w", idx, err)
	}
	p := &poller{
		e: e, idx: idx, cq: cq,
		loop: pollerLoop{wake: make(chan struct{}, 1), done: make(chan struct{})},
		rx:   pollerRx{wcs: make([]verbs.WC, pollBatch), vcs: make([]*VConn, pollBatch)},
		tx:   pollerTx{budget: e.cfg.sendBudget()},
	}
	if n, ok := cq.(verbs.Notifier); ok {
		n.NotifyTo(p.loop.wake)
		return p, nil
	}
	// A CQ whose events come only on its FD (a NIC's completion
	// channel): a goroutine parked in the network poller on a copy of
	// the descriptor passes them on (relayEvents).
	fd, err := unix.Dup(cq.FD())
	if err == nil {
		err = unix.SetNonblock(fd, true)
	}
	if err != nil {
		if fd >= 0 {
			_ = unix.Close(fd)
		}
		_ = cq.Close()
		return nil, fmt.Errorf("engine: poller %d completion channel: %w", idx, err)
	}
	p.loop.relay = os.NewFile(uintptr(fd), "cq-channel")
	return p, nil
}

// relayEvents passes the CQ's completion events from its FD to the wake
// channel until the poller closes the descriptor's copy.
func (p *poller) relayEvents() {
	rc, err := p.loop.relay.SyscallConn()
	if err != nil {
		return
	}
	for {
		var ackErr error
		err := rc.Read(func(uintptr) bool {
			n, err := p.cq.AckEvents()
			ackErr = err
			return n > 0 || err != nil
		})
		if err != nil {
			return // the copy was closed: the poller is closing
		}
		select {
		case p.loop.wake <- struct{}{}:
		default:
		}
		if ackErr != nil {
			// A channel that fails to read would wake the poller in a
			// loop: stop relaying, and have the poller look every
			// millisecond instead.
			p.e.log.Error(ackErr, "Completion channel failed: polling the CQ every millisecond", "poller", p.idx)
			p.loop.deaf.Store(true)
			return
		}
	}
}

func (p *poller) run() {
	defer close(p.loop.done)
	if p.loop.relay != nil {
		go p.relayEvents()
	}
	idle := 0
	for !p.loop.stopping.Load() {
		if p.round() {
			idle = 0
			if !p.loop.busy {
				p.beginBusy()
			}
			p.loop.now = time.Time{} // that took time: read the clock again
			continue
		}
		if p.loop.busy {
			p.endBusy()
		}
		if idle++; idle%clockRounds == 0 {
			p.loop.now = time.Time{}
		}
		// Spin a while, yielding, only where Ps are to spare (SpinPolls'
		// default): a yielding spinner goes straight back on the run
		// queue, so a P that always has it to run never looks at the
		// network poller, where the UDP device's receiver and the
		// application's sockets wait. On two CPUs shared with other
		// work that made every hop wait for sysmon (up to 10 ms).
		if idle < p.e.cfg.SpinPolls {
			runtime.Gosched()
			continue
		}
		idle = 0
		p.sleep()
	}
}

// round does one pass of work; it reports whether there was any.
func (p *poller) round() bool {
	if p.inbox.queued.Load() {
		p.inbox.mu.Lock()
		p.sched.work, p.inbox.runq = p.inbox.runq, p.sched.work[:0]
		p.rx.reposts = append(p.rx.reposts, p.inbox.repost...)
		p.inbox.repost = p.inbox.repost[:0]
		p.inbox.queued.Store(false)
		p.inbox.mu.Unlock()
	}
	busy := len(p.sched.work) > 0 || len(p.rx.reposts) > 0
	if len(p.sched.repairs) > 0 {
		p.finishRepairs()
	}

	// Vconns with work wait on their QP's run queue; a QP's queue is
	// served in order until the QP (or the CQ) has no room, and the rest
	// wait there for the next round. A round's cost is then in proportion
	// to what it posts, not to the number of vconns waiting.
	for i, vc := range p.sched.work {
		p.queue(vc)
		p.sched.work[i] = nil
	}
	p.sched.work = p.sched.work[:0]
	for i, vc := range p.sched.later {
		p.queue(vc)
		p.sched.later[i] = nil
	}
	p.sched.later = p.sched.later[:0]
	k := 0
	for _, q := range p.sched.active {
		p.serveQP(q)
		if q.runHead < len(q.runq) {
			p.sched.active[k] = q
			k++
		} else {
			q.active = false
		}
	}
	clear(p.sched.active[k:])
	p.sched.active = p.sched.active[:k]
	if p.flushSends() {
		busy = true
	}

	n := p.cq.Poll(p.rx.wcs)
	p.completeAll(n)
	p.flushReposts()
	if len(p.rel.acks) > 0 {
		if now := p.clock(); p.rel.ackAt.IsZero() {
			p.rel.ackAt = now.Add(reliable.AckDelay)
		} else if !now.Before(p.rel.ackAt) {
			p.rel.ackAt = time.Time{}
			p.flushAcks()
			busy = true // the acknowledgements go out next round
		}
	}
	if len(p.rel.rtx) > 0 {
		soon := p.rel.soon.Load() && p.rel.soon.Swap(false)
		if now := p.clock(); soon || now.After(p.rel.rtxAt) {
			p.rel.rtxAt = now.Add(reliable.LossyMinRTO / 4)
			p.retransmit(now)
			p.flushSends()
		}
	}
	return busy || n > 0
}

// sleep parks the poller until a completion or a kick. The CQ is armed
// and the queues rechecked before it parks, so nothing that arrives
// meanwhile is missed. Acknowledgements still delayed go out now rather
// than wait on a timer: a timer fires at the kernel's tick (1 ms on some
// machines), and an ack that late holds the sender's window.
func (p *poller) sleep() {
	if len(p.rel.acks) > 0 {
		p.rel.ackAt = time.Time{}
		p.flushAcksNow()
		return
	}
	p.loop.sleeping.Store(true)
	defer p.loop.sleeping.Store(false)
	if err := p.cq.ReqNotify(false); err != nil {
		return
	}
	if p.inbox.queued.Load() || p.loop.stopping.Load() {
		return
	}
	if n := p.cq.Poll(p.rx.wcs); n > 0 {
		p.completeAll(n)
		p.flushReposts()
		return
	}
	p.e.stats.sleeps.Add(1)
	defer func() { p.loop.now = time.Time{} }()
	if len(p.rel.rtx) == 0 && len(p.sched.active) == 0 && len(p.sched.later) == 0 && len(p.sched.repairs) == 0 && !p.loop.deaf.Load() {
		<-p.loop.wake
		return
	}
	// Datagrams await acknowledgement, or vconns room that a
	// completion should bring, or no completion event comes: look again
	// within a millisecond.
	if p.loop.timer == nil {
		p.loop.timer = time.NewTimer(time.Millisecond)
	} else {
		p.loop.timer.Reset(time.Millisecond)
	}
	select {
	case <-p.loop.wake:
		p.loop.timer.Stop()
	case <-p.loop.timer.C:
	}
}

func (p *poller) stop() {
	p.loop.stopping.Store(true)
	p.loop.sleeping.Store(true)
	p.kick()
	if p.loop.started {
		<-p.loop.done
	}
}

func (p *poller) close() error {
	var errs []error
	for _, q := range append(p.udq.dead, p.udq.qp) {
		if q != nil {
			errs = append(errs, q.qp.Close())
		}
	}
	if p.loop.relay != nil {
		errs = append(errs, p.loop.relay.Close()) // ends relayEvents
	}
	return errors.Join(append(errs, p.cq.Close())...)
}
