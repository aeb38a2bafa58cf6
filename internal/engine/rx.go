package engine

import (
	"errors"
	"net/netip"

	"github.com/rdmavisor/rdmavisor/internal/engine/format"
	"github.com/rdmavisor/rdmavisor/internal/transport"
	"github.com/rdmavisor/rdmavisor/internal/verbs"
	"github.com/rdmavisor/rdmavisor/internal/vqpn"
)

// The receive path: every function here runs on the poller that polled
// the receive (any poller may receive for any vconn).

// onRecv handles a receive; vc is the vconn its imm_data named, looked up
// by completeAll (nil: none, or a stale generation).
func (p *poller) onRecv(wc *verbs.WC, vc *VConn) {
	e := p.e
	slot := recvSlot(wc.WRID)
	if !e.pool.valid(slot) {
		return
	}
	if wc.Status != verbs.WCSuccess || wc.Flags&verbs.WCWithImm == 0 {
		if wc.Status != verbs.WCWRFlushErr {
			e.stats.malformed.Add(1)
		}
		p.rx.reposts = append(p.rx.reposts, slot)
		return
	}
	if vc == nil {
		// Closed (stale generation) or never opened: counted by the
		// table's lookup, dropped.
		p.rx.reposts = append(p.rx.reposts, slot)
		return
	}
	b, ud, secret, ok := p.admit(wc, vc, slot)
	if !ok {
		p.reject(RejectPeer)
		p.rx.reposts = append(p.rx.reposts, slot)
		return
	}
	if !format.Authentic(b, secret) {
		// Not from the peer's engine, though from its address (a UC
		// responder takes a message's first packet whatever its PSN):
		// nothing of it is read.
		p.reject(RejectForged)
		p.rx.reposts = append(p.rx.reposts, slot)
		return
	}
	var h format.Header
	if err := h.Parse(b); err != nil {
		e.stats.malformed.Add(1)
		p.rx.reposts = append(p.rx.reposts, slot)
		return
	}
	if slot.class() == e.dgramClass && !dgramAllowed(h.Type, vc.tr, ud) {
		p.reject(RejectTransport)
		p.rx.reposts = append(p.rx.reposts, slot)
		return
	}
	if !vc.grant(h.Credit) {
		p.reject(RejectGrant)
	}
	if vc.tr == transport.Auto && (h.Type == format.Data || h.Type == format.Credit || h.Type == format.Bundle) {
		p.onAck(vc, h.Ack())
		if end, ok := h.Gap(); ok {
			vc.onGap(end)
		}
	}
	p.dispatch(vc, &h, slot, b[format.HeaderLen:])
}

// admit returns the message a receive holds (past the GRH space of a
// datagram), whether it came on a QP of vc's transport (ud: a UD QP), the
// secret it must carry (that of the QP pair, or the peer's datagrams'),
// and ok, false for a message from a node or QP that vc does not hear
// from: a node naming a vconn that is not connected to it, a message on a
// QP no peer made toward us (our own send QPs receive nothing), or on one
// of the peer's QPs other than those its vconn sends on.
func (p *poller) admit(wc *verbs.WC, vc *VConn, slot bufSlot) (b []byte, ud bool, secret uint64, ok bool) {
	e := p.e
	b = e.pool.bytes(slot)[:min(wc.ByteLen, uint32(e.cfg.ChunkSize))]
	from, index, secret := p.ingressOf(wc.QPN)
	ud = p.isUD(wc.QPN)
	fromPeer := false
	if ud {
		// A datagram: the sender's GID is in the GRH space. (Only UD
		// receives have that space, whether or not a GRH came; a NIC
		// may flag RC and UC receives over RoCE with a GRH too, but
		// puts nothing in the buffer.) On InfiniBand, a datagram routed
		// within the subnet has no GRH, and its sender is its source
		// LID. Otherwise from stays zero, no peer's.
		if len(b) >= verbs.GRHSize {
			if wc.Flags&verbs.WCWithGRH != 0 {
				from = grhSource(b[:verbs.GRHSize])
			} else if e.ll == verbs.LinkLayerInfiniBand && wc.SLID != 0 {
				fromPeer = uint32(wc.SLID) == vc.peer.lid.Load()
			}
			b = b[verbs.GRHSize:]
		}
		secret = vc.peer.udSecretIn
	}
	// Until the dial's answer names the peer's vconn (Connect), the QP it
	// sends on is not known: the peer's first message can come first (it
	// sends once it accepted, and its data outruns the control plane's
	// answer). Any of the peer's QPs is taken then, its secret checked as
	// always; rejecting it lost a message the peer's RC QP had delivered.
	remote := vqpn.ID(vc.remote.Load())
	ok = (fromPeer || vc.peer.gid == from) && (ud || index >= 0 && (!remote.Valid() || index == vc.peer.ingressIndex(remote)))
	return b, ud, secret, ok
}

// dispatch hands an admitted message with header h to what its type
// needs; payload is what follows the header.
func (p *poller) dispatch(vc *VConn, h *format.Header, slot bufSlot, payload []byte) {
	switch h.Type {
	case format.Data:
		p.onData(vc, h, slot, payload)
		return
	case format.Bundle:
		p.onBundle(vc, h, slot, payload)
		return
	}
	// Control messages are read at once: their buffers go back now.
	p.rx.reposts = append(p.rx.reposts, slot)
	switch h.Type {
	case format.Fin:
		vc.onPeerFin()
	case format.Reset:
		vc.fail(ErrReset)
	case format.Export:
		if err := vc.onExport(h, payload); err != nil {
			p.e.stats.malformed.Add(1)
			vc.fail(err)
		}
	case format.Unexport:
		vc.onUnexport(h)
	case format.Unexported:
		vc.onUnexported(h.Region())
	}
}

// dgramAllowed reports whether a message of type t may arrive as a
// datagram (on a UD QP if ud, else a UC one) for a vconn of transport tr:
// only data, on the QPs its transport sends data on. Control messages
// (FIN, RESET, grants, exports) always travel over RC, whose source is
// the connected QP; an RC vconn's data too, and it takes receive credits,
// which a datagram would bypass.
func dgramAllowed(t format.Type, tr transport.Kind, ud bool) bool {
	switch t {
	case format.Data:
		if ud {
			return tr == transport.UD
		}
		return tr == transport.UC || tr == transport.Auto
	case format.Bundle:
		return !ud && tr == transport.Auto
	}
	return false
}

// grhSource returns the sender's GID from the GRH space of a UD receive.
// RoCE v2 over IPv4 puts no GRH there: the kernel (rxe, and mlx5 alike)
// writes 20 bytes of zeros and then the packet's IPv4 header, whose source
// address is the sender's IPv4-mapped GID. IB and RoCE over IPv6 write a
// GRH (IP version 6) with the source GID at bytes 8-23.
func grhSource(grh []byte) (g verbs.GID) {
	if grh[0]>>4 != 6 && grh[20]>>4 == 4 {
		return verbs.GIDFromAddr(netip.AddrFrom4([4]byte(grh[32:36])))
	}
	copy(g[:], grh[8:24])
	return g
}

// isUD reports whether qpn is one of the poller's UD QPs, the live one or
// one failed and draining.
func (p *poller) isUD(qpn uint32) bool {
	if p.udq.qp != nil && p.udq.qpn == qpn {
		return true
	}
	for _, q := range p.udq.dead {
		if q.qp.QPN() == qpn {
			return true
		}
	}
	return false
}

// ingressOf returns the GID of the peer whose QP qpn received a message,
// the QP's index in the peer's pool (-1: no peer made it) and the QP
// pair's secret (0: none).
func (p *poller) ingressOf(qpn uint32) (g verbs.GID, index int, secret uint64) {
	if v, ok := p.e.ingress.Load(qpn); ok {
		in := v.(*ingressQP)
		return in.peer.gid, in.index, in.secret
	}
	return g, -1, 0
}

// onData delivers a whole message or adds a chunk to the one being
// reassembled.
func (p *poller) onData(vc *VConn, h *format.Header, slot bufSlot, payload []byte) {
	e := p.e
	first, last := h.First(), h.Last()
	imm, hasImm := h.AppImm()
	m := Message{vc: vc, Imm: imm, HasImm: hasImm, slot: noSlot, credits: 1}
	if slot.class() == e.dgramClass {
		// Unreliable transports: whole messages only, no credits.
		if !first || !last || uint32(len(payload)) != h.Length {
			e.stats.malformed.Add(1)
			p.rx.reposts = append(p.rx.reposts, slot)
			return
		}
		m.Data, m.slot, m.credits = payload, slot, 0
		if vc.tr == transport.Auto {
			m.credits = 1
			vc.deliverSeq(p, h.Seq, m, true)
			return
		}
		vc.deliver(p, m)
		return
	}
	// Reliable data: every chunk took a receive credit.
	if !vc.takeCredit() {
		p.overrun(vc)
		p.rx.reposts = append(p.rx.reposts, slot)
		return
	}
	if first && last {
		if uint32(len(payload)) != h.Length {
			p.malformed(vc, slot)
			return
		}
		m.Data, m.slot = payload, slot
		p.deliver(vc, h, m)
		return
	}
	if first && !vc.asm.start(h.Length, uint32(e.cfg.MaxMessage)) || !vc.asm.add(payload) {
		p.malformed(vc, slot)
		return
	}
	p.rx.reposts = append(p.rx.reposts, slot)
	if !last {
		vc.returnCredits(1) // the chunk is copied out: its buffer is free
		return
	}
	if m.Data = vc.asm.finish(); m.Data == nil {
		p.malformed(vc, noSlot)
		return
	}
	p.deliver(vc, h, m)
}

func (p *poller) deliver(vc *VConn, h *format.Header, m Message) {
	if vc.tr == transport.Auto {
		vc.deliverSeq(p, h.Seq, m, false)
		return
	}
	vc.deliver(p, m)
}

// malformed drops a message that breaks the framing: the peer engine is
// broken, so the vconn fails rather than deliver garbage.
func (p *poller) malformed(vc *VConn, slot bufSlot) {
	p.e.stats.malformed.Add(1)
	if slot != noSlot {
		p.rx.reposts = append(p.rx.reposts, slot)
	}
	vc.returnCredits(1)
	vc.fail(errors.New("engine: malformed message from peer"))
}

// The credit window itself is package credit's; here the engine wires it
// to the vconn: which budget it grows from, who is rescheduled when a
// grant comes or falls due, and where grants are stamped.

// takeCredit counts a message that took one of the receive credits this
// vconn granted, and reports whether the peer had one (credit.Taken).
// Receiving, the vconn holds at most its window of messages, MaxCredits.
// Any poller that receives the peer's messages.
func (vc *VConn) takeCredit() bool { return vc.taken.Take(&vc.window) }

// overrun fails a vconn whose peer sent beyond its credits; the caller
// drops the message.
func (p *poller) overrun(vc *VConn) {
	p.reject(RejectCredit)
	vc.fail(ErrCreditOverrun)
}

// completeAll dispatches the n completions polled into p.rx.wcs. The vconns
// receives name are looked up (and their hot lines read) in a first pass,
// for the reason touch gives. A vconn found here and released before its
// message is handled is the old owner still, never a new one: the message
// is dropped as on any closed vconn. The poller only.
func (p *poller) completeAll(n int) {
	for i := range p.rx.wcs[:n] {
		wc := &p.rx.wcs[i]
		p.rx.vcs[i] = nil
		if wc.Opcode&verbs.WCRecv != 0 && wc.Status == verbs.WCSuccess && wc.Flags&verbs.WCWithImm != 0 {
			if vc, ok := p.e.vconns.Lookup(vqpn.FromImm(wc.ImmData)); ok {
				p.rx.vcs[i] = vc
			}
		}
	}
	var x uint32
	for _, vc := range p.rx.vcs[:n] {
		if vc != nil {
			x += vc.hotLines()
		}
	}
	p.rx.sink += x
	for i := range p.rx.wcs[:n] {
		wc := &p.rx.wcs[i]
		if wc.Opcode&verbs.WCRecv != 0 {
			p.onRecv(wc, p.rx.vcs[i])
			p.rx.vcs[i] = nil
			continue
		}
		p.onSend(wc)
	}
}

// onSend handles a send completion: the buffer back, the message counted,
// a FIN's or a one-sided operation's waiter told. The poller only.
func (p *poller) onSend(wc *verbs.WC) {
	e := p.e
	if wc.WRID>>32 == 0 {
		// No vconn's: a memory-window bind, posted on an ingress QP
		// outside the poller's accounting.
		e.windowDone(wc)
		return
	}
	p.tx.budget++
	v, _ := p.sendQPs.Load(wc.QPN)
	q, _ := v.(*sendQP)
	if q != nil {
		q.outstanding--
	}
	id, tag := format.SplitWRID(wc.WRID)
	slot := bufSlot(tag.Slot())
	if slot == stagedSlot {
		// A one-sided operation on staging memory: no buffer.
		if vc, ok := e.vconns.Lookup(id); ok {
			vc.opCompleted(wc, slot)
		}
		if wc.Status != verbs.WCSuccess && q != nil {
			p.qpFailed(q, wc.Err())
		}
		return
	}
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
	if tag.Has(format.TagSent) {
		e.stats.msgsSent.Add(1)
	}
	if tag.Has(format.TagFin) {
		if vc, ok := e.vconns.Lookup(id); ok {
			vc.onFinSent()
		}
	}
}

// flushReposts gives the round's released receive buffers back to their
// SRQs, a PostRecv per SRQ.
func (p *poller) flushReposts() {
	if len(p.rx.reposts) == 0 {
		return
	}
	e := p.e
	for _, c := range e.srqs() {
		wrs := p.rx.recvWRs[:0]
		for _, slot := range p.rx.reposts {
			if slot.class() == c.class {
				wrs = append(wrs, e.recvWR(slot))
			}
		}
		p.rx.recvWRs = wrs
		if len(wrs) == 0 {
			continue
		}
		if _, err := c.srq.PostRecv(wrs); err != nil {
			e.log.Error(err, "Reposting receive buffers failed", "buffers", len(wrs))
		}
	}
	p.rx.reposts = p.rx.reposts[:0]
}
