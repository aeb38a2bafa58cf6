package engine

import (
	"encoding/binary"
	"errors"
	"fmt"
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
// arms the CQ and sleeps in poll(2) on the completion channel and its wake
// eventfd.
//
// Its work is split by flow, as are the files: the loop, its clock and
// its sleep (poller.go); which vconns are served when, and senders' back
// pressure (sched.go); moving queued buffers into work requests and
// posting them (tx.go); send completions and QP failure (complete.go);
// receives, demultiplexed and reassembled (rx.go).
type poller struct {
	e    *Engine
	idx  int
	cq   verbs.CQ
	wake int // eventfd: work was queued while the poller slept

	sleeping atomic.Bool
	stopping atomic.Bool
	done     chan struct{}
	started  bool

	mu     sync.Mutex
	runq   []*VConn  // vconns with work; guarded by mu
	repost []bufSlot // receive buffers to give back to the SRQ; guarded by mu
	// queued is set, under mu, when runq or repost gains an entry, so a
	// round with nothing queued takes no lock.
	queued atomic.Bool

	// Owned by the poller goroutine.
	work    []*VConn
	later   []*VConn
	active  []*sendQP // QPs whose run queues hold vconns
	reposts []bufSlot
	dirty   []*sendQP
	wcs     []verbs.WC
	rxVC    []*VConn // the vconns of wcs' receives
	sink    uint32   // what touch read, so the reads are not optimised away
	popped  int32    // messages serve took from rings, for the QP's backlog
	recvWRs []verbs.RecvWR
	confirm []uint32  // unexport confirmations being posted (confirmUnexports)
	budget  int       // sends this CQ may still have outstanding
	ud      *sendQP   // this poller's UD QP, shared by every peer
	udQPN   uint32    // ud's QPN, read on every receive (see isUD)
	deadUD  []*sendQP // failed UD QPs awaiting their last completions
	now     time.Time // the coarse clock (see clock)
	fds     [2]unix.PollFd

	// sendQPs maps QPNs of send QPs on this CQ to their state, for
	// completions; written when a QP is created.
	sendQPs sync.Map // uint32 → *sendQP

	rel pollerRel // Auto's timers (auto.go)

	busy bool           // owned by the poller: in a run of busy rounds
	st   pollerCounters // written by the poller, read by Stats (stats.go)
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
	fd, err := unix.Eventfd(0, unix.EFD_NONBLOCK|unix.EFD_CLOEXEC)
	if err != nil {
		_ = cq.Close()
		return nil, fmt.Errorf("engine: poller %d eventfd: %w", idx, err)
	}
	return &poller{
		e: e, idx: idx, cq: cq, wake: fd, done: make(chan struct{}),
		wcs:    make([]verbs.WC, pollBatch),
		rxVC:   make([]*VConn, pollBatch),
		budget: e.cfg.sendBudget(),
	}, nil
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
	p.ud = &sendQP{qp: qp, p: p}
	p.udQPN = qp.QPN()
	p.sendQPs.Store(qp.QPN(), p.ud)
	return nil
}

func (p *poller) kick() {
	if p.sleeping.Load() {
		var one [8]byte
		binary.NativeEndian.PutUint64(one[:], 1)
		_, _ = unix.Write(p.wake, one[:])
	}
}

func (p *poller) run() {
	defer close(p.done)
	idle := 0
	for !p.stopping.Load() {
		if p.round() {
			idle = 0
			if !p.busy {
				p.beginBusy()
			}
			p.now = time.Time{} // that took time: read the clock again
			continue
		}
		if p.busy {
			p.endBusy()
		}
		if idle++; idle%clockRounds == 0 {
			p.now = time.Time{}
		}
		// Spin a while, yielding: the completions come from goroutines
		// that need the core. Then sleep, even with vconns waiting for
		// room on a QP (their completions wake the poller): yielding
		// forever starved the goroutines that wait in the runtime's
		// network poller, which a P only checks when it has nothing
		// else to run, or every 10 ms. A UDP device's receive loop is
		// one: with a send queue full, ACKs then took 5 ms to come in,
		// and 64 producers on one QP ran at 3-10% of their rate.
		// Delayed acknowledgements are due within reliable.AckDelay: those
		// keep the poller spinning.
		if idle < p.e.cfg.SpinPolls || len(p.rel.acks) > 0 {
			runtime.Gosched()
			continue
		}
		idle = 0
		p.sleep()
	}
}

// round does one pass of work; it reports whether there was any.
func (p *poller) round() bool {
	if p.queued.Load() {
		p.mu.Lock()
		p.work, p.runq = p.runq, p.work[:0]
		p.reposts = append(p.reposts, p.repost...)
		p.repost = p.repost[:0]
		p.queued.Store(false)
		p.mu.Unlock()
	}
	busy := len(p.work) > 0 || len(p.reposts) > 0

	// Vconns with work wait on their QP's run queue; a QP's queue is
	// served in order until the QP (or the CQ) has no room, and the rest
	// wait there for the next round. A round's cost is then in proportion
	// to what it posts, not to the number of vconns waiting.
	for i, vc := range p.work {
		p.queue(vc)
		p.work[i] = nil
	}
	p.work = p.work[:0]
	for i, vc := range p.later {
		p.queue(vc)
		p.later[i] = nil
	}
	p.later = p.later[:0]
	k := 0
	for _, q := range p.active {
		p.serveQP(q)
		if q.runHead < len(q.runq) {
			p.active[k] = q
			k++
		} else {
			q.active = false
		}
	}
	clear(p.active[k:])
	p.active = p.active[:k]
	if p.flushSends() {
		busy = true
	}

	n := p.cq.Poll(p.wcs)
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
			p.rel.rtxAt = now.Add(reliable.MinRTO / 4)
			p.retransmit(now)
			p.flushSends()
		}
	}
	return busy || n > 0
}

// clock is the poller's coarse time, read again after a round that did
// work, every clockRounds rounds that did not, and after a sleep: datagram
// timestamps and the acknowledgement delay need a resolution well under
// reliable.MinRTO, not a clock read (46 ns here) in each of the millions of
// empty rounds a second a spinning poller makes. Only intervals matter,
// so it reads the monotonic clock alone, as time.Since does (25 ns here,
// where time.Now also reads the wall clock); its wall reading is the
// epoch's advanced by as much.
func (p *poller) clock() time.Time {
	if p.now.IsZero() {
		p.now = p.e.epoch.Add(time.Since(p.e.epoch))
	}
	return p.now
}

// sleep blocks until a completion or a kick. The CQ is armed and the
// queues rechecked before blocking, so nothing that arrives meanwhile is
// missed.
func (p *poller) sleep() {
	p.sleeping.Store(true)
	defer p.sleeping.Store(false)
	if err := p.cq.ReqNotify(false); err != nil {
		return
	}
	p.mu.Lock()
	pending := len(p.runq) > 0 || len(p.repost) > 0
	p.mu.Unlock()
	if pending || p.stopping.Load() {
		return
	}
	if n := p.cq.Poll(p.wcs); n > 0 {
		p.completeAll(n)
		p.flushReposts()
		return
	}
	p.e.stats.sleeps.Add(1)
	defer func() { p.now = time.Time{} }()
	p.fds = [2]unix.PollFd{{Fd: int32(p.cq.FD()), Events: unix.POLLIN}, {Fd: int32(p.wake), Events: unix.POLLIN}}
	timeout := -1
	if len(p.rel.rtx) > 0 || len(p.active) > 0 || len(p.later) > 0 {
		// Datagrams await acknowledgement, or vconns room that a
		// completion should bring: look again within a millisecond.
		timeout = 1
	}
	for {
		_, err := unix.Poll(p.fds[:], timeout)
		if err == nil || !errors.Is(err, unix.EINTR) {
			break
		}
	}
	_, _ = p.cq.AckEvents()
	var buf [8]byte
	_, _ = unix.Read(p.wake, buf[:])
}

func (p *poller) stop() {
	p.stopping.Store(true)
	p.sleeping.Store(true)
	p.kick()
	if p.started {
		<-p.done
	}
}

func (p *poller) close() error {
	var errs []error
	for _, q := range append(p.deadUD, p.ud) {
		if q != nil {
			errs = append(errs, q.qp.Close())
		}
	}
	return errors.Join(append(errs, p.cq.Close(), unix.Close(p.wake))...)
}
