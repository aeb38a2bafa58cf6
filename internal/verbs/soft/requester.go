package soft

import (
	"time"

	"github.com/rdmavisor/rdmavisor/internal/verbs"
	"github.com/rdmavisor/rdmavisor/internal/verbs/soft/roce"
)

// swqe is a send work queue entry.
type swqe struct {
	wr       verbs.SendWR
	length   uint32
	firstPSN uint32 // PSN of its first packet (for a read, of its request)
	npsn     uint32 // PSNs it consumes: packets, or a read's response packets
	readDone uint32 // bytes of a read's response received so far
	signaled bool
	inl      []byte // inline data copied at post time, or nil
	done     bool   // a bind or invalidate that executed (go-back-N passes it again)
}

// requester is the send side of a QP. WQE indices grow without bound; the
// slot is index mod len(sq). head ≤ cur ≤ tail: [head, cur) are transmitted
// and await completion, [cur, tail) are still to send.
type requester struct {
	sq        []swqe
	head      uint64
	cur       uint64
	tail      uint64
	off       uint32 // bytes of sq[cur] already transmitted
	psn       uint32 // PSN of the next new packet
	unacked   uint32 // oldest PSN not yet acknowledged
	retry     uint8  // retries left before RETRY_EXC_ERR
	rnrRetry  uint8  // RNR retries left (7: forever)
	rnrWait   bool   // stopped by an RNR NAK until the timer fires
	rnrPSN    uint32
	nakPSN    uint32 // last sequence NAK acted on, so duplicates are ignored
	nakValid  bool
	armed     bool      // the QP timer is set
	deadline  time.Time // when the armed timer means to act
	ackReqCnt uint32    // packets since the last AckReq
}

// maxPktPerAck bounds how many packets go without asking for an ACK, so
// long messages are acknowledged (and their window freed) before they end:
// rxe's RXE_MAX_PKT_PER_ACK, with its rule (the packet after more than 64
// without one asks). The packet that fills the window asks as well.
const maxPktPerAck = 64

func (q *qp) wqe(i uint64) *swqe { return &q.req.sq[i%uint64(len(q.req.sq))] }

func (q *qp) npackets(length uint32) uint32 {
	if length == 0 {
		return 1
	}
	return (length + q.mtu - 1) / q.mtu
}

// pump transmits from sq[cur] while the state and window allow. Called with
// q.mu held; the caller flushes tx before unlocking.
func (q *qp) pump(tx *txq) {
	r := &q.req
	for r.cur < r.tail && q.state == verbs.QPStateRTS && !r.rnrWait {
		if q.typ == verbs.QPTypeRC && psnDiff(r.psn, r.unacked) >= int32(q.dev.cfg.MaxInflight) {
			break
		}
		w := q.wqe(r.cur)
		if isLocalOp(w.wr.Opcode) {
			// Executed when the requester reaches it, in order; it has no
			// packets, and completes once every WR before it has.
			if !w.done {
				if st := q.execLocal(&w.wr); st != verbs.WCSuccess {
					q.toErrAt(r.cur, st)
					return
				}
				w.done = true
				w.firstPSN, w.npsn = r.psn, 0
			}
			r.cur++
			q.completeLocalOps()
			continue
		}
		if w.wr.Opcode == verbs.WRRDMARead && q.readsInFlight() >= int(q.attr.MaxRdAtomic) {
			// max_rd_atomic reads await their responses: the next waits,
			// as rxe's requester waits (rd_atomic), so the responder
			// still holds each read it may be asked for again.
			break
		}
		if r.off == 0 && w.readDone == 0 {
			w.firstPSN = r.psn
			w.npsn = q.npackets(w.length)
		}
		switch {
		case q.typ == verbs.QPTypeUD:
			if !q.sendUD(tx, w) {
				return
			}
			r.cur++
			q.completeSend(w, verbs.WCSuccess)
			r.head = r.cur
		case w.wr.Opcode == verbs.WRRDMARead:
			if !q.sendReadRequest(tx, w) {
				return
			}
			r.psn = psnAdd(w.firstPSN, w.npsn)
			r.cur++
		default:
			if !q.sendSegment(tx, w) {
				return
			}
			if r.off >= w.length {
				r.off = 0
				r.cur++
				if q.typ == verbs.QPTypeUC {
					q.completeSend(w, verbs.WCSuccess)
					r.head = r.cur
				}
			}
		}
	}
	if q.typ == verbs.QPTypeRC && r.psn != r.unacked && !r.rnrWait {
		q.armRetransmit(false)
	}
}

// readsInFlight counts the READs sent and not yet answered.
func (q *qp) readsInFlight() int {
	n := 0
	for i := q.req.head; i < q.req.cur; i++ {
		if q.wqe(i).wr.Opcode == verbs.WRRDMARead {
			n++
		}
	}
	return n
}

// sendSegment transmits the packet of a send or write at r.off.
func (q *qp) sendSegment(tx *txq, w *swqe) bool {
	r := &q.req
	plen := min(q.mtu, w.length-r.off)
	first, last := r.off == 0, r.off+plen >= w.length
	psn := psnAdd(w.firstPSN, r.off/q.mtu)
	// PostSend admits only work requests the QP's transport has opcodes for.
	op, _ := roce.RequestOpcode(q.typ, w.wr.Opcode, first, last)
	h := roce.Header{
		Opcode:  op,
		SE:      last && w.wr.Flags&verbs.SendSolicited != 0,
		PKey:    0xffff,
		DestQPN: q.attr.DestQPN,
		PSN:     psn,
	}
	if q.typ == verbs.QPTypeRC {
		n := r.ackReqCnt
		r.ackReqCnt++
		if last || n > maxPktPerAck || psnDiff(psnAdd(psn, 1), r.unacked) >= int32(q.dev.cfg.MaxInflight) {
			h.AckReq = true
			r.ackReqCnt = 0
		}
	}
	if h.Opcode.HasRETH() {
		h.VA, h.RKey, h.DMALen = w.wr.RemoteAddr, w.wr.RKey, w.length
	}
	if h.Opcode.HasImm() {
		h.Imm = w.wr.ImmData
	}
	if !q.emit(tx, &h, w, r.off, plen, q.attr.AH.DGID) {
		return false
	}
	r.off += plen
	r.psn = psnAdd(psn, 1)
	return true
}

// emit builds one packet whose payload is the WR's gather list at off.
// A gather list that no longer maps to registered memory fails the WR with a
// local protection error and the QP goes to ERR, as on hardware.
func (q *qp) emit(tx *txq, h *roce.Header, w *swqe, off, plen uint32, dst verbs.GID) bool {
	p := tx.next()
	hl, err := roce.PutHeaders(p.Buf, h)
	if err != nil {
		q.toErrAt(q.req.cur, verbs.WCLocQPOpErr)
		return false
	}
	if !q.gather(p.Buf[hl:hl+int(plen)], w, off) {
		q.toErrAt(q.req.cur, verbs.WCLocProtErr)
		return false
	}
	n, err := roce.Seal(p.Buf, hl, int(plen), q.dev.self, q.dev.endpoint(dst))
	if err != nil {
		q.toErrAt(q.req.cur, verbs.WCLocQPOpErr)
		return false
	}
	p.N = n
	p.Addr = dst
	tx.commit()
	return true
}

// gather copies len(dst) bytes of the WR's data, from off.
func (q *qp) gather(dst []byte, w *swqe, off uint32) bool {
	if w.inl != nil {
		return copy(dst, w.inl[off:]) == len(dst)
	}
	wr := &w.wr
	for i := 0; i < int(wr.NumSGE) && len(dst) > 0; i++ {
		sg := &wr.SG[i]
		if off >= sg.Length {
			off -= sg.Length
			continue
		}
		m := q.dev.lookupKey(sg.LKey)
		if m == nil || m.pd != q.pd {
			return false
		}
		n := min(uint32(len(dst)), sg.Length-off)
		if !m.copyOut(dst[:n], sg.Addr+uint64(off)) {
			return false
		}
		dst = dst[n:]
		off = 0
	}
	return len(dst) == 0
}

// scatterSend copies src into the WR's scatter list at off (for read
// responses); the regions need local write access.
func (q *qp) scatterSend(wr *verbs.SendWR, off uint32, src []byte) bool {
	return scatter(q, wr.SG[:min(int(wr.NumSGE), verbs.MaxSGE)], off, src)
}

func scatter(q *qp, sgl []verbs.SGE, off uint32, src []byte) bool {
	for i := range sgl {
		if len(src) == 0 {
			break
		}
		sg := &sgl[i]
		if off >= sg.Length {
			off -= sg.Length
			continue
		}
		m := q.dev.lookupKey(sg.LKey)
		if m == nil || m.pd != q.pd || m.access&verbs.AccessLocalWrite == 0 {
			return false
		}
		n := min(uint32(len(src)), sg.Length-off)
		if !m.copyIn(sg.Addr+uint64(off), src[:n]) {
			return false
		}
		src = src[n:]
		off = 0
	}
	return len(src) == 0
}

func (q *qp) sendReadRequest(tx *txq, w *swqe) bool {
	done := w.readDone
	h := roce.Header{
		Opcode:  roce.RCReadRequest,
		PKey:    0xffff,
		DestQPN: q.attr.DestQPN,
		PSN:     psnAdd(w.firstPSN, done/q.mtu),
		AckReq:  true,
		VA:      w.wr.RemoteAddr + uint64(done),
		RKey:    w.wr.RKey,
		DMALen:  w.length - done,
	}
	return q.emit(tx, &h, w, 0, 0, q.attr.AH.DGID)
}

func (q *qp) sendUD(tx *txq, w *swqe) bool {
	a := q.dev.lookupAH(w.wr.AH)
	if a == nil || a.pd != q.pd {
		// A bad address handle is a local QP operation error.
		q.toErrAt(q.req.cur, verbs.WCLocQPOpErr)
		return false
	}
	op, _ := roce.RequestOpcode(verbs.QPTypeUD, w.wr.Opcode, true, true) // a SEND: PostSend checked
	h := roce.Header{
		Opcode:  op,
		SE:      w.wr.Flags&verbs.SendSolicited != 0,
		PKey:    0xffff,
		DestQPN: w.wr.RemoteQPN & psnMask,
		PSN:     q.req.psn,
		QKey:    w.wr.RemoteQKey,
		SrcQPN:  q.qpn,
		Imm:     w.wr.ImmData,
	}
	q.req.psn = psnAdd(q.req.psn, 1)
	return q.emit(tx, &h, w, 0, w.length, a.attr.DGID)
}

// onAck handles an ACK or NAK (RC). Called from the receive loop with q.mu.
func (q *qp) onAck(tx *txq, h *roce.Header) {
	r := &q.req
	kind, value := h.AckKind()
	switch kind {
	case roce.KindAck:
		q.ackUpTo(h.PSN)
	case roce.KindRNRNak:
		if psnDiff(h.PSN, r.unacked) < 0 || psnDiff(h.PSN, r.psn) >= 0 || r.rnrWait {
			return // stale
		}
		q.ackUpTo(psnAdd(h.PSN, psnMask)) // everything before it
		if q.state != verbs.QPStateRTS {
			return
		}
		if q.attr.RNRRetry != 7 {
			if r.rnrRetry == 0 {
				q.toErr(verbs.WCRNRRetryExcErr)
				return
			}
			r.rnrRetry--
		}
		r.rnrWait = true
		r.rnrPSN = h.PSN
		q.armTimer(time.Duration(rnrTimerTable[value]) * time.Microsecond)
	default: // NAK, or the reserved kind, taken as one
		if psnDiff(h.PSN, r.unacked) < 0 || psnDiff(h.PSN, r.psn) >= 0 {
			return // stale or bogus
		}
		q.ackUpTo(psnAdd(h.PSN, psnMask))
		if q.state != verbs.QPStateRTS {
			return
		}
		switch roce.NakCode(value) {
		case roce.NakPSNSequence:
			if r.rnrWait || (r.nakValid && r.nakPSN == h.PSN) {
				return
			}
			r.nakValid, r.nakPSN = true, h.PSN
			q.goBack(h.PSN)
		case roce.NakInvalidRequest:
			q.toErr(verbs.WCRemInvReqErr)
			return
		case roce.NakRemoteAccess:
			q.toErr(verbs.WCRemAccessErr)
			return
		default:
			q.toErr(verbs.WCRemOpErr)
			return
		}
	}
	q.pump(tx)
}

// ackUpTo acknowledges every PSN up to and including a, completing the
// send WRs they finish, in order.
func (q *qp) ackUpTo(a uint32) {
	r := &q.req
	if psnDiff(a, r.unacked) < 0 || psnDiff(a, r.psn) >= 0 {
		return // old, or for a PSN never sent
	}
	progress := false
	for r.head < r.cur {
		w := q.wqe(r.head)
		last := psnAdd(w.firstPSN, w.npsn-1)
		if psnDiff(last, a) > 0 {
			break
		}
		if w.wr.Opcode == verbs.WRRDMARead && (w.readDone < w.length || w.length == 0 && w.readDone == 0) {
			// The responder executed the read, but its response was lost:
			// ask again for what is missing.
			q.goBack(psnAdd(w.firstPSN, w.readDone/q.mtu))
			return
		}
		q.completeSend(w, verbs.WCSuccess)
		r.head++
		progress = true
	}
	if psnDiff(psnAdd(a, 1), r.unacked) > 0 {
		r.unacked = psnAdd(a, 1)
		progress = true
	}
	if progress {
		q.progress()
	}
}

// progress resets the retry counters and the retransmit timer, as forward
// progress does on hardware.
func (q *qp) progress() {
	r := &q.req
	r.retry = q.attr.RetryCnt
	r.rnrRetry = q.attr.RNRRetry
	r.nakValid = false
	if r.psn == r.unacked && r.head == r.cur {
		r.armed = false
		q.timer.Stop()
		return
	}
	q.armRetransmit(true)
}

// onReadResponse handles an RDMA READ response packet (RC).
func (q *qp) onReadResponse(tx *txq, h *roce.Header, payload []byte) {
	r := &q.req
	// A response implicitly acknowledges everything before it.
	q.ackUpTo(psnAdd(h.PSN, psnMask))
	if q.state != verbs.QPStateRTS || r.head == r.cur {
		return
	}
	w := q.wqe(r.head)
	if w.wr.Opcode != verbs.WRRDMARead {
		return // a stale duplicate
	}
	expect := psnAdd(w.firstPSN, w.readDone/q.mtu)
	switch d := psnDiff(h.PSN, expect); {
	case d < 0:
		q.dev.stats.rxDuplicate.Add(1)
		return
	case d > 0:
		q.dev.stats.rxOutOfSequence.Add(1)
		if psnDiff(h.PSN, psnAdd(w.firstPSN, w.npsn)) < 0 && !(r.nakValid && r.nakPSN == expect) {
			r.nakValid, r.nakPSN = true, expect
			q.goBack(expect)
			q.pump(tx)
		}
		return
	}
	// A read resumed after a loss is answered as a new read (FIRST..LAST
	// from the resume point) while responses to the first request may still
	// arrive, so the opcode is checked only for where the message ends; the
	// length must be exactly what is left there.
	lastPkt := h.Opcode.EndsMessage()
	n := uint32(len(payload))
	left := w.length - w.readDone
	if lastPkt && n != left || !lastPkt && (n != q.mtu || n >= left) {
		q.toErr(verbs.WCBadRespErr)
		return
	}
	if !q.scatterSend(&w.wr, w.readDone, payload) {
		q.toErr(verbs.WCLocProtErr)
		return
	}
	w.readDone += n
	r.unacked = psnAdd(h.PSN, 1)
	if lastPkt {
		if w.length == 0 {
			w.readDone = 1 // mark the empty read as answered
		}
		q.completeSend(w, verbs.WCSuccess)
		r.head++
		q.completeLocalOps()
	}
	q.progress()
	q.pump(tx)
}

// completeLocalOps completes the executed binds and invalidates at the
// head of the send queue: nothing before them is outstanding.
func (q *qp) completeLocalOps() {
	r := &q.req
	for r.head < r.cur {
		w := q.wqe(r.head)
		if !isLocalOp(w.wr.Opcode) || !w.done {
			return
		}
		q.completeSend(w, verbs.WCSuccess)
		r.head++
	}
}

// goBack restarts transmission at PSN p (go-back-N).
func (q *qp) goBack(p uint32) {
	r := &q.req
	for i := r.head; i <= r.cur && i < r.tail; i++ {
		w := q.wqe(i)
		if i == r.cur && r.off == 0 && !(w.wr.Opcode == verbs.WRRDMARead && w.readDone > 0) {
			break // not started
		}
		if psnDiff(p, w.firstPSN) < 0 || psnDiff(p, psnAdd(w.firstPSN, w.npsn)) >= 0 {
			continue
		}
		r.cur = i
		if w.wr.Opcode == verbs.WRRDMARead {
			r.off = 0
		} else {
			r.off = psnDiff32(p, w.firstPSN) * q.mtu
		}
		r.psn = p
		r.unacked = p
		q.dev.stats.retransmits.Add(1)
		return
	}
}

func psnDiff32(a, b uint32) uint32 { return uint32(psnDiff(a, b)) }

// retransmitTimeout is the local ACK timeout: 4.096 µs × 2^Timeout, with a
// floor that keeps the timer meaningful at Go's resolution.
func (q *qp) retransmitTimeout() time.Duration {
	t := time.Duration(4096<<q.attr.Timeout) * time.Nanosecond
	return max(t, time.Millisecond)
}

// armRetransmit makes sure the timer will fire one timeout from now
// (restart) or from when it was first armed.
func (q *qp) armRetransmit(restart bool) {
	if q.attr.Timeout == 0 {
		return // 0 is "wait forever"
	}
	r := &q.req
	if r.armed && !restart {
		return
	}
	d := q.retransmitTimeout()
	r.deadline = time.Now().Add(d)
	if !r.armed {
		r.armed = true
		q.timer.Reset(d)
	}
	// When armed, the pending firing sees the later deadline and re-arms.
}

func (q *qp) armTimer(d time.Duration) {
	r := &q.req
	r.armed = true
	r.deadline = time.Now().Add(d)
	q.timer.Reset(d)
}

// onTimer runs on the runtime's timer goroutine: an RNR wait is over, or
// the retransmit timer expired.
func (q *qp) onTimer() {
	q.mu.Lock()
	defer q.mu.Unlock()
	r := &q.req
	if q.closed || q.state != verbs.QPStateRTS || !r.armed {
		return
	}
	if now := time.Now(); now.Before(r.deadline) {
		q.timer.Reset(r.deadline.Sub(now))
		return
	}
	r.armed = false
	tx := q.dev.getTxq()
	defer q.dev.putTxq(tx)
	if r.rnrWait {
		r.rnrWait = false
		q.goBack(r.rnrPSN)
		q.pump(tx)
		return
	}
	if r.psn == r.unacked && r.head == r.cur {
		return
	}
	q.dev.stats.timeouts.Add(1)
	if r.retry == 0 {
		q.toErr(verbs.WCRetryExcErr)
		return
	}
	r.retry--
	r.nakValid = false
	q.goBack(r.unacked)
	q.pump(tx)
}
