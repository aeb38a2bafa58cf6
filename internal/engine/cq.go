package engine

import (
	"errors"
	"fmt"
	"net/netip"

	"github.com/rdmavisor/rdmavisor/internal/engine/format"
	"github.com/rdmavisor/rdmavisor/internal/transport"
	"github.com/rdmavisor/rdmavisor/internal/verbs"
	"github.com/rdmavisor/rdmavisor/internal/vqpn"
)

// A poller's work with its CQ and its QPs, round by round (poller.go's
// round): which vconns each QP's run queue serves next (queue, serveQP;
// serving one is serve.go's), one doorbell per QP for what they posted
// (flushSends), then the completions polled: receives authenticated and
// demultiplexed to their vconns (onRecv; delivering them is recv.go's),
// sends completed (onSend), and the receive buffers given back to the
// SRQs (flushReposts). The poller's goroutine only.

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
	if wc.Status != verbs.WCSuccess {
		if q != nil {
			p.qpFailed(q, wc.Err())
			if r := q.repair; r != nil {
				// The QP is being replaced: the send goes again on the
				// new one (repair.go), its buffer kept until then.
				r.flushed = append(r.flushed, wc.WRID)
				return
			}
		}
		p.sent(tag)
		return
	}
	p.sent(tag)
	if q != nil {
		q.progress = true
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

// queue appends vc to its QP's run queue. The poller only.
func (p *poller) queue(vc *VConn) {
	q := vc.sq
	if !q.active {
		q.active = true
		p.sched.active = append(p.sched.active, q)
	}
	q.runq = append(q.runq, vc)
}

// serveQP serves q's run queue in order until a vconn cannot go on for
// lack of room (it went on p.sched.later, and so to the queue's tail next
// round). The poller only.
func (p *poller) serveQP(q *sendQP) {
	if q.outstanding+len(q.batch) >= p.e.cfg.SQDepth || p.tx.budget <= 0 || q.repair != nil {
		return // no room, or no QP (repair.go): the queue waits
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
		n := len(p.sched.later)
		p.serve(vc)
		if len(p.sched.later) > n {
			break
		}
	}
	q.dequeued(p.sched.popped)
	p.sched.popped = 0
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

// touchAhead is how many vconns the poller touches at once before
// serving them.
const touchAhead = 16

// touch reads the hot cache lines of vconns about to be served. With many
// vconns each is touched about once per message, long after the last time,
// so it is rarely in cache; loads that do not depend on each other let the
// CPU wait for those misses together instead of one after another. The
// poller only; it only reads.
func (p *poller) touch(vcs []*VConn) {
	var x uint32
	for _, vc := range vcs {
		x += vc.hotLines()
	}
	// Then the line of each one's sender's queue and the oldest queued
	// buffer, which its sender just wrote.
	pool := p.e.pool
	for _, vc := range vcs {
		if ent, ok := vc.snd.peek(); ok && ent.slot() != opMarker {
			x += uint32(format.Raw(pool.bytes(ent.slot())).Type())
		}
	}
	p.rx.sink += x
}

// flushSends rings each dirty QP's doorbell once for its whole batch; it
// reports whether it posted anything.
func (p *poller) flushSends() bool {
	e := p.e
	posted := false
	for i, q := range p.tx.dirty {
		p.tx.dirty[i] = nil
		q.queued = false
		if len(q.batch) == 0 {
			continue
		}
		if r := q.repair; r != nil {
			// Nothing more goes on a failed QP: the batch waits for
			// its replacement (repair.go), after what the old one
			// flushes.
			for _, wr := range q.batch {
				r.unposted = append(r.unposted, wr.WRID)
				p.tx.budget++
			}
			clear(q.batch)
			q.batch = q.batch[:0]
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
			p.tx.dirty[i] = q
			continue
		}
		if err != nil {
			// The QP refused the rest (it failed): they wait for its
			// replacement, or their buffers go back and their vconns
			// fail.
			p.qpFailed(q, err)
			for _, wr := range q.batch[n:] {
				p.tx.budget++
				if r := q.repair; r != nil {
					r.unposted = append(r.unposted, wr.WRID)
					continue
				}
				id, tag := format.SplitWRID(wr.WRID)
				p.sent(tag)
				if vc, ok := e.vconns.Lookup(id); ok {
					vc.fail(fmt.Errorf("%w: %w", ErrQPFailed, err))
				}
			}
		}
		clear(q.batch)
		q.batch = q.batch[:0]
	}
	k := 0
	for _, q := range p.tx.dirty {
		if q != nil {
			p.tx.dirty[k] = q
			k++
		}
	}
	p.tx.dirty = p.tx.dirty[:k]
	return posted
}
