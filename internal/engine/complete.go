package engine

import (
	"fmt"

	"github.com/rdmavisor/rdmavisor/internal/engine/format"
	"github.com/rdmavisor/rdmavisor/internal/verbs"
	"github.com/rdmavisor/rdmavisor/internal/vqpn"
)

// udFailed replaces a UD QP that went to ERR (datagrams in flight are
// lost, as datagrams may be); the dead one is destroyed once drained.
func (p *poller) udFailed(q *sendQP, err error) {
	if q == p.udq.qp {
		p.e.log.Info("UD QP failed; replacing it", "qpn", q.qp.QPN(), "err", err)
		p.udq.dead = append(p.udq.dead, q)
		if err := p.openUD(); err != nil {
			p.e.log.Error(err, "Replacing the UD QP failed")
		}
	}
	for i, x := range p.udq.dead {
		if x == q && q.outstanding <= 0 {
			p.sendQPs.Delete(q.qp.QPN())
			_ = q.qp.Close()
			p.udq.dead = append(p.udq.dead[:i], p.udq.dead[i+1:]...)
			break
		}
	}
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
			x += vc.state.Load() + vc.remote.Load() // the two hot lines
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
	e.pool.put(slot)
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

// qpFailed fails the vconns of a QP that went to ERR and takes the QP out
// of its peer's pool, so new vconns get a fresh one. The dead QP is
// destroyed once its flushed completions are in.
func (p *poller) qpFailed(q *sendQP, err error) {
	if q.peer == nil {
		p.udFailed(q, err)
		return
	}
	peer := q.peer
	peer.mu.Lock()
	first := !q.failed
	q.failed = true
	for _, t := range [][]*sendQP{peer.qps, peer.ucs} {
		for i, x := range t {
			if x == q {
				t[i] = nil
				peer.dead = append(peer.dead, q)
			}
		}
	}
	peer.mu.Unlock()
	if first {
		p.e.log.Info("Shared QP failed", "peer", peer.gid, "qpn", q.qp.QPN(), "err", err)
		peer.failWhere(func(vc *VConn) bool { return vc.sq == q }, fmt.Errorf("%w: %w", ErrQPFailed, err))
	}
	if q.outstanding <= 0 {
		p.sendQPs.Delete(q.qp.QPN())
		peer.mu.Lock()
		for i, x := range peer.dead {
			if x == q {
				peer.dead = append(peer.dead[:i], peer.dead[i+1:]...)
				_ = q.qp.Close()
				break
			}
		}
		peer.mu.Unlock()
	}
}
