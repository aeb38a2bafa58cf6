package engine

import (
	"errors"
	"fmt"
	"github.com/rdmavisor/rdmavisor/internal/engine/reliable"
	"github.com/rdmavisor/rdmavisor/internal/engine/wire"

	"github.com/rdmavisor/rdmavisor/internal/verbs"
	"github.com/rdmavisor/rdmavisor/internal/vqpn"
)

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
			e.pool.put(ent.slot())
			vc.ring.pop()
			p.took(vc)
		}
		vc.wakeSender()
		if vc.rstDue.Swap(false) {
			p.control(q, vc, remote, wire.Reset)
		}
		return
	}
	if !remote.Valid() {
		return // not connected yet; Connect's sends reschedule
	}
	// (Auto's own fields are off the hot lines: other vconns never read them.)
	if vc.tr == Auto && vc.ackRecv.Load() && vc.ackRecv.Swap(false) {
		p.freeAcked(vc.reliability()) // another poller received them
	}
	limit := e.cfg.SQDepth
	stalled := false // data waits for the peer's grant
	for {
		ent, ok := vc.ring.peek(&vc.ents)
		if !ok {
			break
		}
		slot, n := ent.slot(), ent.len()
		if slot == opMarker {
			rg := vc.regions.Load()
			o := &rg.op
			if q.outstanding+len(q.batch)+len(o.wrs) > limit || p.budget < len(o.wrs) {
				p.later = append(p.later, vc)
				vc.scheduled.Store(true)
				break
			}
			for _, wr := range o.wrs {
				p.postWR(q, wr)
			}
			rg.mu.Lock()
			rg.posted++
			rg.mu.Unlock()
			vc.ring.pop()
			p.took(vc)
			continue
		}
		b := wire.Raw(e.pool.bytes(slot))
		data := b.Type() == wire.Data
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
		auto := data && vc.tr == Auto && b.Whole() && vc.autoDgram(n)
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
			stalled = true
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
		if data && b.Last() {
			p.countSent(vc.tr, 1, int(b.Length()))
		}
		if auto {
			seq := b.Seq()
			p.sendReliable(vc, remote, reliable.Datagram{Seq: seq, Last: seq, Buf: uint32(slot), Len: n})
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
	owed := (vc.creditDue.Load() || vc.ackDue.Load() || vc.tr == Auto && vc.nackDue.Load()) && vc.state.Load() == stateOpen
	if !vc.ring.empty() {
		// A grant owed rides on the next data, unless that data waits
		// for the peer's grant: then it goes alone, or, with both ends
		// sending, each would wait for the other's grant forever.
		if stalled && owed {
			p.control(q, vc, remote, wire.Credit)
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
		p.control(q, vc, remote, wire.Credit)
	}
	p.confirmUnexports(q, vc, remote)
	if st == stateClosing && vc.finDue.Load() && !vc.finPosted {
		vc.finPosted = true
		p.control(q, vc, remote, wire.Fin)
	}
}

// confirmUnexports posts the unexport confirmations that may go now.
func (p *poller) confirmUnexports(q *sendQP, vc *VConn, remote vqpn.ID) {
	if vc.regions.Load() == nil {
		return
	}
	p.confirm = vc.takeUnexportAcks(p.confirm[:0])
	for _, id := range p.confirm {
		p.controlRegion(q, vc, remote, wire.Unexported, id)
	}
}

// control posts a credit grant, FIN or RST.
func (p *poller) control(q *sendQP, vc *VConn, remote vqpn.ID, t wire.Type) {
	p.controlRegion(q, vc, remote, t, 0)
}

// controlRegion posts a control message; one about a region (an
// unexported) names it.
func (p *poller) controlRegion(q *sendQP, vc *VConn, remote vqpn.ID, t wire.Type, region uint32) {
	e := p.e
	var slot bufSlot
	ok := q.outstanding+len(q.batch) < e.cfg.SQDepth && p.budget > 0
	if ok {
		slot, ok = e.pool.get(0)
	}
	if !ok {
		// No room or no buffer now: try again next round.
		switch t {
		case wire.Fin:
			vc.finPosted = false
		case wire.Reset:
			vc.rstDue.Store(true)
		case wire.Unexported:
			rg := vc.rg()
			rg.mu.Lock()
			rg.unexportAcks = append(rg.unexportAcks, unexportAck{id: region})
			rg.mu.Unlock()
		}
		p.later = append(p.later, vc)
		vc.scheduled.Store(true)
		return
	}
	h := wire.RegionHeader(t, region)
	b := wire.Raw(e.pool.bytes(slot))
	h.Put(b)
	vc.stampCredit(b)
	if t == wire.Credit && vc.nackDue.Swap(false) {
		// The gap goes with the acknowledgement just stamped, unless a
		// resend filled it meanwhile.
		if end := vc.reliability().rx.GapEnd(); int32(end-b.Ack()) > 0 {
			b.SetGap(end)
		}
	}
	p.post(q, vc, remote, slot, wire.HeaderLen)
}

// sendWR is the SEND_WITH_IMM of n bytes of buffer slot for vc: wr_id
// names the vconn and the buffer its completion frees, imm_data the
// peer's vconn.
func (p *poller) sendWR(vc *VConn, remote vqpn.ID, slot bufSlot, n uint32) verbs.SendWR {
	tag := wire.TagOf(uint32(slot))
	switch b := wire.Raw(p.e.pool.bytes(slot)); b.Type() {
	case wire.Data, wire.Bundle:
		if b.Last() {
			tag |= wire.TagSent
		}
	case wire.Fin:
		tag |= wire.TagFin
	}
	return verbs.SendWR{
		WRID:    tag.WRID(vc.id),
		Opcode:  verbs.WRSendWithImm,
		Flags:   verbs.SendSignaled,
		ImmData: vqpn.Imm(remote),
		NumSGE:  1,
		SG:      [verbs.MaxSGE]verbs.SGE{p.e.pool.sge(slot, n)},
	}
}

func (p *poller) post(q *sendQP, vc *VConn, remote vqpn.ID, slot bufSlot, n uint32) {
	p.postWR(q, p.sendWR(vc, remote, slot, n))
}

// postUD posts a datagram to the peer's UD QP that pairs with this poller.
func (p *poller) postUD(vc *VConn, remote vqpn.ID, slot bufSlot, n uint32) {
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
				id, tag := wire.SplitWRID(wr.WRID)
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
			if slot.class() == c.class {
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
