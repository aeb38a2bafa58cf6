package engine

import (
	"fmt"
	"github.com/rdmavisor/rdmavisor/internal/engine/wire"
	"sync"
	"sync/atomic"
	"time"

	"github.com/rdmavisor/rdmavisor/internal/vqpn"
)

// Auto vconns are reliable and ordered like RC, but send messages of up to
// a chunk as datagrams on the vconn's UC QP, which cost the provider no
// transport ACK and no per-packet state at the receiver. The engine then
// supplies what RC would: every message carries its sequence number
// (header.seq); the receiver delivers in sequence order, holding early
// arrivals and dropping duplicates, and acknowledges cumulatively in
// the acknowledgement field (header.ack) of whatever it sends back (data or a credit grant), late
// rather than per message (see deliverSeq); the sender keeps each datagram
// until it is acknowledged and retransmits it after a timeout that follows
// the measured round trip. Larger messages go over RC, chunked, in the
// same sequence. Receive credits bound both paths together.
//
// The datagrams go over UC, not UD as eRPC and FaSST send theirs: the
// engine holds a UC pool per peer anyway, a UC message may span packets
// (a chunk, where a UD one ends at the MTU), and on the soft provider one
// vconn moved 16-byte messages over UC at 1.15x the rate of UD, which
// pays for the GRH and the address handle on every datagram.

// rel is an Auto vconn's reliability state.
//
// The send side belongs to the poller of the vconn's QPs (vc.sq.p), which
// alone posts, retransmits and frees its datagrams, so it takes no lock:
// the poller that receives the peer's acknowledgements (another one, with
// several) only records them, in peerAck, and has the owner free what
// they cover (freeAcked). The receive side, which any poller may reach,
// is guarded by mu.
type rel struct {
	// Send side. unacked[head:] are the datagrams not yet acknowledged,
	// in sequence order. Each holds its buffer, shared (bufPool.share)
	// with the posts of it that have not completed: a buffer is reused
	// only once acknowledged and no longer the device's.
	unacked []relMsg
	head    int
	acked   uint32 // the acknowledgement unacked reflects
	// Round-trip estimate and retransmission timeout, as TCP's (RFC
	// 6298): a fixed timeout short enough for an idle path fires
	// spuriously on a busy one, where acknowledgements are delayed and
	// pollers share cores.
	srtt, rttvar, rto time.Duration
	// Written by the receiving poller: the newest acknowledgement, when
	// it came (since the engine's epoch), and the end of a gap the peer
	// reported, 0 once handled.
	peerAck   atomic.Uint32
	peerAckAt atomic.Int64
	resendTo  atomic.Uint32

	// Receive side.
	mu         sync.Mutex
	rxNext     atomic.Uint32 // next sequence number to accept; written under mu
	early      []Message     // early[i] holds seq rxNext+1+i, if arrived
	inorder    []Message     // accepted, in order, not yet handed over
	delivering bool          // someone is handing inorder over
	ackSent    atomic.Uint32 // last acknowledgement sent
	// A gap: rxNext is missing while later messages wait in early.
	// gapEnd is the first of those; nacked the rxNext last reported
	// (see reportGap).
	gapEnd atomic.Uint32
	nacked uint32
	gapped bool // nacked is valid
}

// relMsg is a datagram awaiting acknowledgement: one message, or a
// bundle of the messages seq..last.
type relMsg struct {
	seq, last uint32
	slot      bufSlot
	n         uint32
	tries     int32
	gather    bool // slot is a gathered bundle's header buffer (bundle.go)
	sent      time.Time
}

// The retransmission timeout is for the tail of a burst only: a loss with
// anything after it is reported as a gap and resent at once (reportGap).
// So it can afford to wait out the stalls a busy host imposes on pollers
// and the soft device's goroutines (a goroutine may wait a scheduler slice,
// milliseconds, for a core); at 1 ms, every such stall resent a window in
// vain. eRPC's timeout is 5 ms too.
const (
	relMinRTO   = 5 * time.Millisecond  // the timeout never goes below this
	relInitRTO  = 10 * time.Millisecond // before the first round-trip sample
	relMaxRTO   = 160 * time.Millisecond
	relMaxTries = 16 // about 2 s of silence before the vconn fails
	// relAckDelay bounds how long an acknowledgement waits for company:
	// well under relMinRTO, so it never makes the sender time out.
	relAckDelay = 100 * time.Microsecond
)

func (vc *VConn) reliability() *rel {
	if r := vc.rel.Load(); r != nil {
		return r
	}
	vc.rel.CompareAndSwap(nil, &rel{})
	return vc.rel.Load()
}

// autoDgram reports whether a message of n bytes (header included) goes as
// a datagram on this Auto vconn.
func (vc *VConn) autoDgram(n uint32) bool {
	e := vc.e
	return n-wire.HeaderLen <= uint32(e.cfg.AutoThreshold) && int(n) <= e.cfg.ChunkSize
}

// ackValue is the cumulative acknowledgement to stamp on outgoing messages.
func (vc *VConn) ackValue() uint32 {
	r := vc.reliability()
	n := r.rxNext.Load()
	if r.ackSent.Load() != n {
		r.ackSent.Store(n)
	}
	return n
}

// onAck records an acknowledgement the peer sent, received by poller p:
// p frees what it covers if it owns the send side, else the owner does
// when it next serves the vconn.
func (p *poller) onAck(vc *VConn, ack uint32) {
	r := vc.reliability()
	if !wire.Advance(&r.peerAck, ack) {
		return
	}
	r.peerAckAt.Store(int64(p.clock().Sub(p.e.epoch)))
	if vc.sq.p == p {
		p.freeAcked(vc, r)
		return
	}
	vc.ackRecv.Store(true)
	vc.schedule()
}

// freeAcked frees the datagrams the peer acknowledged and, from the newest
// one sent only once (Karn's rule), updates the round-trip estimate. Only
// the owner of the send side calls it.
func (p *poller) freeAcked(vc *VConn, r *rel) {
	ack := r.peerAck.Load()
	if ack == r.acked {
		return
	}
	r.acked = ack
	at := p.e.epoch.Add(time.Duration(r.peerAckAt.Load()))
	var sample time.Duration
	for r.head < len(r.unacked) && int32(ack-r.unacked[r.head].last) > 0 {
		u := &r.unacked[r.head]
		if u.tries == 0 {
			sample = at.Sub(u.sent)
		}
		p.unref(u.slot, u.gather)
		*u = relMsg{}
		r.head++
	}
	switch {
	case r.head == len(r.unacked):
		r.unacked, r.head = r.unacked[:0], 0
	case r.head > len(r.unacked)/2:
		n := copy(r.unacked, r.unacked[r.head:])
		clear(r.unacked[n:])
		r.unacked, r.head = r.unacked[:n], 0
	}
	if sample > 0 {
		r.observe(sample)
	}
}

// observe folds a round-trip sample into the estimate (RFC 6298 2.2-2.3).
func (r *rel) observe(sample time.Duration) {
	if r.srtt == 0 {
		r.srtt, r.rttvar = sample, sample/2
	} else {
		d := r.srtt - sample
		if d < 0 {
			d = -d
		}
		r.rttvar = (3*r.rttvar + d) / 4
		r.srtt = (7*r.srtt + sample) / 8
	}
	r.rto = min(max(r.srtt+4*r.rttvar, relMinRTO), relMaxRTO)
}

// timeout is the retransmission timeout of a datagram sent tries+1 times.
func (r *rel) timeout(tries int32) time.Duration {
	rto := r.rto
	if rto == 0 {
		rto = relInitRTO
	}
	return min(rto<<tries, relMaxRTO)
}

// deliverSeq delivers m (sequence seq) in order: early messages wait for
// the gap to fill, duplicates are dropped. p is the poller that received
// it; dgram says it came as a datagram, not over RC.
//
// Acknowledgements are cumulative and delayed, as TCP's are: they ride on
// the credit grants the application's releases bring (one per half
// window), or go relAckDelay after a message that no grant acknowledged
// (flushAcks), or at once for a duplicate (the sender timed out).
// Acknowledging whenever the receiving poller ran out of work instead cost
// a control message every few messages whenever the receiver outpaced the
// sender, which is the usual case.
func (vc *VConn) deliverSeq(p *poller, seq uint32, m Message, dgram bool) {
	r := vc.reliability()
	r.mu.Lock()
	next := r.rxNext.Load()
	d := int32(seq - next)
	switch {
	case d < 0:
		// A retransmission of something delivered: it took no credit.
		r.mu.Unlock()
		m.dropCredit()
		m.Release()
		vc.ackDue.Store(true)
		vc.schedule()
		return
	case d > 0 && !r.accepts(d, vc.e.cfg.MaxCredits):
		r.mu.Unlock()
		m.dropCredit() // a duplicate, or outside the window: the sender will resend it
		m.Release()
		return
	}
	// A single datagram takes its receive credit here, where duplicates
	// are told apart under mu, so each is counted once (a chunk took its
	// credit in onData, a bundle in onBundle).
	if dgram && !m.shared && m.credits != 0 && !vc.takeCredit() {
		r.mu.Unlock()
		p.overrun(vc)
		m.Release()
		return
	}
	if d > 0 {
		i := int(d) - 1
		for len(r.early) <= i {
			r.early = append(r.early, Message{})
		}
		// A peer that leaves a gap makes the messages after it wait
		// here, each in its receive buffer: they count against the SRQ
		// as queued ones do.
		p.pin(&m)
		r.early[i] = m
		gap := r.reportGap(next)
		r.mu.Unlock()
		if gap && !vc.nackDue.Swap(true) {
			vc.schedule()
		}
		return
	}
	// In sequence: accept it and whatever it releases.
	next++
	if len(r.early) > 0 {
		// m filled the gap: the run of early arrivals after it follows
		// it, and early moves past that run and the next gap (whose
		// sequence number is now rxNext).
		k := 0
		for k < len(r.early) && r.early[k].vc != nil {
			k++
		}
		dgram = dgram || k > 0 // datagrams may be among them
		r.inorder = append(r.inorder, m)
		r.inorder = append(r.inorder, r.early[:k]...)
		next += uint32(k)
		n := len(r.early)
		rest := copy(r.early, r.early[min(k+1, n):])
		clear(r.early[rest:n])
		r.early = r.early[:rest]
		m = Message{}
	}
	r.rxNext.Store(next)
	gap := len(r.early) > 0 && r.reportGap(next)
	// Hand over outside the lock (a handler may send on this vconn), one
	// goroutine at a time so the order holds across pollers.
	if r.delivering {
		if m.vc != nil {
			r.inorder = append(r.inorder, m)
		}
	} else {
		r.delivering = true
		if m.vc != nil {
			r.mu.Unlock()
			vc.deliver(p, m)
			r.mu.Lock()
		}
		for i := 0; i < len(r.inorder); i++ {
			next := r.inorder[i]
			r.inorder[i] = Message{}
			r.mu.Unlock()
			vc.deliver(p, next)
			r.mu.Lock()
		}
		r.inorder = r.inorder[:0]
		r.delivering = false
	}
	r.mu.Unlock()
	if gap && !vc.nackDue.Swap(true) {
		vc.schedule()
	}
	// The acknowledgement waits (see above); the credit grant that the
	// application's release brings may carry it first. Only datagrams
	// need one: the sender keeps nothing it sent over RC, which is
	// reliable itself. (Acknowledging them too sent a control message
	// every relAckDelay: 4,000 messages of 20 KB had the receiver post
	// 437 work requests, 233 without.)
	if dgram && !vc.ackWait.Load() && !vc.ackWait.Swap(true) {
		p.acks = append(p.acks, ackWaiter{vc, r.ackSent.Load()})
	}
}

// accepts reports whether a message d sequence numbers after rxNext is
// new and within the window of early arrivals. r.mu is held.
func (r *rel) accepts(d int32, maxCredits int) bool {
	if d <= 0 {
		return d == 0
	}
	i := int(d) - 1
	return i < earlyWindow(maxCredits) && (i >= len(r.early) || r.early[i].vc == nil)
}

// earlyWindow is how far past a gap messages are kept: twice what a full
// window of credits may have in flight, a bundle of messages per credit.
// What arrives beyond it is dropped, and resent.
func earlyWindow(maxCredits int) int { return 2 * maxBundle * maxCredits }

// firstCopy reports whether the datagram whose first message is seq is the
// first copy of it to arrive: a retransmission of one that arrived took no
// credit.
func (r *rel) firstCopy(seq uint32, maxCredits int) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.accepts(int32(seq-r.rxNext.Load()), maxCredits)
}

// reportGap records that next is missing while later messages wait, and
// reports whether the sender should hear of it: once per gap. A datagram
// lost (a receive queue overflowed on the way) would otherwise wait for
// the retransmission timeout, at least relMinRTO, while the window drains
// and the vconn stops; told, the sender resends what is missing at once,
// as TCP's fast retransmit and RC's sequence-error NAK do. r.mu is held.
func (r *rel) reportGap(next uint32) bool {
	if r.gapped && r.nacked == next {
		return false
	}
	for j, m := range r.early {
		if m.vc != nil {
			r.gapEnd.Store(next + 1 + uint32(j))
			break
		}
	}
	r.nacked, r.gapped = next, true
	return true
}

// onGap has the owner of the send side resend at once the datagrams the
// peer reports missing, from its acknowledgement up to gapEnd (see
// retransmit).
func (vc *VConn) onGap(gapEnd uint32) {
	r := vc.reliability()
	for {
		old := r.resendTo.Load()
		if old != 0 && int32(gapEnd-old) <= 0 {
			break
		}
		if r.resendTo.CompareAndSwap(old, gapEnd) {
			break
		}
	}
	p := vc.sq.p
	p.rtxSoon.Store(true)
	p.kick()
}

// ackWaiter is a vconn whose acknowledgement is delayed, and the last one
// sent when it began to wait.
type ackWaiter struct {
	vc   *VConn
	sent uint32
}

// flushAcks sends the delayed acknowledgements that nothing sent meanwhile
// carried. A vconn whose acknowledgement did go out (with a credit grant)
// but that has received more since waits another relAckDelay: in a
// stream, grants carry every acknowledgement and the timer sends none.
func (p *poller) flushAcks() {
	k := 0
	for _, w := range p.acks {
		vc := w.vc
		r := vc.reliability()
		next, sent := r.rxNext.Load(), r.ackSent.Load()
		switch {
		case next == sent:
			vc.ackWait.Store(false)
		case sent != w.sent:
			p.acks[k] = ackWaiter{vc, sent}
			k++
		default:
			vc.ackWait.Store(false)
			if !vc.ackDue.Swap(true) {
				vc.schedule()
			}
		}
	}
	clear(p.acks[k:])
	p.acks = p.acks[:k]
}

// releaseRel returns the early arrivals a released Auto vconn holds; its
// poller frees its unacknowledged datagrams (dropUnacked) when it serves
// it next.
func (vc *VConn) releaseRel() {
	r := vc.rel.Load()
	if r == nil {
		return
	}
	r.mu.Lock()
	early := r.early
	r.early = nil
	r.mu.Unlock()
	for _, m := range early {
		if m.vc != nil {
			m.dropCredit()
			m.Release()
		}
	}
}

// dropUnacked frees the datagrams of a vconn that will send no more.
func (p *poller) dropUnacked(vc *VConn) {
	r := vc.rel.Load()
	if r == nil {
		return
	}
	for i := r.head; i < len(r.unacked); i++ {
		p.unref(r.unacked[i].slot, r.unacked[i].gather)
	}
	r.unacked, r.head = nil, 0
}

// sendReliable posts an Auto datagram and keeps it until it is
// acknowledged.
func (p *poller) sendReliable(vc *VConn, remote vqpn.ID, u relMsg) {
	p.e.pool.share(u.slot, 2) // the unacknowledged list and the post
	wr := p.bundleWR(vc, remote, &u)
	wr.WRID = wire.Retag(wr.WRID, wire.TagShared, 0)
	p.postWR(vc.dq, wr)
	r := vc.reliability()
	u.sent = p.clock()
	r.unacked = append(r.unacked, u)
	if !vc.rtxWatched {
		vc.rtxWatched = true
		p.rtx = append(p.rtx, vc)
	}
}

// retransmit resends the datagrams whose timeout passed, on the vconns the
// poller watches; it returns whether any vconn still waits for ACKs.
func (p *poller) retransmit(now time.Time) bool {
	e := p.e
	k := 0
	for _, vc := range p.rtx {
		r := vc.reliability()
		live := vc.state.Load() == stateOpen || vc.state.Load() == stateClosing
		if !live {
			p.dropUnacked(vc)
		}
		p.freeAcked(vc, r)
		remote := vqpn.ID(vc.remote.Load())
		// A gap the peer reported is resent now, except what was resent
		// less than a round trip ago: the report may have crossed it.
		resendTo := r.resendTo.Swap(0)
		var dead bool
		for i := r.head; i < len(r.unacked); i++ {
			u := &r.unacked[i]
			age := now.Sub(u.sent)
			gap := resendTo != 0 && int32(u.seq-resendTo) < 0 && (u.tries == 0 || age >= r.srtt)
			if !gap && age < r.timeout(u.tries) {
				continue
			}
			if u.tries >= relMaxTries {
				dead = true
				break
			}
			if q := vc.dq; q.outstanding+len(q.batch) >= e.cfg.SQDepth || p.budget <= 0 {
				break
			}
			// The buffer goes again as it was, with the acknowledgement
			// it first carried: rewriting it while an earlier post of it
			// may not have been read would race with the device.
			e.pool.ref(u.slot)
			wr := p.bundleWR(vc, remote, u)
			wr.WRID = wire.Retag(wr.WRID, wire.TagShared, wire.TagSent) // counted sent the first time
			p.postWR(vc.dq, wr)
			if age < r.timeout(u.tries) {
				e.stats.gapResends.Add(1)
			}
			u.sent, u.tries = now, u.tries+1
			e.stats.retransmits.Add(1)
		}
		waiting := r.head < len(r.unacked) && live
		if dead {
			vc.fail(fmt.Errorf("%w: no acknowledgement after %d retransmissions", ErrPeerGone, relMaxTries))
			waiting = false
		}
		if waiting {
			p.rtx[k] = vc
			k++
		} else {
			vc.rtxWatched = false
		}
	}
	clear(p.rtx[k:])
	p.rtx = p.rtx[:k]
	return k > 0
}
