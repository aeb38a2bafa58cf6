package engine

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"time"

	"github.com/rdmavisor/rdmavisor/internal/engine/format"
	"github.com/rdmavisor/rdmavisor/internal/transport"
	"github.com/rdmavisor/rdmavisor/internal/verbs"
	"github.com/rdmavisor/rdmavisor/internal/vqpn"
)

// Replacing a shared RC QP that failed while its peer is alive. A QP goes
// to its error state on a request that breaks the transport's rules, the
// peer's or a forger's: one request at the PSN the responder expects with
// a key that is not valid does it (IBA class C responder error, which
// rxe and NICs apply, and so does the soft provider). Failing every vconn
// on the QP let one forged packet end many tenants' connections. Instead,
// the QP's poller has the peer connect a new QP for the same index of its
// pools (dial, as for the first) and the vconns carry on over it: the
// sendQP stays, with its vconns, queues and backlog; only the device's QP
// under it changes. The work requests the old QP did not complete
// successfully (flushed, or refused at the post) are posted again on the
// new one in the order they were first posted; the peer drops the chunks
// its old QP had delivered (their acknowledgements were lost with the
// QP) by their numbers (format.Header.ChunkNo, recv.go's inOrder). Each
// chunk took one credit on each side, at its first post and its first
// arrival, so the credits stay as they were; a grant follows the resent
// messages, for the grants the old QP lost.
//
// Every vconn without one-sided state is carried. An RC vconn's data
// chunks are numbered by its credits; an Auto vconn's chunks on RC by a
// count of their own in the header's bytes 2..3 (format.Header.AutoChunkNo:
// its credits count its datagrams too, which may be lost), toward an
// engine that says it takes them (QPReply.ResendsAuto; toward one that
// does not, its Auto vconns fail). Its datagrams and their sequence go
// on its UC QP, which the forged request did not touch. UC and UD
// vconns send only control on the RC QP: a resent grant or FIN is
// harmless (grants are cumulative, a second FIN ends nothing more).
// Vconns with regions (type 2 windows, bound to the old QP pair) fail as
// before. A QP fails
// its vconns too when its peer is gone (the peer failed, or the new QP
// cannot connect), when no send had completed on it (the path failed,
// not the QP: a replacement would time out again) and when it was
// replaced maxReplacements times within replaceWindow.

const (
	maxReplacements = 4
	replaceWindow   = time.Minute
	// redialTimeout bounds the control-plane call for the new QP.
	redialTimeout = 10 * time.Second
)

// qpRepair is a replacement under way.
type qpRepair struct {
	cause error  // why the old QP failed
	old   uint32 // its QPN
	// flushed are the wr_ids of the sends the old QP completed in error,
	// in completion order (RC's: the order posted); unposted those not
	// posted to it, which all come after. Poller-owned.
	flushed  []uint64
	unposted []uint64
	// Written by the goroutine that dials, before ready.
	secret uint64
	err    error
	ready  atomic.Bool
}

// carried reports whether the vconn's state moves to a replacement QP:
// all but its one-sided state, and an Auto vconn's only toward an engine
// that drops the resends of its RC chunks (it numbers them only then).
func (vc *VConn) carried() bool {
	return vc.regions.Load() == nil && (vc.tr != transport.Auto || vc.peer.dedupsAuto.Load())
}

// qpFailed handles a QP that went to ERR: it starts its replacement, or
// fails its vconns and takes it out of its peer's pool, so new vconns get
// a fresh one; a dead QP is destroyed once its flushed completions are
// in. The QP's poller, once per completion in error.
func (p *poller) qpFailed(q *sendQP, err error) {
	if q.peer == nil {
		p.udFailed(q, err)
		return
	}
	if q.repair != nil {
		return // being replaced: its sends wait for the new QP (onSend)
	}
	peer := q.peer
	now := time.Now()
	peer.mu.Lock()
	first := !q.failed
	q.failed = true
	why := ""
	if first {
		why = q.whyNotReplaced(now)
		if peer.err != nil || peer.table(q.typ)[q.index] != q {
			why = "its peer failed"
		}
	}
	if !first || why != "" {
		peer.unpool(q)
	}
	peer.mu.Unlock()
	if first && why == "" {
		p.replace(q, err, now)
		return
	}
	if first {
		p.e.log.Info("Shared QP failed", "peer", peer.gid, "qpn", q.qp.QPN(), "err", err, "notReplaced", why)
		peer.failWhere(func(vc *VConn) bool { return vc.sq == q }, fmt.Errorf("%w: %w (not replaced: %s)", ErrQPFailed, err, why))
	}
	p.reap(q)
}

// whyNotReplaced says why a failed QP is not replaced, or "" if it is.
func (q *sendQP) whyNotReplaced(now time.Time) string {
	switch {
	case q.typ != verbs.QPTypeRC:
		return "a UC QP"
	case !q.peer.dedups.Load():
		return "its peer's engine does not drop resent chunks (an older version)"
	case !q.progress:
		return "no send had completed on it"
	case q.replaced >= maxReplacements && now.Sub(q.since) < replaceWindow:
		return fmt.Sprintf("replaced %d times in %v", q.replaced, replaceWindow)
	}
	return ""
}

// unpool takes a failed QP out of its peer's pools, to be destroyed once
// drained (reap); p.mu held.
func (p *Peer) unpool(q *sendQP) {
	for _, t := range [][]*sendQP{p.qps, p.ucs} {
		for i, x := range t {
			if x == q {
				t[i] = nil
				p.dead = append(p.dead, q)
			}
		}
	}
}

// reap destroys a QP out of its pool once its last completion is in.
func (p *poller) reap(q *sendQP) {
	if q.outstanding > 0 {
		return
	}
	p.sendQPs.Delete(q.qp.QPN())
	peer := q.peer
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

// replace starts q's replacement: the vconns that cannot move fail, the
// rest wait (serveQP skips q) while a goroutine dials the new QP.
func (p *poller) replace(q *sendQP, cause error, now time.Time) {
	peer := q.peer
	if now.Sub(q.since) >= replaceWindow {
		q.since, q.replaced = now, 0
	}
	q.replaced++
	r := &qpRepair{cause: cause, old: q.qp.QPN()}
	q.repair = r
	p.sched.repairs = append(p.sched.repairs, q)
	peer.failWhere(func(vc *VConn) bool { return vc.sq == q && !vc.carried() },
		fmt.Errorf("%w: %w (its vconn's state does not move to a new QP)", ErrQPFailed, cause))
	p.e.log.Info("Shared QP failed; replacing it", "peer", peer.gid, "qpn", r.old, "index", q.index, "replacements", q.replaced, "err", cause)
	peer.mu.Lock()
	link := peer.ctl
	peer.mu.Unlock()
	p.e.redials.Add(1) // Close waits for it after the pollers stop: no Add after
	go peer.redial(q, r, link)
}

// redial connects q's replacement and hands it to q's poller (q.next, r).
func (p *Peer) redial(q *sendQP, r *qpRepair, link PeerLink) {
	defer p.e.redials.Done()
	ctx, cancel := context.WithTimeout(context.Background(), redialTimeout)
	defer cancel()
	qp, reply, err := p.dial(ctx, q.typ, q.index, q.p, link)
	if err == nil {
		p.mu.Lock()
		if err = p.err; err == nil {
			q.next = qp // destroy closes it if the poller never takes it
			p.adopt(&reply)
		}
		p.mu.Unlock()
		if err != nil {
			_ = qp.Close()
		}
	}
	r.secret, r.err = reply.Secret, err
	r.ready.Store(true)
	q.p.nudge()
}

// nudge has the poller run a round, from any goroutine.
func (p *poller) nudge() {
	p.inbox.mu.Lock()
	p.inbox.queued.Store(true)
	p.inbox.mu.Unlock()
	p.kick()
}

// finishRepairs puts in place the replacements that are connected, once
// their old QPs have completed everything (in error). The poller, at the
// start of a round.
func (p *poller) finishRepairs() {
	k := 0
	for _, q := range p.sched.repairs {
		if r := q.repair; !r.ready.Load() || q.outstanding > 0 {
			p.sched.repairs[k] = q
			k++
			continue
		}
		p.finishRepair(q)
	}
	clear(p.sched.repairs[k:])
	p.sched.repairs = p.sched.repairs[:k]
}

func (p *poller) finishRepair(q *sendQP) {
	r, peer := q.repair, q.peer
	q.repair = nil
	err := r.err
	peer.mu.Lock()
	next, old := q.next, q.qp
	q.next = nil
	if err == nil && (peer.err != nil || peer.table(q.typ)[q.index] != q) {
		err = fmt.Errorf("%w: its peer failed", ErrPeerGone)
	}
	if err == nil {
		q.qp, q.secret, q.failed = next, r.secret, false
	} else {
		peer.unpool(q)
	}
	peer.mu.Unlock()
	if err != nil {
		if next != nil {
			_ = next.Close()
		}
		p.e.log.Info("Replacing a shared QP failed", "peer", peer.gid, "qpn", r.old, "err", err)
		for _, list := range [2][]uint64{r.flushed, r.unposted} {
			for _, wrid := range list {
				_, tag := format.SplitWRID(wrid)
				p.sent(tag)
			}
		}
		peer.failWhere(func(vc *VConn) bool { return vc.sq == q }, fmt.Errorf("%w: %w (replacing it failed: %w)", ErrQPFailed, r.cause, err))
		p.reap(q)
		return
	}
	p.sendQPs.Delete(old.QPN())
	_ = old.Close()
	p.sendQPs.Store(q.qp.QPN(), q)
	q.progress = false
	p.e.stats.qpsReplaced.Add(1)
	n := p.resend(q, r)
	p.e.log.Info("Shared QP replaced", "peer", peer.gid, "qpn", r.old, "newQPN", q.qp.QPN(), "index", q.index, "resent", n)
	var moved []*VConn
	peer.mu.Lock()
	for vc := peer.list; vc != nil; vc = vc.next {
		if vc.sq == q {
			moved = append(moved, vc)
		}
	}
	peer.mu.Unlock()
	for _, vc := range moved {
		// A grant after what is resent: the old QP may have lost one.
		vc.creditDue.Store(true)
		vc.schedule()
	}
}

// resend posts on q, now on its new QP, the sends its old one did not
// complete, in order; the rest (a failed or released vconn's) are freed.
// It returns how many it posted.
func (p *poller) resend(q *sendQP, r *qpRepair) int {
	e, n := p.e, 0
	for _, list := range [2][]uint64{r.flushed, r.unposted} {
		for _, wrid := range list {
			id, tag := format.SplitWRID(wrid)
			slot := bufSlot(tag.Slot())
			vc, ok := e.vconns.Lookup(id)
			if ok && vc.sq == q && !vc.carried() {
				// It took one-sided state while the QP was replaced
				// (replace failed the others): what it sent is lost.
				vc.fail(fmt.Errorf("%w: %w (its vconn's state does not move to a new QP)", ErrQPFailed, r.cause))
			}
			if !ok || vc.sq != q || !vc.carried() || vc.state.Load() == stateFailed || !e.pool.valid(slot) {
				p.sent(tag)
				continue
			}
			if b := format.Raw(e.pool.bytes(slot)); b.Type() == format.Data {
				b.SetResent() // the peer may have it: its ack was lost with the old QP
			}
			p.post(q, vc, vqpn.ID(vc.remote.Load()), slot, p.sentLen(slot))
			n++
		}
	}
	return n
}

// sentLen is the length of the SEND of buffer slot, header included, as
// send.go's queueChunk made it: the message's whole length for a single
// chunk, a full chunk for all but the last. (A staged chunk's payload is
// in place: sendWR takes its length from the buffer's lentRef.)
func (p *poller) sentLen(slot bufSlot) uint32 {
	b := format.Raw(p.e.pool.bytes(slot))
	if b.Type() != format.Data || p.e.pool.lentOf(slot) != nil {
		return format.HeaderLen
	}
	per, size := uint32(p.e.cfg.ChunkSize-format.HeaderLen), b.Length()
	switch {
	case b.First() && b.Last():
		return format.HeaderLen + size
	case !b.Last():
		return format.HeaderLen + per
	}
	chunks := max(1, (size+per-1)/per)
	return format.HeaderLen + size - (chunks-1)*per
}

// inOrder checks an RC vconn's data chunk by its number against the
// count of its chunks received (each took a credit). A chunk that came
// already, marked resent, is one the peer sent again on the QP that
// replaced a failed one, whose acknowledgement was lost with the old QP
// (repair.go): it is dropped, and takes no credit (its first coming took
// it). Any other number is a chunk lost, or one repeated unmarked,
// neither of which RC does: the peer is broken (or an engine that
// numbers no chunks), and the vconn fails rather than deliver a message
// twice or with a hole in it.
//
// An Auto vconn's chunks on RC are numbered apart from its datagrams,
// mod 2^16 (format.Header.AutoChunkNo), and counted here, as its credits
// count its datagrams too.
func (p *poller) inOrder(vc *VConn, h *format.Header, slot bufSlot) bool {
	var d int32
	var no, want uint32
	switch {
	case vc.tr == transport.RC && vc.peer.numbers.Load():
		no, want = h.ChunkNo(), vc.taken.Load()
		d = int32(no - want)
	case vc.tr == transport.Auto && vc.peer.numbersAuto.Load():
		var w uint16
		d, w = vc.auto.rcChunk(h.AutoChunkNo())
		no, want = uint32(h.AutoChunkNo()), uint32(w)
	}
	if d == 0 {
		return true // in order, or from an older engine, which numbers nothing
	}
	p.rx.reposts = append(p.rx.reposts, slot)
	if d < 0 && h.Resent() {
		p.e.stats.resentDropped.Add(1)
		return false
	}
	p.e.stats.malformed.Add(1)
	vc.fail(fmt.Errorf("engine: chunk %d from the peer, %d expected: %w", no, want, errChunkOrder))
	return false
}

// errChunkOrder: an RC vconn's chunk came out of its order.
var errChunkOrder = errors.New("engine: a chunk from the peer out of order (a peer engine that does not number its chunks?)")
