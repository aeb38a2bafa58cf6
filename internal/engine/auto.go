package engine

import (
	"fmt"
	"sync/atomic"
	"time"

	"github.com/rdmavisor/rdmavisor/internal/engine/format"
	"github.com/rdmavisor/rdmavisor/internal/engine/reliable"
	"github.com/rdmavisor/rdmavisor/internal/transport"
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
	watched bool // the serving poller's: on its retransmission list (p.rel.rtx)
	// rcIn counts the data chunks received on RC, mod 2^16: the poller
	// of the QP they come on (a replacement's is the old one's). Here,
	// beside watched, it fits in the struct's padding.
	rcIn    uint16
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

// rcChunk compares the number of a data chunk received on RC with the
// count of those taken, and takes it if it is the next: it returns how
// far ahead of the count it is (behind, if negative) and the count before.
// The poller of the QP the chunks come on (the peer sends them on one).
func (a *autoLink) rcChunk(no uint16) (int32, uint16) {
	want := a.rcIn
	d := int32(int16(no - want))
	if d == 0 {
		a.rcIn++
	}
	return d, want
}

// unacked: an Auto vconn has datagrams the peer has not acknowledged.
// Only the owner of the send side.
func (a *autoLink) unacked() bool {
	r := a.ptr.Load()
	return r != nil && r.tx.Waiting()
}

// waitAck puts the vconn on its receiving poller's delayed-acknowledgement
// list, unless it is on one: it reports whether the caller should add it.
func (a *autoLink) waitAck() bool { return !a.ackWait.Load() && !a.ackWait.Swap(true) }

// oweGap records that a gap report should go out, and reports whether
// that is news (the vconn needs scheduling).
func (a *autoLink) oweGap() bool { return !a.nackDue.Swap(true) }

// loaded is the reliability state, or nil if the vconn never used it.
func (a *autoLink) loaded() *reliability { return a.ptr.Load() }

// watch marks the vconn as on its serving poller's retransmission list,
// and reports whether it was not (the caller adds it). The serving
// poller; retransmit takes it off.
func (a *autoLink) watch() bool {
	if a.watched {
		return false
	}
	a.watched = true
	return true
}

// takeAckRecv reports, once, that another poller received
// acknowledgements for the send side (onAck).
func (a *autoLink) takeAckRecv() bool { return a.ackRecv.Load() && a.ackRecv.Swap(false) }

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

// earlyWindow is how far past a gap the vconn keeps messages.
func (vc *VConn) earlyWindow() int { return reliable.EarlyWindow(vc.e.cfg.MaxCredits) }

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
		wr := p.bundleWR(vc, remote, u, true)
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
