package engine

import (
	"errors"
	"fmt"
	"os"
	"runtime"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/sys/unix"

	"github.com/rdmavisor/rdmavisor/internal/engine/reliable"
	"github.com/rdmavisor/rdmavisor/internal/verbs"
)

// poller owns one CQ and the QPs that complete on it. Its loop posts what
// vconns queued (one PostSend per QP per round: many WRs per doorbell),
// reposts released receive buffers to the SRQ, and polls and dispatches
// completions. When a round finds nothing to do SpinPolls times in a row it
// arms the CQ and parks on its wake channel, which a completion event or
// a kick fills (see sleep).
//
// Its work is split by flow, as are the files and its fields (each group
// says who may touch it, as wireguard-go's Peer does): the loop, its clock
// and its sleep (poller.go, loop); what other goroutines hand it and which
// vconns are served when, and senders' back pressure (sched.go, inbox and
// sched); moving a vconn's queued buffers into work requests (serve.go)
// and posting them (tx.go, tx); send completions and QP failure
// (complete.go); receives, demultiplexed and reassembled (rx.go, rx);
// Auto's timers (auto.go, rel). Only the poller's goroutine runs its
// methods, but for kick, enqueue and repostRecv (sched.go), which any
// goroutine may call.
type poller struct {
	e   *Engine
	idx int
	cq  verbs.CQ

	loop  pollerLoop  // its loop: spinning, sleeping, stopping
	inbox pollerInbox // what other goroutines hand it (sched.go)
	sched pollerSched // which vconns it serves when (sched.go)
	tx    pollerTx    // the work requests it posts (serve.go, tx.go)
	rx    pollerRx    // the completions it handles (complete.go, rx.go)
	udq   pollerUD    // its UD QP, shared by every peer
	rel   pollerRel   // Auto's timers (auto.go)

	// sendQPs maps QPNs of send QPs on this CQ to their state, for
	// completions; written when a QP is created.
	sendQPs sync.Map // uint32 → *sendQP

	st pollerCounters // written by the poller, read by Stats (stats.go)
}

// pollerLoop is the poller's loop state. sleeping and stopping are read
// by any goroutine (kick, throttle); done closes when the loop ends; the
// rest is the poller goroutine's.
type pollerLoop struct {
	// wake holds a wake-up for the sleeping poller: a kick's, or the
	// CQ's completion event (verbs.Notifier, or relayed from its FD).
	wake     chan struct{}
	sleeping atomic.Bool
	stopping atomic.Bool
	done     chan struct{}
	started  bool
	now      time.Time   // the coarse clock (see clock)
	busy     bool        // in a run of busy rounds (stats.go)
	timer    *time.Timer // a sleep's bound, when it has one
	relay    *os.File    // a dup of the CQ's FD, for a CQ that is no Notifier
	// deaf: the relay stopped on a failing completion channel; sleeps
	// are bounded (a millisecond) so that completions are still polled.
	deaf atomic.Bool
}

// pollerInbox is what vconns and readers hand the poller: any goroutine,
// under mu.
type pollerInbox struct {
	mu     sync.Mutex
	runq   []*VConn  // vconns with work
	repost []bufSlot // receive buffers to give back to the SRQ
	// queued is set, under mu, when runq or repost gains an entry, so a
	// round with nothing queued takes no lock.
	queued atomic.Bool
}

// pollerSched is which vconns the poller serves when (sched.go). Poller
// goroutine only.
type pollerSched struct {
	work   []*VConn  // taken from the inbox this round
	later  []*VConn  // found no room: next round, behind their QPs' queues
	active []*sendQP // QPs whose run queues hold vconns
	popped int32     // messages serve took from rings, for the QP's backlog
}

// pollerTx is what the poller posts (serve.go, tx.go). Poller goroutine
// only.
type pollerTx struct {
	dirty   []*sendQP // QPs with a batch to post
	budget  int       // sends this CQ may still have outstanding
	confirm []uint32  // unexport confirmations being posted (confirmUnexports)
}

// pollerRx is what the poller's completions use (complete.go, rx.go).
// Poller goroutine only.
type pollerRx struct {
	wcs     []verbs.WC
	vcs     []*VConn // the vconns of wcs' receives
	reposts []bufSlot
	recvWRs []verbs.RecvWR
	sink    uint32 // what touch read, so the reads are not optimised away
}

// pollerUD is the poller's UD QP, shared by every peer. Poller goroutine
// only.
type pollerUD struct {
	qp   *sendQP
	qpn  uint32    // qp's QPN, read on every receive (see isUD)
	dead []*sendQP // failed UD QPs awaiting their last completions
}

// pollerRel is what a poller keeps for the Auto vconns whose send sides
// it owns: their retransmission and delayed-acknowledgement timers.
// Owned by the poller goroutine, but for soon.
type pollerRel struct {
	rtx   []*VConn    // Auto vconns with datagrams awaiting ACKs
	rtxAt time.Time   // next retransmission scan
	acks  []ackWaiter // Auto vconns with delayed acknowledgements
	ackAt time.Time   // when they go out
	soon  atomic.Bool // any poller: a peer reported a gap, retransmit now (see onGap)
}

// pollBatch is the most completions one CQ poll takes.
const pollBatch = 256

// clockRounds is how many empty rounds the coarse clock lasts (see clock):
// a few µs.
const clockRounds = 8

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

// openUD creates the poller's UD QP on the datagram SRQ.
func (p *poller) openUD() error {
	e := p.e
	qp, err := e.pd.CreateQP(&verbs.QPInitAttr{
		Type: verbs.QPTypeUD, SendCQ: p.cq, RecvCQ: p.cq, SRQ: e.dsrq,
		Cap: verbs.QPCap{MaxSendWR: uint32(e.cfg.SQDepth), MaxSendSGE: 1, MaxRecvSGE: 1},
	})
	if err != nil {
		return fmt.Errorf("engine: poller %d UD QP: %w", p.idx, err)
	}
	if err := verbs.ActivateUD(qp, e.cfg.QKey, 0); err != nil {
		_ = qp.Close()
		return fmt.Errorf("engine: poller %d: %w", p.idx, err)
	}
	p.udq.qp = &sendQP{qp: qp, p: p}
	p.udq.qpn = qp.QPN()
	p.sendQPs.Store(qp.QPN(), p.udq.qp)
	return nil
}

// kick wakes the poller if it sleeps. Any goroutine.
func (p *poller) kick() {
	if p.loop.sleeping.Load() {
		select {
		case p.loop.wake <- struct{}{}:
		default: // a wake-up is pending already
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

// clock is the poller's coarse time, read again after a round that did
// work, every clockRounds rounds that did not, and after a sleep: datagram
// timestamps and the acknowledgement delay need a resolution well under
// reliable.LossyMinRTO, not a clock read (46 ns here) in each of the millions of
// empty rounds a second a spinning poller makes. Only intervals matter,
// so it reads the monotonic clock alone, as time.Since does (25 ns here,
// where time.Now also reads the wall clock); its wall reading is the
// epoch's advanced by as much.
func (p *poller) clock() time.Time {
	if p.loop.now.IsZero() {
		p.loop.now = p.e.epoch.Add(time.Since(p.e.epoch))
	}
	return p.loop.now
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
	if len(p.rel.rtx) == 0 && len(p.sched.active) == 0 && len(p.sched.later) == 0 && !p.loop.deaf.Load() {
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
