package engine

import (
	"errors"
	"fmt"

	"github.com/rdmavisor/rdmavisor/internal/engine/format"
	"github.com/rdmavisor/rdmavisor/internal/verbs"
	"github.com/rdmavisor/rdmavisor/internal/vqpn"
)

// sendWR is the SEND_WITH_IMM of n bytes of buffer slot for vc: wr_id
// names the vconn and the buffer its completion frees, imm_data the
// peer's vconn. The poller only, as all of this file.
func (p *poller) sendWR(vc *VConn, remote vqpn.ID, slot bufSlot, n uint32) verbs.SendWR {
	tag := format.TagOf(uint32(slot))
	switch b := format.Raw(p.e.pool.bytes(slot)); b.Type() {
	case format.Data, format.Bundle:
		if b.Last() {
			tag |= format.TagSent
		}
	case format.Fin:
		tag |= format.TagFin
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

// post adds the SEND of n bytes of slot to q's batch, with the QP pair's
// secret.
func (p *poller) post(q *sendQP, vc *VConn, remote vqpn.ID, slot bufSlot, n uint32) {
	format.Raw(p.e.pool.bytes(slot)).SetAuth(q.secret)
	p.postWR(q, p.sendWR(vc, remote, slot, n))
}

// postUD posts a datagram to the peer's UD QP that pairs with this poller,
// with the secret the peer gave our datagrams.
func (p *poller) postUD(vc *VConn, remote vqpn.ID, slot bufSlot, n uint32) {
	wr := p.sendWR(vc, remote, slot, n)
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
			// The QP refused the rest (it failed): their buffers go back,
			// their vconns fail.
			for _, wr := range q.batch[n:] {
				id, tag := format.SplitWRID(wr.WRID)
				p.sent(tag)
				p.tx.budget++
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
	for _, q := range p.tx.dirty {
		if q != nil {
			p.tx.dirty[k] = q
			k++
		}
	}
	p.tx.dirty = p.tx.dirty[:k]
	return posted
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
