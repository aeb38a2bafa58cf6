package engine

import (
	"fmt"
	"sync/atomic"
	"time"

	"github.com/rdmavisor/rdmavisor/internal/engine/format"
	"github.com/rdmavisor/rdmavisor/internal/engine/reliable"
	"github.com/rdmavisor/rdmavisor/internal/transport"
	"github.com/rdmavisor/rdmavisor/internal/verbs"
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

// autoLink is a vconn's side of Auto's reliability: the state machine
// (reliability, package reliable), created on first use, and the flags that have
// a poller act on it. Its fields are touched here alone (TestOwners):
// the rest of the engine asks through its methods.
type autoLink struct {
	ptr     atomic.Pointer[reliability]
	watched bool        // the serving poller's: on its retransmission list (p.rel.rtx)
	ackWait atomic.Bool // on a poller's delayed-acknowledgement list
	nackDue atomic.Bool // a gap report should go out (see reportGap)
	ackRecv atomic.Bool // another poller received acknowledgements for the send side (see onAck)
}

// reliability is an Auto vconn's reliability state (package reliable).
//
// The send side belongs to the poller of the vconn's QPs (vc.sq.p), which
// alone posts, retransmits and frees its datagrams, so it takes no lock:
// the poller that receives the peer's acknowledgements (another one, with
// several) only records them, and has the owner free what they cover
// (freeAcked). The receive side, which any poller may reach, locks.
type reliability struct {
	tx reliable.Sender
	rx reliable.Receiver[Message]
}

func (a *autoLink) load() *reliability {
	if r := a.ptr.Load(); r != nil {
		return r
	}
	a.ptr.CompareAndSwap(nil, &reliability{})
	return a.ptr.Load()
}

// ack is the cumulative acknowledgement to stamp on outgoing messages.
// Only the vconn's poller, as it posts.
func (a *autoLink) ack() uint32 { return a.load().rx.Ack() }

// unacked: an Auto vconn has datagrams the peer has not acknowledged.
// Only the owner of the send side.
func (a *autoLink) unacked() bool {
	r := a.ptr.Load()
	return r != nil && r.tx.Waiting()
}

// gapOwed: a gap report should go out (with a credit grant).
func (a *autoLink) gapOwed() bool { return a.nackDue.Load() }

// stampGap adds the gap report owed, if any, to a grant whose
// acknowledgement is stamped already, unless a resend filled the gap
// meanwhile. The serving poller.
func (a *autoLink) stampGap(b format.Raw) {
	if a.nackDue.Swap(false) {
		if end := a.load().rx.GapEnd(); int32(end-b.Ack()) > 0 {
			b.SetGap(end)
		}
	}
}

// dropEarly returns the early arrivals a released Auto vconn holds; its
// poller frees its unacknowledged datagrams (dropUnacked) when it serves
// it next. The goroutine that releases the vconn.
func (a *autoLink) dropEarly() {
	if r := a.ptr.Load(); r != nil {
		r.rx.DropEarly(func(m Message) {
			m.dropCredit()
			m.Release()
		})
	}
}

// autoDgram reports whether a message of n bytes (header included) goes as
// a datagram on this Auto vconn.
func (vc *VConn) autoDgram(n uint32) bool {
	e := vc.e
	return n-format.HeaderLen <= uint32(e.cfg.AutoThreshold) && int(n) <= e.cfg.ChunkSize
}

// datagram reports whether a whole message of n bytes (header included)
// goes as a datagram now: it is small enough, and the path is not on RC
// (reliable.Path), or this one is its probe.
func (vc *VConn) datagram(n uint32) bool { return vc.autoDgram(n) && vc.dq.path.Datagram() }

// earlyWindow is how far past a gap the vconn keeps messages.
func (vc *VConn) earlyWindow() int { return reliable.EarlyWindow(vc.e.cfg.MaxCredits) }

// ackedElsewhere frees what the acknowledgements another poller received
// cover (see onAck). The owner of the send side, serving the vconn.
func (p *poller) ackedElsewhere(vc *VConn) {
	if a := &vc.auto; a.ackRecv.Load() && a.ackRecv.Swap(false) {
		p.freeAcked(vc, a.load())
	}
}

// onAck records an acknowledgement the peer sent, received by poller p:
// p frees what it covers if it owns the send side, else the owner does
// when it next serves the vconn. Any poller that receives for vc.
func (p *poller) onAck(vc *VConn, ack uint32) {
	r := vc.auto.load()
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
	vc.auto.ackRecv.Store(true)
	vc.schedule()
}

// freeAcked frees the datagrams the peer acknowledged. Only the owner of
// the send side, vc.sq.p.
func (p *poller) freeAcked(vc *VConn, r *reliability) {
	r.tx.FreeAcked(p.e.epoch, p.freeDatagram)
	sample := r.tx.TakeSample()
	vc.dq.path.RTT(sample)
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
	r := &vc.auto.load().rx
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
	if (dgram || released > 0) && !vc.auto.ackWait.Load() && !vc.auto.ackWait.Swap(true) {
		p.rel.acks = append(p.rel.acks, ackWaiter{vc, r.AckSent()})
	}
}

// reportGap has the vconn's poller send a gap report, if there is news
// of one (reliable.Receiver.Hold).
func (vc *VConn) reportGap(news bool) {
	if news && !vc.auto.nackDue.Swap(true) {
		vc.schedule()
	}
}

// onGap has the owner of the send side resend at once the datagrams the
// peer reports missing, from its acknowledgement up to end (see
// retransmit). Any poller that receives for vc.
func (vc *VConn) onGap(end uint32) {
	vc.auto.load().tx.OnGap(end)
	p := vc.sq.p
	p.rel.soon.Store(true)
	p.kick()
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
		r := &vc.auto.load().rx
		next, sent := r.Next(), r.AckSent()
		switch {
		case next == sent:
			vc.auto.ackWait.Store(false)
		case sent != w.sent && !now:
			p.rel.acks[k] = ackWaiter{vc, sent}
			k++
		default:
			vc.auto.ackWait.Store(false)
			if !vc.ackDue.Swap(true) {
				vc.schedule()
			}
		}
	}
	clear(p.rel.acks[k:])
	p.rel.acks = p.rel.acks[:k]
}

// dropUnacked frees the datagrams of a vconn that will send no more. Only
// the owner of the send side.
func (p *poller) dropUnacked(vc *VConn) {
	if r := vc.auto.ptr.Load(); r != nil {
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
	vc.auto.load().tx.Push(u)
	if vc.dq.path.Sent(u.Sent) {
		if vc.dq.path.OnRC() {
			p.e.stats.toRC.Add(1)
		} else {
			p.e.stats.toUC.Add(1)
		}
	}
	if !vc.auto.watched {
		vc.auto.watched = true
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
			vc.auto.watched = false
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
	r := vc.auto.load()
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

// Bundles: when an Auto vconn has several whole datagram-sized messages
// queued, the poller packs as many as fit a chunk into one datagram, as
// SCTP bundles chunks and TCP coalesces writes: one work request, one
// completion, a packet or a few, one receive buffer, where each message
// alone costs all of those. Only what is already queued is bundled;
// nothing waits for company, so a lone message goes as it came.
//
// Bundling is Auto's, as choosing the transport by size is: the engine
// decides how an Auto vconn's messages travel. The fixed transports post
// what they are given, a work request per message (per chunk), so that
// what an application asks for is what the device sees.
//
// A bundle is a format.Bundle header (length: the bytes after it; seq: its
// first message's; imm: how many messages) followed by the messages, each
// with its own format.Data header, as the sender queued them: copied after the
// header, or, for longer messages, gathered from their own buffers by the
// work request (gatherMin). It is acknowledged and resent whole, and its
// receive buffer is shared by the messages (bufPool.share) and reposted
// when the last is released. It takes one receive credit, not one per
// message: a credit stands for a receive buffer, as eRPC's stand for
// packets, so a reader behind by a window of credits holds a window of
// buffers whatever they carry, and a sender that runs out of credits
// queues, and so bundles, more messages per credit.

// maxBundle is the most messages one bundle carries: a ring's worth, which
// is what the format allows (TestBundleFitsRing fails if the two part).
const maxBundle = ringSize

// gatherMin is the length (header included) from which queued messages
// are bundled by gathering rather than copied: the bundle's work request
// lists their buffers after its header (up to verbs.MaxSGE-1 of them), and
// the device reads them as it sends, as a NIC does by DMA. Shorter ones
// are copied, a ring's worth at most: copying a kilobyte or two costs less
// than the work requests it saves, and a bundle of them would need more
// scatter/gather entries than a QP has. Measured on the soft provider, one
// vconn, auto over uc: 1 KiB messages copied 15 to a bundle ran 1.11-1.18x,
// gathered 3 to a bundle 0.88-1.11x (the low end when the host was slow);
// 2 KiB ones copied 0.75x, gathered 0.91x.
const gatherMin = 2048

// bundle packs the datagram-sized messages at the head of Auto vconn vc's
// ring, as many as fit a chunk, into one datagram on its UC QP (which takes
// one credit); it reports how many it took, 0 when fewer than two fit or
// no buffer is free.
func (p *poller) bundle(vc *VConn, remote vqpn.ID) int {
	e := p.e
	if vc.dq.path.OnRC() {
		return 0 // a probe goes alone (reliable.Path)
	}
	head, _ := vc.snd.at(0)
	gather := head.len() >= gatherMin
	limit := maxBundle
	if gather {
		limit = min(limit, verbs.MaxSGE-1)
	}
	room := e.cfg.ChunkSize - format.HeaderLen
	k, total := 0, 0
	for k < limit {
		ent, ok := vc.snd.at(k)
		if !ok {
			break
		}
		slot, n := ent.slot(), ent.len()
		if slot == opMarker || total+int(n) > room {
			break
		}
		b := format.Raw(e.pool.bytes(slot))
		if b.Type() != format.Data || !b.Whole() || !vc.autoDgram(n) {
			break
		}
		total += int(n)
		k++
	}
	if k < 2 {
		return 0
	}
	size := format.HeaderLen + total
	if gather {
		size = format.HeaderLen + gatherLen*k
	}
	out, ok := e.pool.get(e.pool.class(size))
	if !ok {
		return 0
	}
	b := e.pool.bytes(out)
	off := format.HeaderLen
	var seq uint32
	for i := 0; i < k; i++ {
		ent, _ := vc.snd.peek()
		slot, n := ent.slot(), ent.len()
		if i == 0 {
			seq = format.Raw(e.pool.bytes(slot)).Seq()
		}
		if gather {
			putGathered(b, i, slot, n)
		} else {
			off += copy(b[off:], e.pool.bytes(slot)[:n])
			e.pool.put(slot)
		}
		p.took(vc)
	}
	h := format.BundleHeader(seq, uint32(k), uint32(total))
	h.Put(b)
	vc.stampCredit(b)
	e.stats.msgsSent.Add(uint64(k - 1)) // its completion counts one
	p.countSent(transport.Auto, k, total-k*format.HeaderLen)
	e.stats.bundled.Add(uint64(k))
	if gather {
		e.stats.gathered.Add(uint64(k))
	}
	p.sendReliable(vc, remote, reliable.Datagram{Seq: seq, Last: seq + uint32(k-1), Buf: uint32(out), Len: uint32(size), Gather: gather})
	return k
}

// bundleWR is the work request of a datagram: a bundle, or one message.
func (p *poller) bundleWR(vc *VConn, remote vqpn.ID, u *reliable.Datagram) verbs.SendWR {
	slot := bufSlot(u.Buf)
	if !u.Gather {
		return p.sendWR(vc, remote, slot, u.Len)
	}
	e := p.e
	b := e.pool.bytes(slot)
	k := int(format.Raw(b).Count())
	wr := verbs.SendWR{
		WRID:    (format.TagOf(u.Buf) | format.TagSent | format.TagGather).WRID(vc.id),
		Opcode:  verbs.WRSendWithImm,
		Flags:   verbs.SendSignaled,
		ImmData: vqpn.Imm(remote),
		NumSGE:  uint8(k + 1),
	}
	wr.SG[0] = e.pool.sge(slot, format.HeaderLen)
	for i := range k {
		wr.SG[i+1] = e.pool.sge(gathered(b, i))
	}
	return wr
}

// onBundle delivers the messages of a bundle. The bundle is checked whole
// first: a malformed one fails the vconn and delivers nothing.
func (p *poller) onBundle(vc *VConn, h *format.Header, slot bufSlot, payload []byte) {
	if vc.tr != transport.Auto || slot.class() != p.e.dgramClass || format.CheckBundle(h, payload) != nil {
		p.malformed(vc, slot)
		return
	}
	// The bundle took one credit, as it takes one receive buffer: it comes
	// back with the buffer, after the last of its messages is released.
	credits := uint32(0)
	if vc.auto.load().rx.FirstCopy(h.Seq, vc.earlyWindow()) {
		if !vc.takeCredit() {
			p.overrun(vc)
			p.rx.reposts = append(p.rx.reposts, slot)
			return
		}
		credits = 1
	}
	p.e.pool.share(slot, int32(h.Count()))
	for it := format.Bundled(payload); it.Next(); {
		imm, hasImm := it.Header.AppImm()
		vc.deliverSeq(p, it.Header.Seq, Message{vc: vc, Data: it.Data, Imm: imm, HasImm: hasImm, slot: slot, shared: true, credits: credits}, true)
	}
}
