package engine

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"runtime"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/sys/unix"

	"github.com/rdmavisor/rdmavisor/internal/verbs"
	"github.com/rdmavisor/rdmavisor/internal/vqpn"
)

// poller owns one CQ and the QPs that complete on it. Its loop posts what
// vconns queued (one PostSend per QP per round: many WRs per doorbell),
// reposts released receive buffers to the SRQ, and polls and dispatches
// completions. When a round finds nothing to do SpinPolls times in a row it
// arms the CQ and sleeps in poll(2) on the completion channel and its wake
// eventfd.
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
	runq   []*VConn // vconns with work; guarded by mu
	repost []uint32 // receive buffers to give back to the SRQ; guarded by mu
	// queued is set, under mu, when runq or repost gains an entry, so a
	// round with nothing queued takes no lock.
	queued atomic.Bool

	// Owned by the poller goroutine.
	work    []*VConn
	later   []*VConn
	active  []*sendQP // QPs whose run queues hold vconns
	reposts []uint32
	dirty   []*sendQP
	wcs     []verbs.WC
	rxVC    []*VConn // the vconns of wcs' receives
	sink    uint32   // what touch read, so the reads are not optimised away
	popped  int32    // messages serve took from rings, for the QP's backlog
	recvWRs []verbs.RecvWR
	budget  int         // sends this CQ may still have outstanding
	ud      *sendQP     // this poller's UD QP, shared by every peer
	deadUD  []*sendQP   // failed UD QPs awaiting their last completions
	rtx     []*VConn    // Auto vconns with datagrams awaiting ACKs
	rtxAt   time.Time   // next retransmission scan
	acks    []ackWaiter // Auto vconns with delayed acknowledgements
	ackAt   time.Time   // when they go out
	rtxSoon atomic.Bool // a peer reported a gap: retransmit now (see onGap)
	now     time.Time   // the coarse clock (see clock)
	fds     [2]unix.PollFd

	// sendQPs maps QPNs of send QPs on this CQ to their state, for
	// completions; written when a QP is created.
	sendQPs sync.Map // uint32 → *sendQP
}

// pollBatch is the most completions one CQ poll takes.
const pollBatch = 256

// clockRounds is how many empty rounds the coarse clock lasts (see clock):
// a few µs.
const clockRounds = 8

// The wr_id of a SEND carries, above the buffer's slot, what its
// completion must do, so the completion need not read the buffer back.
const (
	wrSent   = 1 << 31   // the last chunk of a data message: count it sent
	wrFin    = 1 << 30   // a FIN
	wrShared = 1 << 29   // a shared buffer (bufPool.share): unref, not put
	wrGather = 1 << 28   // a gathered bundle's header buffer: free its messages' too
	slotMask = 1<<28 - 1 // a slot is class<<24 | index, and there are five classes
)

func newPoller(e *Engine, idx int) (*poller, error) {
	cq, err := e.dev.CreateCQ(cqDepth)
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
		budget: cqDepth - e.cfg.RecvBuffers - pollBatch,
	}, nil
}

// udFailed replaces a UD QP that went to ERR (datagrams in flight are
// lost, as datagrams may be); the dead one is destroyed once drained.
func (p *poller) udFailed(q *sendQP, err error) {
	if q == p.ud {
		p.e.log.Info("UD QP failed; replacing it", "qpn", q.qp.QPN(), "err", err)
		p.deadUD = append(p.deadUD, q)
		if err := p.openUD(); err != nil {
			p.e.log.Error(err, "Replacing the UD QP failed")
		}
	}
	for i, x := range p.deadUD {
		if x == q && q.outstanding <= 0 {
			p.sendQPs.Delete(q.qp.QPN())
			_ = q.qp.Close()
			p.deadUD = append(p.deadUD[:i], p.deadUD[i+1:]...)
			break
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
	p.ud = &sendQP{qp: qp, p: p}
	p.sendQPs.Store(qp.QPN(), p.ud)
	return nil
}

// enqueue puts a vconn on the run queue and wakes the poller if it sleeps.
func (p *poller) enqueue(vc *VConn) {
	p.mu.Lock()
	p.runq = append(p.runq, vc)
	p.queued.Store(true)
	p.mu.Unlock()
	p.kick()
}

// repostRecv queues a receive buffer for the SRQ.
func (p *poller) repostRecv(slot uint32) {
	p.mu.Lock()
	p.repost = append(p.repost, slot)
	n := len(p.repost)
	p.queued.Store(true)
	p.mu.Unlock()
	if n == 1 || n >= 32 {
		p.kick()
	}
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
			p.now = time.Time{} // that took time: read the clock again
			continue
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
		// Delayed acknowledgements are due within relAckDelay: those
		// keep the poller spinning.
		if idle < p.e.cfg.SpinPolls || len(p.acks) > 0 {
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
	if len(p.acks) > 0 {
		if now := p.clock(); p.ackAt.IsZero() {
			p.ackAt = now.Add(relAckDelay)
		} else if !now.Before(p.ackAt) {
			p.ackAt = time.Time{}
			p.flushAcks()
			busy = true // the acknowledgements go out next round
		}
	}
	if len(p.rtx) > 0 {
		soon := p.rtxSoon.Load() && p.rtxSoon.Swap(false)
		if now := p.clock(); soon || now.After(p.rtxAt) {
			p.rtxAt = now.Add(relMinRTO / 4)
			p.retransmit(now)
			p.flushSends()
		}
	}
	return busy || n > 0
}

// clock is the poller's coarse time, read again after a round that did
// work, every clockRounds rounds that did not, and after a sleep: datagram
// timestamps and the acknowledgement delay need a resolution well under
// relMinRTO, not a clock read (46 ns here) in each of the millions of
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

// took accounts for an entry taken from vc's ring.
func (p *poller) took(vc *VConn) {
	if vc.uncounted > 0 {
		vc.uncounted-- // taken off the backlog when vc stalled
		return
	}
	p.popped++
}

// throttle blocks a sender while its QP's backlog is full; it returns
// ctx's error if ctx ends first. Messages queued beyond what the QP takes
// soon only wait, and go cold in the cache meanwhile: with thousands of
// vconns each holding a message or a few, a backlog bounded only by the
// buffer pool (16,384 small buffers) made every message a handful of
// cache misses. Bounding it keeps what the poller serves warm (as byte
// queue limits bound a NIC's queue), and costs senders nothing while it
// is not full.
func (q *sendQP) throttle(ctx context.Context) error {
	p := q.p
	for q.backlog.Load() >= q.maxBacklog && !p.stopping.Load() {
		p.mu.Lock()
		q.throttled.Store(true)
		if q.backlog.Load() < q.maxBacklog || p.stopping.Load() {
			p.mu.Unlock()
			return nil
		}
		if q.unthrottled == nil {
			q.unthrottled = make(chan struct{})
		}
		ch := q.unthrottled
		p.mu.Unlock()
		p.kick()
		select {
		case <-ch:
		case <-p.done:
			return nil
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	return nil
}

// dequeued takes n messages the poller took from the rings of q's vconns
// off q's backlog, and wakes throttled senders once it is down to half.
func (q *sendQP) dequeued(n int32) {
	if n == 0 {
		return
	}
	if b := q.backlog.Add(-n); b <= q.maxBacklog/2 && q.throttled.Load() {
		p := q.p
		p.mu.Lock()
		q.throttled.Store(false)
		if q.unthrottled != nil {
			close(q.unthrottled)
			q.unthrottled = nil
		}
		p.mu.Unlock()
	}
}

// queue appends vc to its QP's run queue.
func (p *poller) queue(vc *VConn) {
	q := vc.sq
	if !q.active {
		q.active = true
		p.active = append(p.active, q)
	}
	q.runq = append(q.runq, vc)
}

// serveQP serves q's run queue in order until a vconn cannot go on for
// lack of room (it went on p.later, and so to the queue's tail next round).
func (p *poller) serveQP(q *sendQP) {
	if q.outstanding+len(q.batch) >= p.e.cfg.SQDepth || p.budget <= 0 {
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
		n := len(p.later)
		p.serve(vc)
		if len(p.later) > n {
			break
		}
	}
	q.dequeued(p.popped)
	p.popped = 0
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
	if len(p.rtx) > 0 || len(p.active) > 0 || len(p.later) > 0 {
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

// serve moves a vconn's queued buffers into its QP's batch, as far as
// credits and the send queue allow.
func (p *poller) serve(vc *VConn) {
	e := p.e
	q := vc.sq
	st := vc.state.Load()
	remote := vqpn.ID(vc.remote.Load())
	if st == stateClosed || st == stateFailed {
		// Nothing more is sent: return what is queued to the pool.
		if vc.tr == Auto {
			p.dropUnacked(vc)
		}
		for {
			ent, ok := vc.ring.peek(&vc.ents)
			if !ok {
				break
			}
			e.pool.put(uint32(ent >> 32))
			vc.ring.pop()
			p.took(vc)
		}
		vc.wakeSender()
		if vc.rstDue.Swap(false) {
			p.control(q, vc, remote, msgReset)
		}
		return
	}
	if !remote.Valid() {
		return // not connected yet; Connect's sends reschedule
	}
	// (Auto's own fields are off the hot lines: other vconns never read them.)
	if vc.tr == Auto && vc.ackRecv.Load() && vc.ackRecv.Swap(false) {
		p.freeAcked(vc, vc.reliability()) // another poller received them
	}
	limit := e.cfg.SQDepth
	for {
		ent, ok := vc.ring.peek(&vc.ents)
		if !ok {
			break
		}
		slot, n := uint32(ent>>32), uint32(ent)
		if slot == opMarker {
			o := &vc.regions.Load().op
			if q.outstanding+len(q.batch)+len(o.wrs) > limit || p.budget < len(o.wrs) {
				p.later = append(p.later, vc)
				vc.scheduled.Store(true)
				break
			}
			for _, wr := range o.wrs {
				p.postWR(q, wr)
			}
			vc.ring.pop()
			p.took(vc)
			continue
		}
		b := e.pool.bytes(slot)
		data := msgType(b[0]) == msgData
		// Data goes on the vconn's transport; control always on RC.
		// Only reliable data consumes receive credits: a lost datagram
		// would take its credit with it.
		dq := q
		if data {
			switch vc.tr {
			case UD:
				dq = p.ud
			case UC:
				dq = vc.dq
			}
		}
		// Only whole messages go as datagrams: the chunks of a long one
		// all travel on RC, in order.
		auto := data && vc.tr == Auto && b[1]&(flagFirst|flagLast) == flagFirst|flagLast && vc.autoDgram(n)
		if auto {
			dq = vc.dq
		}
		credited := data && (dq == q || auto)
		if credited && vc.sent == vc.limit.Load() {
			e.stats.creditStalls.Add(1)
			// What waits for the peer's reader does not count in the
			// QP's backlog, or one slow reader would throttle every
			// sender on the QP.
			if k := int32(vc.ring.len()) - vc.uncounted; k > 0 {
				vc.uncounted += k
				p.popped += k
			}
			break // the peer's grant reschedules us
		}
		if dq.outstanding+len(dq.batch) >= limit || p.budget <= 0 {
			p.later = append(p.later, vc)
			vc.scheduled.Store(true)
			break
		}
		if auto && vc.ring.len() > 1 {
			if p.bundle(vc, remote) > 0 {
				vc.sent++ // a credit per receive buffer (bundle.go)
				continue
			}
		}
		vc.stampCredit(b)
		if auto {
			seq := binary.BigEndian.Uint32(b[12:])
			p.sendReliable(vc, remote, relMsg{seq: seq, last: seq, slot: slot, n: n})
		} else if dq == p.ud {
			p.postUD(vc, remote, slot, n)
		} else {
			p.post(dq, vc, remote, slot, n)
		}
		vc.ring.pop()
		p.took(vc)
		if credited {
			vc.sent++
		}
	}
	vc.wakeSender()
	if !vc.ring.empty() {
		return
	}
	if (vc.creditDue.Load() || vc.ackDue.Load() || vc.tr == Auto && vc.nackDue.Load()) && vc.state.Load() == stateOpen {
		p.control(q, vc, remote, msgCredit)
	}
	for _, id := range vc.takeUnexportAcks() {
		p.controlArg(q, vc, remote, msgUnexported, id)
	}
	if st == stateClosing && vc.finDue.Load() && !vc.finPosted {
		vc.finPosted = true
		p.control(q, vc, remote, msgFin)
	}
}

// control posts a credit grant, FIN or RST.
func (p *poller) control(q *sendQP, vc *VConn, remote vqpn.ID, t msgType) {
	p.controlArg(q, vc, remote, t, 0)
}

func (p *poller) controlArg(q *sendQP, vc *VConn, remote vqpn.ID, t msgType, arg uint32) {
	e := p.e
	var slot uint32
	ok := q.outstanding+len(q.batch) < e.cfg.SQDepth && p.budget > 0
	if ok {
		slot, ok = e.pool.get(0)
	}
	if !ok {
		// No room or no buffer now: try again next round.
		switch t {
		case msgFin:
			vc.finPosted = false
		case msgReset:
			vc.rstDue.Store(true)
		case msgUnexported:
			rg := vc.rg()
			rg.mu.Lock()
			rg.unexportAcks = append(rg.unexportAcks, arg)
			rg.mu.Unlock()
		}
		p.later = append(p.later, vc)
		vc.scheduled.Store(true)
		return
	}
	h := header{typ: t, flags: flagFirst | flagLast, arg: arg}
	b := e.pool.bytes(slot)
	h.put(b)
	vc.stampCredit(b)
	if t == msgCredit && vc.nackDue.Swap(false) {
		// The gap goes with the acknowledgement just stamped, unless a
		// resend filled it meanwhile.
		r := vc.reliability()
		if end, ack := r.gapEnd.Load(), binary.BigEndian.Uint32(b[20:]); int32(end-ack) > 0 {
			b[1] |= flagGap
			binary.BigEndian.PutUint32(b[8:], end)
		}
	}
	p.post(q, vc, remote, slot, headerLen)
}

// sendWR is the SEND_WITH_IMM of n bytes of buffer slot for vc: wr_id
// names the vconn and the buffer its completion frees, imm_data the
// peer's vconn.
func (p *poller) sendWR(vc *VConn, remote vqpn.ID, slot, n uint32) verbs.SendWR {
	tag := slot
	switch b := p.e.pool.bytes(slot); msgType(b[0]) {
	case msgData, msgBundle:
		if b[1]&flagLast != 0 {
			tag |= wrSent
		}
	case msgFin:
		tag |= wrFin
	}
	return verbs.SendWR{
		WRID:    vqpn.WRID(vc.id, tag),
		Opcode:  verbs.WRSendWithImm,
		Flags:   verbs.SendSignaled,
		ImmData: vqpn.Imm(remote),
		NumSGE:  1,
		SG:      [verbs.MaxSGE]verbs.SGE{p.e.pool.sge(slot, n)},
	}
}

func (p *poller) post(q *sendQP, vc *VConn, remote vqpn.ID, slot, n uint32) {
	p.postWR(q, p.sendWR(vc, remote, slot, n))
}

// postUD posts a datagram to the peer's UD QP that pairs with this poller.
func (p *poller) postUD(vc *VConn, remote vqpn.ID, slot, n uint32) {
	wr := p.sendWR(vc, remote, slot, n)
	wr.AH, wr.RemoteQPN = vc.peer.udRoute(int(vc.id.VQPN()))
	wr.RemoteQKey = p.e.cfg.QKey
	p.postWR(p.ud, wr)
}

func (p *poller) postWR(q *sendQP, wr verbs.SendWR) {
	q.batch = append(q.batch, wr)
	p.budget--
	if !q.queued {
		q.queued = true
		p.dirty = append(p.dirty, q)
	}
}

// flushSends rings each dirty QP's doorbell once for its whole batch; it
// reports whether it posted anything.
func (p *poller) flushSends() bool {
	e := p.e
	posted := false
	for i, q := range p.dirty {
		p.dirty[i] = nil
		q.queued = false
		if len(q.batch) == 0 {
			continue
		}
		n, err := q.qp.PostSend(q.batch)
		posted = posted || n > 0
		e.stats.posts.Add(1)
		e.stats.wrsPosted.Add(uint64(n))
		q.outstanding += n
		if errors.Is(err, verbs.ErrQueueFull) {
			// Accounting should prevent this; if it happens, the rest
			// waits for completions instead of failing the QP.
			rest := copy(q.batch, q.batch[n:])
			clear(q.batch[rest:])
			q.batch = q.batch[:rest]
			q.queued = true
			p.dirty[i] = q
			continue
		}
		if err != nil {
			// The QP refused the rest (it failed): their buffers go back,
			// their vconns fail.
			for _, wr := range q.batch[n:] {
				id, tag := vqpn.SplitWRID(wr.WRID)
				p.sent(tag)
				p.budget++
				if vc, ok := e.vconns.Lookup(id); ok {
					vc.fail(fmt.Errorf("%w: %w", ErrQPFailed, err))
				}
			}
			p.qpFailed(q, err)
		}
		clear(q.batch)
		q.batch = q.batch[:0]
	}
	k := 0
	for _, q := range p.dirty {
		if q != nil {
			p.dirty[k] = q
			k++
		}
	}
	p.dirty = p.dirty[:k]
	return posted
}

func (p *poller) flushReposts() {
	if len(p.reposts) == 0 {
		return
	}
	e := p.e
	for _, c := range []struct {
		class int
		srq   verbs.SRQ
	}{{e.recvClass, e.srq}, {e.dgramClass, e.dsrq}} {
		wrs := p.recvWRs[:0]
		for _, slot := range p.reposts {
			if int(slot>>24) == c.class {
				wrs = append(wrs, e.recvWR(slot))
			}
		}
		p.recvWRs = wrs
		if len(wrs) == 0 {
			continue
		}
		if _, err := c.srq.PostRecv(wrs); err != nil {
			e.log.Error(err, "Reposting receive buffers failed", "buffers", len(wrs))
		}
	}
	p.reposts = p.reposts[:0]
}

// touchAhead is how many vconns the poller touches at once before
// serving them.
const touchAhead = 16

// touch reads the hot cache lines of vconns about to be served. With many
// vconns each is touched about once per message, long after the last time,
// so it is rarely in cache; loads that do not depend on each other let the
// CPU wait for those misses together instead of one after another.
func (p *poller) touch(vcs []*VConn) {
	var x uint32
	for _, vc := range vcs {
		x += vc.state.Load() + vc.remote.Load() // the two hot lines
	}
	// Then the oldest queued buffer of each, which its sender just wrote.
	pool := p.e.pool
	for _, vc := range vcs {
		if ent, ok := vc.ring.peek(&vc.ents); ok && uint32(ent>>32) != opMarker {
			x += uint32(pool.bytes(uint32(ent >> 32))[0])
		}
	}
	p.sink += x
}

// completeAll dispatches the n completions polled into p.wcs. The vconns
// receives name are looked up (and their hot lines read) in a first pass,
// for the reason touch gives. A vconn found here and released before its
// message is handled is the old owner still, never a new one: the message
// is dropped as on any closed vconn.
func (p *poller) completeAll(n int) {
	for i := range p.wcs[:n] {
		wc := &p.wcs[i]
		p.rxVC[i] = nil
		if wc.Opcode&verbs.WCRecv != 0 && wc.Status == verbs.WCSuccess && wc.Flags&verbs.WCWithImm != 0 {
			if vc, ok := p.e.vconns.Lookup(vqpn.FromImm(wc.ImmData)); ok {
				p.rxVC[i] = vc
			}
		}
	}
	var x uint32
	for _, vc := range p.rxVC[:n] {
		if vc != nil {
			x += vc.state.Load() + vc.remote.Load() // the two hot lines
		}
	}
	p.sink += x
	for i := range p.wcs[:n] {
		wc := &p.wcs[i]
		if wc.Opcode&verbs.WCRecv != 0 {
			p.onRecv(wc, p.rxVC[i])
			p.rxVC[i] = nil
			continue
		}
		p.onSend(wc)
	}
}

// sent gives back the buffer of a SEND whose wr_id carried tag.
func (p *poller) sent(tag uint32) {
	slot, gather := tag&slotMask, tag&wrGather != 0
	if tag&wrShared == 0 {
		p.free(slot, gather)
		return
	}
	p.unref(slot, gather)
}

// unref drops an owner of a shared send buffer (bufPool.share) and frees it
// after the last.
func (p *poller) unref(slot uint32, gather bool) {
	if p.e.pool.unshare(slot) {
		p.free(slot, gather)
	}
}

// free puts a send buffer back; for a gathered bundle's header buffer
// (gather), the buffers of its messages too.
func (p *poller) free(slot uint32, gather bool) {
	e := p.e
	if gather {
		b := e.pool.bytes(slot)
		for i := range int(binary.BigEndian.Uint32(b[16:])) {
			e.pool.put(binary.BigEndian.Uint32(b[headerLen+8*i:]))
		}
	}
	e.pool.put(slot)
}

func (p *poller) onSend(wc *verbs.WC) {
	e := p.e
	p.budget++
	v, _ := p.sendQPs.Load(wc.QPN)
	q, _ := v.(*sendQP)
	if q != nil {
		q.outstanding--
	}
	id, tag := vqpn.SplitWRID(wc.WRID)
	slot := tag & slotMask
	if !e.pool.valid(slot) {
		return
	}
	if wc.Opcode == verbs.WCRDMAWrite || wc.Opcode == verbs.WCRDMARead {
		if vc, ok := e.vconns.Lookup(id); ok {
			vc.opCompleted(wc, slot)
		}
		e.pool.put(slot)
		if wc.Status != verbs.WCSuccess && q != nil {
			p.qpFailed(q, wc.Err())
		}
		return
	}
	p.sent(tag)
	if wc.Status != verbs.WCSuccess {
		if q != nil {
			p.qpFailed(q, wc.Err())
		}
		return
	}
	if tag&wrSent != 0 {
		e.stats.msgsSent.Add(1)
	}
	if tag&wrFin != 0 {
		if vc, ok := e.vconns.Lookup(id); ok {
			vc.onFinSent()
		}
	}
}

// qpFailed fails the vconns of a QP that went to ERR and takes the QP out
// of its peer's pool, so new vconns get a fresh one. The dead QP is
// destroyed once its flushed completions are in.
func (p *poller) qpFailed(q *sendQP, err error) {
	if q.peer == nil {
		p.udFailed(q, err)
		return
	}
	peer := q.peer
	peer.mu.Lock()
	first := !q.failed
	q.failed = true
	for _, t := range [][]*sendQP{peer.qps, peer.ucs} {
		for i, x := range t {
			if x == q {
				t[i] = nil
				peer.dead = append(peer.dead, q)
			}
		}
	}
	peer.mu.Unlock()
	if first {
		p.e.log.Info("Shared QP failed", "peer", peer.gid, "qpn", q.qp.QPN(), "err", err)
		peer.failWhere(func(vc *VConn) bool { return vc.sq == q }, fmt.Errorf("%w: %w", ErrQPFailed, err))
	}
	if q.outstanding <= 0 {
		p.sendQPs.Delete(q.qp.QPN())
		peer.mu.Lock()
		for i, x := range peer.dead {
			if x == q {
				peer.dead = append(peer.dead[:i], peer.dead[i+1:]...)
				_ = q.qp.Close()
				break
			}
		}
		peer.mu.Unlock()
	}
}

// onRecv handles a receive; vc is the vconn its imm_data named, looked up
// by completeAll (nil: none, or a stale generation).
func (p *poller) onRecv(wc *verbs.WC, vc *VConn) {
	e := p.e
	slot := uint32(wc.WRID)
	if !e.pool.valid(slot) {
		return
	}
	if wc.Status != verbs.WCSuccess || wc.Flags&verbs.WCWithImm == 0 {
		if wc.Status != verbs.WCWRFlushErr {
			e.stats.malformed.Add(1)
		}
		p.reposts = append(p.reposts, slot)
		return
	}
	ok := vc != nil
	b := e.pool.bytes(slot)[:min(wc.ByteLen, uint32(e.cfg.ChunkSize))]
	from := p.peerOf(wc.QPN)
	if wc.Flags&verbs.WCWithGRH != 0 {
		// A datagram: the sender's GID is in the GRH space.
		if len(b) < verbs.GRHSize {
			ok = false
		} else {
			copy(from[:], b[8:24])
			b = b[verbs.GRHSize:]
		}
	}
	if !ok || vc.peer.gid != from {
		// Closed (stale generation), or a peer naming a vconn that is not
		// its own: dropped.
		p.reposts = append(p.reposts, slot)
		return
	}
	var h header
	if err := h.parse(b); err != nil {
		e.stats.malformed.Add(1)
		p.reposts = append(p.reposts, slot)
		return
	}
	vc.grant(h.credit)
	if vc.tr == Auto && (h.typ == msgData || h.typ == msgCredit || h.typ == msgBundle) {
		p.onAck(vc, h.arg)
		if h.flags&flagGap != 0 {
			vc.onGap(h.length)
		}
	}
	switch h.typ {
	case msgData:
		p.onData(vc, &h, slot, b[headerLen:])
	case msgBundle:
		p.onBundle(vc, &h, slot, b[headerLen:])
	case msgFin:
		p.reposts = append(p.reposts, slot)
		vc.onPeerFin()
	case msgReset:
		p.reposts = append(p.reposts, slot)
		vc.fail(ErrReset)
	case msgExport:
		err := vc.onExport(&h, b[headerLen:])
		p.reposts = append(p.reposts, slot)
		if err != nil {
			e.stats.malformed.Add(1)
			vc.fail(err)
		}
	case msgUnexport:
		p.reposts = append(p.reposts, slot)
		vc.onUnexport(&h)
	case msgUnexported:
		p.reposts = append(p.reposts, slot)
		vc.onUnexported(h.arg)
	default:
		p.reposts = append(p.reposts, slot)
	}
}

// peerOf returns the GID of the peer whose QP qpn received a message.
func (p *poller) peerOf(qpn uint32) (g verbs.GID) {
	if v, ok := p.e.ingress.Load(qpn); ok {
		return v.(*Peer).gid
	}
	return g
}

// onData delivers a whole message or adds a chunk to the one being
// reassembled.
func (p *poller) onData(vc *VConn, h *header, slot uint32, payload []byte) {
	e := p.e
	first, last := h.flags&flagFirst != 0, h.flags&flagLast != 0
	m := Message{vc: vc, Imm: h.imm, HasImm: h.flags&flagImm != 0, slot: noSlot, credits: 1}
	if int(slot>>24) == e.dgramClass {
		// Unreliable transports: whole messages only, no credits.
		if !first || !last || uint32(len(payload)) != h.length {
			e.stats.malformed.Add(1)
			p.reposts = append(p.reposts, slot)
			return
		}
		m.Data, m.slot, m.credits = payload, slot, 0
		if vc.tr == Auto {
			m.credits = 1
			vc.deliverSeq(p, h.seq, m, true)
			return
		}
		vc.deliver(m)
		return
	}
	if first && last {
		if uint32(len(payload)) != h.length {
			p.malformed(vc, slot)
			return
		}
		m.Data, m.slot = payload, slot
		p.deliver(vc, h, m)
		return
	}
	if first {
		if vc.asm != nil || h.length > uint32(e.cfg.MaxMessage) {
			p.malformed(vc, slot)
			return
		}
		// Reassembly copies into a buffer of its own so the chunks'
		// receive buffers (and credits) come back at once.
		vc.asm, vc.asmOff = make([]byte, h.length), 0
	}
	if vc.asm == nil || vc.asmOff+uint32(len(payload)) > uint32(len(vc.asm)) {
		p.malformed(vc, slot)
		return
	}
	copy(vc.asm[vc.asmOff:], payload)
	vc.asmOff += uint32(len(payload))
	p.reposts = append(p.reposts, slot)
	if !last {
		vc.returnCredits(1) // the chunk is copied out: its buffer is free
		return
	}
	if vc.asmOff != uint32(len(vc.asm)) {
		vc.asm = nil
		p.malformed(vc, noSlot)
		return
	}
	m.Data = vc.asm
	vc.asm = nil
	p.deliver(vc, h, m)
}

func (p *poller) deliver(vc *VConn, h *header, m Message) {
	if vc.tr == Auto {
		vc.deliverSeq(p, h.seq, m, false)
		return
	}
	vc.deliver(m)
}

// malformed drops a message that breaks the framing: the peer engine is
// broken, so the vconn fails rather than deliver garbage.
func (p *poller) malformed(vc *VConn, slot uint32) {
	p.e.stats.malformed.Add(1)
	if slot != noSlot {
		p.reposts = append(p.reposts, slot)
	}
	vc.returnCredits(1)
	vc.fail(errors.New("engine: malformed message from peer"))
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
