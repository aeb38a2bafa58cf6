package engine

import (
	"github.com/rdmavisor/rdmavisor/internal/engine/format"
	"github.com/rdmavisor/rdmavisor/internal/engine/reliable"
	"github.com/rdmavisor/rdmavisor/internal/transport"
	"github.com/rdmavisor/rdmavisor/internal/verbs"
	"github.com/rdmavisor/rdmavisor/internal/vqpn"
)

// Serving a vconn: what the poller does when it takes a vconn off its QP's
// run queue (cq.go), from its ring to the work requests it posts, Auto's
// datagrams and bundles included. Everything here runs on the poller that
// owns the vconn's QPs (vc.sq.p), which alone consumes the vconn's ring,
// and keeps what it alone writes per vconn in served (vconn.go), whose
// fields are touched here alone (TestOwners).

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
	if vc.tr == transport.Auto {
		p.ackedElsewhere(vc)
	}
	// A stall's flag that its grant raced is cleared here, at the serve
	// that grant scheduled (or at any other).
	vc.snd.unstall()
	stalled := p.drain(vc, remote)
	if vc.snd.free() > 0 {
		// A sender woken without room would only schedule the vconn
		// again, to find it stalled again: on a stream waiting for
		// credits that ping-pong made 24 wake-ups a message.
		vc.snd.wakeSender()
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
		ent, ok := vc.snd.peek()
		if !ok {
			break
		}
		p.free(ent.slot(), false)
		p.took(vc)
	}
	vc.snd.wakeSender()
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
		ent, ok := vc.snd.peek()
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
		if credited && vc.srv.sent == vc.limit.Load() {
			p.creditStall(vc)
			return true // the peer's grant reschedules us
		}
		if dq.outstanding+len(dq.batch) >= e.cfg.SQDepth || p.tx.budget <= 0 {
			p.deferVC(vc)
			return false
		}
		if auto && vc.snd.len() > 1 && p.bundle(vc, remote) > 0 {
			vc.srv.sent++ // a credit per receive buffer (see bundle)
			continue
		}
		p.sendQueued(vc, remote, dq, auto, slot, n)
		if credited {
			vc.srv.sent++
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
	auto = data && vc.tr == transport.Auto && b.Whole() && vc.datagram(n)
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
	locked := vc.snd.stall()
	p.sched.popped += vc.snd.uncountAll()
	vc.snd.endStall(locked)
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
	p.took(vc)
	return true
}

// sendQueued stamps and posts the buffer at the head of the ring on dq
// (kept until acknowledged if auto), and takes it off the ring.
func (p *poller) sendQueued(vc *VConn, remote vqpn.ID, dq *sendQP, auto bool, slot bufSlot, n uint32) {
	b := format.Raw(p.e.pool.bytes(slot))
	vc.stampCredit(b)
	if b.Type() == format.Data {
		switch {
		case vc.tr == transport.RC:
			// Every RC data chunk takes a credit, so the count of those
			// sent numbers them: the receiver drops the ones its QP had
			// delivered when a replacement QP sends them again (repair.go).
			b.SetChunkNo(vc.srv.sent)
		case dq == vc.sq && vc.tr == transport.Auto && vc.peer.dedupsAuto.Load():
			// An Auto vconn's credits count its datagrams too, which may
			// be lost: its RC chunks are counted apart (arg is the ack).
			b.SetAutoChunkNo(vc.srv.rcChunks)
			vc.srv.rcChunks++
		}
		if b.Last() {
			p.countSent(vc.tr, 1, int(b.Length()))
		}
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
	p.took(vc)
}

// took takes the entry at the head of vc's ring, accounting for it in
// the QP's backlog. The poller, which consumes the ring.
func (p *poller) took(vc *VConn) {
	if vc.snd.pop() {
		p.sched.popped++
	}
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
	owed := (vc.creditDue.Load() || vc.ackDue.Load() || vc.tr == transport.Auto && vc.auto.gapOwed()) && live
	// The FIN's due before the ring's emptiness: Close follows the last
	// send's push, so a FIN seen due comes with that push seen. Read the
	// other way round, a ring found empty just before a send and a Close
	// sent the FIN ahead of the message (an echo, then close, read EOF
	// in place of the echo: 1 in 100 runs of TestInfiniBandAgents under
	// two CPU burners).
	fin := vc.finDue.Load()
	if !vc.snd.empty() {
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
	if (st == stateClosing || st == stateOpen) && fin && !vc.srv.finPosted && !vc.auto.unacked() {
		vc.srv.finPosted = true
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
			vc.srv.finPosted = false
		case format.Reset:
			vc.rstDue.Store(true)
		case format.Unexported:
			vc.retryUnexportAck(region)
		}
		p.deferVC(vc)
		return
	}
	h := format.RegionHeader(t, region)
	b := format.Raw(e.pool.bytes(slot))
	h.Put(b)
	vc.stampCredit(b)
	if t == format.Credit {
		vc.auto.stampGap(b) // with the acknowledgement just stamped
	}
	p.post(q, vc, remote, slot, format.HeaderLen)
}

// stampCredit writes the current grant into a queued buffer's header, and
// on an Auto vconn's data and grants the acknowledgement too; no separate
// grant is due after it. Only the vconn's poller, as it posts b.
func (vc *VConn) stampCredit(b []byte) {
	// The grant goes out with b, so none is due after it; but a release
	// after the grant is read sets creditDue again, and must find it
	// cleared already, or its credits would never be granted: clear
	// first, read second. (Cleared after the read, a release between the
	// two was lost, and a sender waiting for those credits waited
	// forever.) Likewise the acknowledgement.
	if vc.creditDue.Load() {
		vc.creditDue.Store(false)
	}
	h := format.Raw(b)
	h.SetCredit(vc.window.Stamp())
	if t := h.Type(); vc.tr == transport.Auto && (t == format.Data || t == format.Credit || t == format.Bundle) {
		if vc.ackDue.Load() {
			vc.ackDue.Store(false)
		}
		h.SetAck(vc.auto.ack())
	}
}

// sendWR is the SEND_WITH_IMM of n bytes of buffer slot for vc: wr_id
// names the vconn and the buffer its completion frees, imm_data the
// peer's vconn. set and clear adjust its tag's flags (see bundleWR).
func (p *poller) sendWR(vc *VConn, remote vqpn.ID, slot bufSlot, n uint32, set, clear format.Tag) verbs.SendWR {
	tag := format.TagOf(uint32(slot))
	switch b := format.Raw(p.e.pool.bytes(slot)); b.Type() {
	case format.Data, format.Bundle:
		if b.Last() {
			tag |= format.TagSent
		}
	case format.Fin:
		tag |= format.TagFin
	}
	tag = tag&^clear | set
	wr := verbs.SendWR{
		WRID:    tag.WRID(vc.id),
		Opcode:  verbs.WRSendWithImm,
		Flags:   verbs.SendSignaled,
		ImmData: vqpn.Imm(remote),
		NumSGE:  1,
		SG:      [verbs.MaxSGE]verbs.SGE{p.e.pool.sge(slot, n)},
	}
	if r := p.e.pool.lentOf(slot); r != nil { // the header here, the payload in place
		wr.NumSGE, wr.SG[0].Length, wr.SG[1] = 2, format.HeaderLen, r.sge()
	}
	return wr
}

// post adds the SEND of n bytes of slot to q's batch, with the QP pair's
// secret.
func (p *poller) post(q *sendQP, vc *VConn, remote vqpn.ID, slot bufSlot, n uint32) {
	format.Raw(p.e.pool.bytes(slot)).SetAuth(q.secret)
	p.postWR(q, p.sendWR(vc, remote, slot, n, 0, 0))
}

// postUD posts a datagram to the peer's UD QP that pairs with this poller,
// with the secret the peer gave our datagrams.
func (p *poller) postUD(vc *VConn, remote vqpn.ID, slot bufSlot, n uint32) {
	wr := p.sendWR(vc, remote, slot, n, 0, 0)
	var secret uint64
	wr.AH, wr.RemoteQPN, secret = vc.peer.udRoute(int(vc.id.VQPN()))
	wr.RemoteQKey = p.e.cfg.QKey
	format.Raw(p.e.pool.bytes(slot)).SetAuth(secret)
	p.postWR(p.udq.qp, wr)
}

// postWR adds wr to q's batch, posted at the end of the round
// (flushSends), and counts it against the CQ's budget.
func (p *poller) postWR(q *sendQP, wr verbs.SendWR) {
	q.batch = append(q.batch, wr)
	p.tx.budget--
	if !q.queued {
		q.queued = true
		p.tx.dirty = append(p.tx.dirty, q)
	}
}

// sent gives back the buffer of a SEND whose wr_id carried tag. The
// poller that posted it (its completion comes to the same CQ).
func (p *poller) sent(tag format.Tag) {
	slot, gather := bufSlot(tag.Slot()), tag.Has(format.TagGather)
	if !tag.Has(format.TagShared) {
		p.free(slot, gather)
		return
	}
	p.unref(slot, gather)
}

// unref drops an owner of a shared send buffer (bufPool.share) and frees it
// after the last. The poller that owns the buffer's sends.
func (p *poller) unref(slot bufSlot, gather bool) {
	if p.e.pool.unshare(slot) {
		p.free(slot, gather)
	}
}

// free puts a send buffer back; for a gathered bundle's header buffer
// (gather), the buffers of its messages too. The poller only.
func (p *poller) free(slot bufSlot, gather bool) {
	e := p.e
	if gather {
		b := e.pool.bytes(slot)
		for i := range int(format.Raw(b).Count()) {
			s, _ := gathered(b, i)
			e.pool.put(s)
		}
	}
	if r := e.pool.lentOf(slot); r != nil {
		r.give()
	}
	e.pool.put(slot)
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

// ackedElsewhere frees what the acknowledgements another poller received
// cover (see onAck). The owner of the send side, serving the vconn.
func (p *poller) ackedElsewhere(vc *VConn) {
	if vc.auto.takeAckRecv() {
		p.freeAcked(vc, vc.auto.load())
	}
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

// dropUnacked frees the datagrams of a vconn that will send no more. Only
// the owner of the send side.
func (p *poller) dropUnacked(vc *VConn) {
	if r := vc.auto.loaded(); r != nil {
		r.tx.Drop(p.freeDatagram)
	}
}

// sendReliable posts an Auto datagram, with its UC QP pair's secret, and
// keeps it until it is acknowledged (its resends carry the same secret:
// the vconn's QPs never change). Only the owner of the send side.
func (p *poller) sendReliable(vc *VConn, remote vqpn.ID, u reliable.Datagram) {
	format.Raw(p.e.pool.bytes(bufSlot(u.Buf))).SetAuth(vc.dq.secret)
	p.e.pool.share(bufSlot(u.Buf), 2) // the unacknowledged list and the post
	wr := p.bundleWR(vc, remote, &u, false)
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
	if vc.auto.watch() {
		p.rel.rtx = append(p.rel.rtx, vc)
	}
}

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
		if b.Type() != format.Data || !b.Whole() || !vc.autoDgram(n) || gather && e.pool.lentOf(slot) != nil {
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
			off += p.copyEntry(b[off:], slot, n)
			p.free(slot, false)
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
// Its tag is shared (the unacknowledged list holds the buffer too), and a
// resend's is not counted sent: its first post was.
func (p *poller) bundleWR(vc *VConn, remote vqpn.ID, u *reliable.Datagram, resend bool) verbs.SendWR {
	slot := bufSlot(u.Buf)
	clear := format.Tag(0)
	if resend {
		clear = format.TagSent
	}
	if !u.Gather {
		return p.sendWR(vc, remote, slot, u.Len, format.TagShared, clear)
	}
	e := p.e
	b := e.pool.bytes(slot)
	k := int(format.Raw(b).Count())
	wr := verbs.SendWR{
		WRID:    ((format.TagOf(u.Buf)|format.TagSent|format.TagGather)&^clear | format.TagShared).WRID(vc.id),
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
