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
	if first {
		if vc.asm != nil || h.Length > uint32(e.cfg.MaxMessage) {
			p.malformed(vc, slot)
			return
		}
		// Reassembly copies into a buffer of its own so the chunks'
		// receive buffers (and credits) come back at once.
		vc.asm, vc.asmOff = make([]byte, h.Length), 0
	}
	if vc.asm == nil || vc.asmOff+uint32(len(payload)) > uint32(len(vc.asm)) {
		p.malformed(vc, slot)
		return
	}
	copy(vc.asm[vc.asmOff:], payload)
	vc.asmOff += uint32(len(payload))
	p.rx.reposts = append(p.rx.reposts, slot)
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
