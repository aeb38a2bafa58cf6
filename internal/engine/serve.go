package engine

import (
	"github.com/rdmavisor/rdmavisor/internal/engine/format"
	"github.com/rdmavisor/rdmavisor/internal/engine/reliable"
	"github.com/rdmavisor/rdmavisor/internal/transport"
	"github.com/rdmavisor/rdmavisor/internal/vqpn"
)

// Serving a vconn: what the poller does when it takes a vconn off its QP's
// run queue (sched.go). Everything here runs on the poller that owns the
// vconn's QPs (vc.sq.p), which alone consumes the vconn's ring.

// serve moves a vconn's queued buffers into its QP's batch, as far as
// credits and the send queue allow, then the control messages it owes.
func (p *poller) serve(vc *VConn) {
	st := vc.state.Load()
	remote := vqpn.ID(vc.remote.Load())
	if st == stateClosed || st == stateFailed {
		p.serveDead(vc, remote)
		return
	}
	if !remote.Valid() {
		return // not connected yet; Connect's sends reschedule
	}
	// (Auto's own fields are off the hot lines: other vconns never read them.)
	if vc.tr == transport.Auto && vc.ackRecv.Load() && vc.ackRecv.Swap(false) {
		p.freeAcked(vc, vc.reliability()) // another poller received them
	}
	// A stall's flag that its grant raced is cleared here, at the serve
	// that grant scheduled (or at any other).
	if vc.creditWait.Load() {
		vc.creditWait.Store(false)
	}
	stalled := p.drain(vc, remote)
	if vc.ring.free() > 0 {
		// A sender woken without room would only schedule the vconn
		// again, to find it stalled again: on a stream waiting for
		// credits that ping-pong made 24 wake-ups a message.
		vc.wakeSender()
	}
	p.serveControl(vc, remote, st, stalled)
}

// serveDead returns what a closed or failed vconn still has queued to the
// pool: nothing more is sent, but a RST Abort asked for.
func (p *poller) serveDead(vc *VConn, remote vqpn.ID) {
	if vc.tr == transport.Auto {
		p.dropUnacked(vc)
	}
	for {
		ent, ok := vc.ring.peek(&vc.ents)
		if !ok {
			break
		}
		p.e.pool.put(ent.slot())
		vc.ring.pop()
		p.took(vc)
	}
	vc.wakeSender()
	if vc.rstDue.Swap(false) {
		p.control(vc.sq, vc, remote, format.Reset)
	}
}

// drain moves the vconn's queued buffers into work requests until the ring
// is empty, the peer's credits run out (it reports stalled then) or the
// QP has no room (the vconn waits on p.sched.later).
func (p *poller) drain(vc *VConn, remote vqpn.ID) (stalled bool) {
	e := p.e
	for {
		ent, ok := vc.ring.peek(&vc.ents)
		if !ok {
			return false
		}
		slot, n := ent.slot(), ent.len()
		if slot == opMarker {
			if !p.postMarker(vc) {
				return false
			}
			continue
		}
		b := format.Raw(e.pool.bytes(slot))
		dq, auto, credited := p.route(vc, b, n)
		if credited && vc.sent == vc.limit.Load() {
			p.creditStall(vc)
			return true // the peer's grant reschedules us
		}
		if dq.outstanding+len(dq.batch) >= e.cfg.SQDepth || p.tx.budget <= 0 {
			p.deferVC(vc)
			return false
		}
		if auto && vc.ring.len() > 1 && p.bundle(vc, remote) > 0 {
			vc.sent++ // a credit per receive buffer (bundle.go)
			continue
		}
		p.sendQueued(vc, remote, dq, auto, slot, n)
		if credited {
			vc.sent++
		}
	}
}

// route says which QP a queued message goes on, whether as an Auto
// datagram, and whether it takes one of the peer's receive credits.
func (p *poller) route(vc *VConn, b format.Raw, n uint32) (dq *sendQP, auto, credited bool) {
	// Data goes on the vconn's transport; control always on RC. Only
	// reliable data consumes receive credits: a lost datagram would take
	// its credit with it.
	dq = vc.sq
	data := b.Type() == format.Data
	if data {
		switch vc.tr {
		case transport.UD:
			dq = p.udq.qp
		case transport.UC:
			dq = vc.dq
		}
	}
	// Only whole messages go as datagrams: the chunks of a long one all
	// travel on RC, in order.
	//
	// Where loss made the path's RC cheaper, small messages take RC too,
	// but for the probes that keep measuring (reliable.Path). They are in
	// the one sequence of the vconn either way, which the receiver
	// delivers in order whichever QP each came on (deliverSeq), so the
	// switch needs no draining.
	auto = data && vc.tr == transport.Auto && b.Whole() && vc.autoDgram(n) && vc.dq.path.Datagram()
	if auto {
		dq = vc.dq
	}
	return dq, auto, data && (dq == vc.sq || auto)
}

// creditStall takes what waits for the peer's reader off the QP's
// backlog, or one slow reader would throttle every sender on the QP.
//
// It also sets creditWait, so that the sender's next pushes neither wake
// the poller nor count in the backlog, under sendMu, so that no push falls
// between the flag and the count; unless a sender holds sendMu, as one
// parked for room in the ring does (it pushes nothing meanwhile): then
// each push wakes the poller, as before the flag.
func (p *poller) creditStall(vc *VConn) {
	p.e.stats.creditStalls.Add(1)
	locked := vc.sendMu.TryLock()
	if locked {
		vc.creditWait.Store(true)
	}
	if k := int32(vc.ring.len()) - vc.uncounted.Load(); k > 0 {
		vc.uncounted.Add(k)
		p.sched.popped += k
	}
	if locked {
		vc.sendMu.Unlock()
	}
}

// deferVC has a vconn that found no room wait for the next round, behind
// the QP's run queue.
func (p *poller) deferVC(vc *VConn) {
	p.sched.later = append(p.sched.later, vc)
	vc.scheduled.Store(true)
}

// postMarker posts the one-sided operation whose marker heads the ring,
// and reports false (the vconn waits) when the QP has no room for it.
func (p *poller) postMarker(vc *VConn) bool {
	q := vc.sq
	rg := vc.regions.Load()
	o := &rg.op
	if q.outstanding+len(q.batch)+len(o.wrs) > p.e.cfg.SQDepth || p.tx.budget < len(o.wrs) {
		p.deferVC(vc)
		return false
	}
	for _, wr := range o.wrs {
		p.postWR(q, wr)
	}
	rg.mu.Lock()
	rg.posted++
	rg.mu.Unlock()
	vc.ring.pop()
	p.took(vc)
	return true
}

// sendQueued stamps and posts the buffer at the head of the ring on dq
// (kept until acknowledged if auto), and takes it off the ring.
func (p *poller) sendQueued(vc *VConn, remote vqpn.ID, dq *sendQP, auto bool, slot bufSlot, n uint32) {
	b := format.Raw(p.e.pool.bytes(slot))
	vc.stampCredit(b)
	if b.Type() == format.Data && b.Last() {
		p.countSent(vc.tr, 1, int(b.Length()))
	}
	switch {
	case auto:
		seq := b.Seq()
		p.sendReliable(vc, remote, reliable.Datagram{Seq: seq, Last: seq, Buf: uint32(slot), Len: n})
	case dq == p.udq.qp:
		p.postUD(vc, remote, slot, n)
	default:
		p.post(dq, vc, remote, slot, n)
	}
	vc.ring.pop()
	p.took(vc)
}

// serveControl posts the control messages the vconn owes once its data is
// served: a credit grant (with Auto's acknowledgement and gap report), the
// unexport confirmations, and after the last data of a closing vconn its
// FIN.
func (p *poller) serveControl(vc *VConn, remote vqpn.ID, st uint32, stalled bool) {
	q := vc.sq
	// A closing Auto vconn still acknowledges: the peer's FIN waits for
	// its datagrams' acknowledgements.
	live := st == stateOpen || vc.tr == transport.Auto && st == stateClosing
	owed := (vc.creditDue.Load() || vc.ackDue.Load() || vc.tr == transport.Auto && vc.nackDue.Load()) && live
	if !vc.ring.empty() {
		// A grant owed rides on the next data, unless that data waits
		// for the peer's grant: then it goes alone, or, with both ends
		// sending, each would wait for the other's grant forever.
		if stalled && owed {
			p.control(q, vc, remote, format.Credit)
		}
		// Unexport confirmations do not wait behind data either: the
		// peer's memory stays registered until they arrive, and this
		// side's reader, or the peer's, may hold that data back for
		// good (onUnexport).
		if stalled {
			p.confirmUnexports(q, vc, remote)
		}
		return
	}
	if owed {
		p.control(q, vc, remote, format.Credit)
	}
	p.confirmUnexports(q, vc, remote)
	// A FIN is due after the last data of a closing vconn, or of an open
	// one whose sending side was closed (CloseWrite). Auto's datagrams
	// must all be acknowledged first: the FIN goes over RC and would
	// overtake one the network lost, whose resend would come after the
	// peer's EOF (onAck serves the vconn again when the last ack comes).
	if (st == stateClosing || st == stateOpen) && vc.finDue.Load() && !vc.finPosted && !vc.datagramsUnacked() {
		vc.finPosted = true
		p.control(q, vc, remote, format.Fin)
	}
}

// confirmUnexports posts the unexport confirmations that may go now.
func (p *poller) confirmUnexports(q *sendQP, vc *VConn, remote vqpn.ID) {
	if vc.regions.Load() == nil {
		return
	}
	p.tx.confirm = vc.takeUnexportAcks(p.tx.confirm[:0])
	for _, id := range p.tx.confirm {
		p.controlRegion(q, vc, remote, format.Unexported, id)
	}
}

// control posts a credit grant, FIN or RST.
func (p *poller) control(q *sendQP, vc *VConn, remote vqpn.ID, t format.Type) {
	p.controlRegion(q, vc, remote, t, 0)
}

// controlRegion posts a control message; one about a region (an
// unexported) names it.
func (p *poller) controlRegion(q *sendQP, vc *VConn, remote vqpn.ID, t format.Type, region uint32) {
	e := p.e
	var slot bufSlot
	ok := q.outstanding+len(q.batch) < e.cfg.SQDepth && p.tx.budget > 0
	if ok {
		slot, ok = e.pool.get(0)
	}
	if !ok {
		// No room or no buffer now: try again next round.
		switch t {
		case format.Fin:
			vc.finPosted = false
		case format.Reset:
			vc.rstDue.Store(true)
		case format.Unexported:
			rg := vc.rg()
			rg.mu.Lock()
			rg.unexportAcks = append(rg.unexportAcks, unexportAck{id: region})
			rg.mu.Unlock()
		}
		p.deferVC(vc)
		return
	}
	h := format.RegionHeader(t, region)
	b := format.Raw(e.pool.bytes(slot))
	h.Put(b)
	vc.stampCredit(b)
	if t == format.Credit && vc.nackDue.Swap(false) {
		// The gap goes with the acknowledgement just stamped, unless a
		// resend filled it meanwhile.
		if end := vc.reliability().rx.GapEnd(); int32(end-b.Ack()) > 0 {
			b.SetGap(end)
		}
	}
	p.post(q, vc, remote, slot, format.HeaderLen)
}
