package engine

import (
	"fmt"
	"time"

	"github.com/rdmavisor/rdmavisor/internal/engine/format"
	"github.com/rdmavisor/rdmavisor/internal/engine/reliable"
	"github.com/rdmavisor/rdmavisor/internal/vqpn"
)

// Auto vconns are reliable and ordered like RC, but send messages of up to
// a chunk as datagrams on the vconn's UC QP, which cost the provider no
// transport ACK and no per-packet state at the receiver. The engine then
// supplies what RC would: every message carries its sequence number
// (format.Header.Seq); the receiver delivers in sequence order, holding early
// arrivals and dropping duplicates, and acknowledges cumulatively in
// the acknowledgement field (format.Header.Ack) of whatever it sends back (data or a credit grant), late
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

// rel is an Auto vconn's reliability state (package reliable).
//
// The send side belongs to the poller of the vconn's QPs (vc.sq.p), which
// alone posts, retransmits and frees its datagrams, so it takes no lock:
// the poller that receives the peer's acknowledgements (another one, with
// several) only records them, and has the owner free what they cover
// (freeAcked). The receive side, which any poller may reach, locks.
type rel struct {
	tx reliable.Sender
	rx reliable.Receiver[Message]
}

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
	return n-format.HeaderLen <= uint32(e.cfg.AutoThreshold) && int(n) <= e.cfg.ChunkSize
}

// ackValue is the cumulative acknowledgement to stamp on outgoing
// messages. Only the vconn's poller, as it posts.
func (vc *VConn) ackValue() uint32 { return vc.reliability().rx.Ack() }

// earlyWindow is how far past a gap the vconn keeps messages.
func (vc *VConn) earlyWindow() int { return reliable.EarlyWindow(vc.e.cfg.MaxCredits) }

// onAck records an acknowledgement the peer sent, received by poller p:
// p frees what it covers if it owns the send side, else the owner does
// when it next serves the vconn. Any poller that receives for vc.
func (p *poller) onAck(vc *VConn, ack uint32) {
	r := vc.reliability()
	if !r.tx.OnAck(ack) {
		return
	}
	r.tx.AckTime(p.clock().Sub(p.e.epoch))
	if vc.sq.p == p {
		p.freeAcked(vc, r)
		if vc.finDue.Load() {
			vc.schedule() // its FIN may wait for this acknowledgement
		}
		return
	}
	vc.ackRecv.Store(true)
	vc.schedule()
}

// datagramsUnacked: an Auto vconn has datagrams the peer has not
// acknowledged. Only the owner of the send side.
func (vc *VConn) datagramsUnacked() bool {
	r := vc.rel.Load()
	return r != nil && r.tx.Waiting()
}

// freeAcked frees the datagrams the peer acknowledged. Only the owner of
// the send side, vc.sq.p.
func (p *poller) freeAcked(vc *VConn, r *rel) {
	r.tx.FreeAcked(p.e.epoch, p.freeDatagram)
	vc.dq.path.RTT(r.tx.TakeSample())
}

// freeDatagram drops the send side's hold on a datagram's buffer. Only
// the owner of the send side.
func (p *poller) freeDatagram(d *reliable.Datagram) { p.unref(bufSlot(d.Buf), d.Gather) }

// deliverSeq delivers m (sequence seq) in order: early messages wait for
// the gap to fill, duplicates are dropped. p is the poller that received
// it (any of them); dgram says it came as a datagram, not over RC.
//
// Acknowledgements are cumulative and delayed, as TCP's are: they ride on
// the credit grants the application's releases bring (one per half
// window), or go reliable.AckDelay after a message that no grant
// acknowledged (flushAcks), or at once for a duplicate (the sender timed
// out). Acknowledging whenever the receiving poller ran out of work
// instead cost a control message every few messages whenever the receiver
// outpaced the sender, which is the usual case.
func (vc *VConn) deliverSeq(p *poller, seq uint32, m Message, dgram bool) {
	r := &vc.reliability().rx
	r.Lock()
	d := r.Offset(seq)
	switch {
	case d < 0:
		// A retransmission of something delivered: it took no credit.
		r.Unlock()
		m.dropCredit()
		m.Release()
		vc.ackDue.Store(true)
		vc.schedule()
		return
	case d > 0 && !r.Accepts(d, vc.earlyWindow()):
		r.Unlock()
		m.dropCredit() // a duplicate, or outside the window: the sender will resend it
		m.Release()
		return
	}
	// A single datagram takes its receive credit here, where duplicates
	// are told apart under the lock, so each is counted once (a chunk
	// took its credit in onData, a bundle in onBundle).
	if dgram && !m.shared && m.credits != 0 && !vc.takeCredit() {
		r.Unlock()
		p.overrun(vc)
		m.Release()
		return
	}
	if d > 0 {
		// A peer that leaves a gap makes the messages after it wait
		// here, each in its receive buffer: they count against the SRQ
		// as queued ones do.
		p.pin(&m)
		gap := r.Hold(d, m)
		r.Unlock()
		vc.reportGap(gap)
		return
	}
	released, gap := r.Accept(m)
	r.Handover(func(m Message) { vc.deliver(p, m) })
	r.Unlock()
	vc.reportGap(gap)
	// The acknowledgement waits (see above); the credit grant that the
	// application's release brings may carry it first. Only datagrams
	// need one (and the early arrivals m released may be some): the
	// sender keeps nothing it sent over RC, which is reliable itself.
	// (Acknowledging them too sent a control message every AckDelay:
	// 4,000 messages of 20 KB had the receiver post 437 work requests,
	// 233 without.)
	if (dgram || released > 0) && !vc.ackWait.Load() && !vc.ackWait.Swap(true) {
		p.rel.acks = append(p.rel.acks, ackWaiter{vc, r.AckSent()})
	}
}

// reportGap has the vconn's poller send a gap report, if there is news
// of one (reliable.Receiver.Hold).
func (vc *VConn) reportGap(news bool) {
	if news && !vc.nackDue.Swap(true) {
		vc.schedule()
	}
}

// onGap has the owner of the send side resend at once the datagrams the
// peer reports missing, from its acknowledgement up to end (see
// retransmit). Any poller that receives for vc.
func (vc *VConn) onGap(end uint32) {
	vc.reliability().tx.OnGap(end)
	p := vc.sq.p
	p.rel.soon.Store(true)
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
// but that has received more since waits another AckDelay: in a stream,
// grants carry every acknowledgement and the timer sends none. Only the
// poller that owns p.rel.acks.
func (p *poller) flushAcks() { p.ackWaiters(false) }

// flushAcksNow sends every acknowledgement still owed, before the poller
// sleeps: no reply is coming soon to carry them.
func (p *poller) flushAcksNow() { p.ackWaiters(true) }

// ackWaiters schedules the acknowledgements of p.rel.acks that no message
// carried since they were due; now, those too whose vconn sent some but
// still owes one.
func (p *poller) ackWaiters(now bool) {
	k := 0
	for _, w := range p.rel.acks {
		vc := w.vc
		r := &vc.reliability().rx
		next, sent := r.Next(), r.AckSent()
		switch {
		case next == sent:
			vc.ackWait.Store(false)
		case sent != w.sent && !now:
			p.rel.acks[k] = ackWaiter{vc, sent}
			k++
		default:
			vc.ackWait.Store(false)
			if !vc.ackDue.Swap(true) {
				vc.schedule()
			}
		}
	}
	clear(p.rel.acks[k:])
	p.rel.acks = p.rel.acks[:k]
}

// releaseRel returns the early arrivals a released Auto vconn holds; its
// poller frees its unacknowledged datagrams (dropUnacked) when it serves
// it next. The goroutine that releases the vconn.
func (vc *VConn) releaseRel() {
	if r := vc.rel.Load(); r != nil {
		r.rx.DropEarly(func(m Message) {
			m.dropCredit()
			m.Release()
		})
	}
}

// dropUnacked frees the datagrams of a vconn that will send no more. Only
// the owner of the send side.
func (p *poller) dropUnacked(vc *VConn) {
	if r := vc.rel.Load(); r != nil {
		r.tx.Drop(p.freeDatagram)
	}
}

// sendReliable posts an Auto datagram, with its UC QP pair's secret, and
// keeps it until it is acknowledged (its resends carry the same secret:
// the vconn's QPs never change). Only the owner of the send side.
func (p *poller) sendReliable(vc *VConn, remote vqpn.ID, u reliable.Datagram) {
	format.Raw(p.e.pool.bytes(bufSlot(u.Buf))).SetAuth(vc.dq.secret)
	p.e.pool.share(bufSlot(u.Buf), 2) // the unacknowledged list and the post
	wr := p.bundleWR(vc, remote, &u)
	wr.WRID = format.Retag(wr.WRID, format.TagShared, 0)
	p.postWR(vc.dq, wr)
	u.Sent = p.clock()
	vc.reliability().tx.Push(u)
	if vc.dq.path.Sent(u.Sent) {
		if vc.dq.path.OnRC() {
			p.e.stats.toRC.Add(1)
		} else {
			p.e.stats.toUC.Add(1)
		}
	}
	if !vc.rtxWatched {
		vc.rtxWatched = true
		p.rel.rtx = append(p.rel.rtx, vc)
	}
}

// retransmit resends the datagrams that are due (reliable.Sender.Due), on
// the vconns the poller watches; it returns whether any vconn still waits
// for acknowledgements. Only the poller, which owns their send sides.
func (p *poller) retransmit(now time.Time) bool {
	k := 0
	for _, vc := range p.rel.rtx {
		live := vc.state.Load() == stateOpen || vc.state.Load() == stateClosing
		if p.resendDue(vc, live, now) {
			p.rel.rtx[k] = vc
			k++
		} else {
			vc.rtxWatched = false
		}
	}
	clear(p.rel.rtx[k:])
	p.rel.rtx = p.rel.rtx[:k]
	return k > 0
}

// resendDue resends what is due of one vconn's datagrams and reports
// whether it still waits for acknowledgements.
func (p *poller) resendDue(vc *VConn, live bool, now time.Time) bool {
	e := p.e
	r := vc.reliability()
	if !live {
		p.dropUnacked(vc)
	}
	p.freeAcked(vc, r)
	remote := vqpn.ID(vc.remote.Load())
	resendTo := r.tx.TakeResend(now)
	pending := r.tx.Pending()
	timedOut := false
	for i := range pending {
		u := &pending[i]
		due, early := r.tx.Due(u, now, resendTo)
		if !due {
			continue
		}
		if reliable.Dead(u) {
			vc.fail(fmt.Errorf("%w: no acknowledgement after %d retransmissions", ErrPeerGone, reliable.MaxTries))
			return false
		}
		if q := vc.dq; q.outstanding+len(q.batch) >= e.cfg.SQDepth || p.tx.budget <= 0 {
			break
		}
		// The buffer goes again as it was, with the acknowledgement it
		// first carried: rewriting it while an earlier post of it may
		// not have been read would race with the device.
		e.pool.ref(bufSlot(u.Buf))
		wr := p.bundleWR(vc, remote, u)
		wr.WRID = format.Retag(wr.WRID, format.TagShared, format.TagSent) // counted sent the first time
		p.postWR(vc.dq, wr)
		if early {
			e.stats.gapResends.Add(1)
			vc.dq.path.Lost() // the peer reported it missing
		} else {
			timedOut = true
		}
		reliable.Resent(u, now)
		e.stats.retransmits.Add(1)
	}
	if timedOut {
		r.tx.Backoff(now)
		// One loss, however many datagrams timed out: a lost or late
		// acknowledgement (a credit grant RC is still recovering) times
		// out every datagram in flight, which all arrived.
		vc.dq.path.Lost()
	}
	return r.tx.Waiting() && live
}
