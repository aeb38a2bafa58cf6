package soft

import (
	"fmt"
	"math"
	"sync"
	"time"

	"github.com/rdmavisor/rdmavisor/internal/verbs"
)

type qp struct {
	dev    *Device
	pd     *pd
	qpn    uint32
	typ    verbs.QPType
	sendCQ *cq
	recvCQ *cq
	srq    *srq
	sigAll bool
	cap    verbs.QPCap

	mu      sync.Mutex
	state   verbs.QPState // guarded by mu
	attr    verbs.QPAttr  // guarded by mu
	mtu     uint32        // path MTU in bytes; guarded by mu
	rq      *rq           // own receive queue; nil with an SRQ
	inline  []byte        // MaxInlineData bytes per send queue slot
	req     requester     // guarded by mu
	resp    responder     // guarded by mu
	timer   *time.Timer
	closed  bool // guarded by mu
	ackNext *qp  // receive loop's list of QPs owing an ACK; owned by that loop
	ackOwed bool // owned by the receive loop

	mwMu sync.Mutex
	mws  map[*mw]struct{} // windows bound on this QP; guarded by mwMu
}

var _ verbs.QP = (*qp)(nil)

// CreateQP creates an RC, UC or UD queue pair in RESET.
func (p *pd) CreateQP(attr *verbs.QPInitAttr) (verbs.QP, error) {
	if p.closed.Load() {
		return nil, fmt.Errorf("soft: create qp: %w", verbs.ErrClosed)
	}
	if err := verbs.CheckQPInitAttr(attr); err != nil {
		return nil, fmt.Errorf("soft: create qp: %w", err)
	}
	scq, ok1 := attr.SendCQ.(*cq)
	rcq, ok2 := attr.RecvCQ.(*cq)
	if !ok1 || !ok2 || scq == nil || rcq == nil || scq.dev != p.dev || rcq.dev != p.dev {
		return nil, fmt.Errorf("soft: create qp: %w: send and receive CQs must be this device's", verbs.ErrInvalid)
	}
	c := attr.Cap
	if c.MaxSendWR == 0 || c.MaxSendWR > maxQPWR || c.MaxSendSGE > verbs.MaxSGE || c.MaxRecvSGE > verbs.MaxSGE {
		return nil, fmt.Errorf("soft: create qp: %w: capabilities %+v exceed the device's (%d WRs, %d SGEs)", verbs.ErrInvalid, c, maxQPWR, verbs.MaxSGE)
	}
	if c.MaxInlineData > maxInline {
		return nil, fmt.Errorf("soft: create qp: %w: %d bytes of inline data, the device allows %d", verbs.ErrInvalid, c.MaxInlineData, maxInline)
	}
	if c.MaxSendSGE == 0 {
		c.MaxSendSGE = 1
	}
	if c.MaxRecvSGE == 0 {
		c.MaxRecvSGE = 1
	}
	q := &qp{dev: p.dev, pd: p, typ: attr.Type, sendCQ: scq, recvCQ: rcq, sigAll: attr.SigAll, cap: c}
	if attr.SRQ != nil {
		s, ok := attr.SRQ.(*srq)
		if !ok || s.pd.dev != p.dev {
			return nil, fmt.Errorf("soft: create qp: %w: SRQ is not this device's", verbs.ErrInvalid)
		}
		q.srq = s
		q.cap.MaxRecvWR = 0
	} else {
		if c.MaxRecvWR == 0 || c.MaxRecvWR > maxQPWR {
			return nil, fmt.Errorf("soft: create qp: %w: %d receive WRs", verbs.ErrInvalid, c.MaxRecvWR)
		}
		q.rq = newRQ(int(c.MaxRecvWR), int(c.MaxRecvSGE))
	}
	q.req.sq = make([]swqe, c.MaxSendWR)
	if c.MaxInlineData > 0 {
		q.inline = make([]byte, int(c.MaxSendWR)*int(c.MaxInlineData))
	}
	q.timer = time.AfterFunc(math.MaxInt64, q.onTimer)
	q.timer.Stop()

	d := p.dev
	d.qpMu.Lock()
	if len(d.qps) >= maxQP {
		d.qpMu.Unlock()
		return nil, fmt.Errorf("soft: create qp: %w", verbs.ErrNoResources)
	}
	for {
		qpn := d.nextQPN
		d.nextQPN = (d.nextQPN + 1) & psnMask
		if d.nextQPN < firstQPN {
			d.nextQPN = firstQPN
		}
		if _, taken := d.qps[qpn]; !taken {
			q.qpn = qpn
			break
		}
	}
	d.qps[q.qpn] = q
	d.qpMu.Unlock()

	p.children.Add(1)
	scq.use(1)
	rcq.use(1)
	if q.srq != nil {
		q.srq.users.Add(1)
	}
	return q, nil
}

func (q *qp) QPN() uint32        { return q.qpn }
func (q *qp) Type() verbs.QPType { return q.typ }

func (q *qp) State() verbs.QPState {
	q.mu.Lock()
	defer q.mu.Unlock()
	return q.state
}

func (q *qp) Query() verbs.QPAttr {
	q.mu.Lock()
	defer q.mu.Unlock()
	a := q.attr
	a.State = q.state
	a.CurState = q.state
	a.Cap = q.cap
	return a
}

// Close destroys the QP. Nothing is completed: as with ibv_destroy_qp,
// outstanding work requests simply vanish.
func (q *qp) Close() error {
	q.mu.Lock()
	if q.closed {
		q.mu.Unlock()
		return fmt.Errorf("soft: destroy qp %#x: %w", q.qpn, verbs.ErrClosed)
	}
	q.closed = true
	q.state = verbs.QPStateErr
	q.mu.Unlock()
	q.timer.Stop()
	q.dropWindows()
	d := q.dev
	d.qpMu.Lock()
	delete(d.qps, q.qpn)
	d.qpMu.Unlock()
	q.sendCQ.use(-1)
	q.recvCQ.use(-1)
	if q.srq != nil {
		q.srq.users.Add(-1)
	}
	q.pd.children.Add(-1)
	return nil
}

// transition describes one legal state change for one QP type: the
// attributes it requires and those it also accepts (IBA table 91, as the
// kernel's ib_modify_qp_is_ok has it).
type transition struct{ required, optional verbs.QPAttrMask }

const (
	maskState = verbs.QPAttrState | verbs.QPAttrCurState
)

func transitionFor(t verbs.QPType, from, to verbs.QPState) (transition, bool) {
	// Any state may go to RESET, and any but RESET to ERR (the kernel's
	// ib_modify_qp_is_ok table).
	if to == verbs.QPStateReset || to == verbs.QPStateErr && from != verbs.QPStateReset {
		return transition{}, true
	}
	rc, uc := t == verbs.QPTypeRC, t == verbs.QPTypeUC
	switch {
	case from == verbs.QPStateReset && to == verbs.QPStateInit:
		if rc || uc {
			return transition{required: verbs.QPAttrPKeyIndex | verbs.QPAttrPort | verbs.QPAttrAccessFlags}, true
		}
		return transition{required: verbs.QPAttrPKeyIndex | verbs.QPAttrPort | verbs.QPAttrQKey}, true
	case from == verbs.QPStateInit && to == verbs.QPStateInit:
		if rc || uc {
			return transition{optional: verbs.QPAttrPKeyIndex | verbs.QPAttrPort | verbs.QPAttrAccessFlags}, true
		}
		return transition{optional: verbs.QPAttrPKeyIndex | verbs.QPAttrPort | verbs.QPAttrQKey}, true
	case from == verbs.QPStateInit && to == verbs.QPStateRTR:
		switch {
		case rc:
			return transition{
				required: verbs.QPAttrAV | verbs.QPAttrPathMTU | verbs.QPAttrDestQPN | verbs.QPAttrRQPSN | verbs.QPAttrMaxDestRdAtomic | verbs.QPAttrMinRNRTimer,
				optional: verbs.QPAttrPKeyIndex | verbs.QPAttrAccessFlags,
			}, true
		case uc:
			return transition{
				required: verbs.QPAttrAV | verbs.QPAttrPathMTU | verbs.QPAttrDestQPN | verbs.QPAttrRQPSN,
				optional: verbs.QPAttrPKeyIndex | verbs.QPAttrAccessFlags,
			}, true
		}
		return transition{optional: verbs.QPAttrPKeyIndex | verbs.QPAttrQKey}, true
	case from == verbs.QPStateRTR && to == verbs.QPStateRTS:
		switch {
		case rc:
			return transition{
				required: verbs.QPAttrSQPSN | verbs.QPAttrTimeout | verbs.QPAttrRetryCnt | verbs.QPAttrRNRRetry | verbs.QPAttrMaxQPRdAtomic,
				optional: verbs.QPAttrAccessFlags | verbs.QPAttrMinRNRTimer,
			}, true
		case uc:
			return transition{required: verbs.QPAttrSQPSN, optional: verbs.QPAttrAccessFlags}, true
		}
		return transition{required: verbs.QPAttrSQPSN, optional: verbs.QPAttrQKey}, true
	case from == verbs.QPStateRTS && to == verbs.QPStateRTS:
		switch {
		case rc:
			return transition{optional: verbs.QPAttrAccessFlags | verbs.QPAttrMinRNRTimer}, true
		case uc:
			return transition{optional: verbs.QPAttrAccessFlags}, true
		}
		return transition{optional: verbs.QPAttrQKey}, true
	}
	return transition{}, false
}

// Modify changes the QP's state and attributes.
func (q *qp) Modify(attr *verbs.QPAttr, mask verbs.QPAttrMask) error {
	q.mu.Lock()
	defer q.mu.Unlock()
	if q.closed {
		return fmt.Errorf("soft: modify qp %#x: %w", q.qpn, verbs.ErrClosed)
	}
	if err := verbs.CheckQPAttr(attr, mask); err != nil {
		return fmt.Errorf("soft: modify %v qp %#x: %w", q.typ, q.qpn, err)
	}
	from := q.state
	if mask&verbs.QPAttrCurState != 0 && attr.CurState != from {
		return fmt.Errorf("soft: modify qp %#x: %w: current state is %v, not %v", q.qpn, verbs.ErrInvalidState, from, attr.CurState)
	}
	to := from
	if mask&verbs.QPAttrState != 0 {
		to = attr.State
	}
	tr, ok := transitionFor(q.typ, from, to)
	if !ok {
		return fmt.Errorf("soft: modify %v qp %#x: %w: %v→%v", q.typ, q.qpn, verbs.ErrInvalidState, from, to)
	}
	if missing := tr.required &^ mask; missing != 0 {
		return fmt.Errorf("soft: modify %v qp %#x %v→%v: %w: missing attributes %#x", q.typ, q.qpn, from, to, verbs.ErrInvalid, uint32(missing))
	}
	if extra := mask &^ (tr.required | tr.optional | maskState); extra != 0 {
		return fmt.Errorf("soft: modify %v qp %#x %v→%v: %w: attributes %#x not allowed", q.typ, q.qpn, from, to, verbs.ErrInvalid, uint32(extra))
	}
	if err := q.checkAttr(attr, mask); err != nil {
		return fmt.Errorf("soft: modify %v qp %#x %v→%v: %w", q.typ, q.qpn, from, to, err)
	}
	q.applyAttr(attr, mask)

	switch to {
	case verbs.QPStateReset:
		q.reset()
	case verbs.QPStateErr:
		if from != verbs.QPStateErr {
			q.toErr(verbs.WCWRFlushErr)
		}
	case verbs.QPStateRTR:
		if from == verbs.QPStateInit {
			q.resp = responder{epsn: q.attr.RQPSN}
			q.resp.reads.reset(q.attr.MaxDestRdAtomic)
		}
	case verbs.QPStateRTS:
		if from == verbs.QPStateRTR {
			q.req.psn = q.attr.SQPSN
			q.req.unacked = q.attr.SQPSN
			q.req.retry = q.attr.RetryCnt
			q.req.rnrRetry = q.attr.RNRRetry
		}
	}
	q.state = to
	return nil
}

// checkAttr is Modify's check of what is the soft device's own, after
// verbs.CheckQPAttr: its one port and pkey, and a destination to send to.
func (q *qp) checkAttr(a *verbs.QPAttr, mask verbs.QPAttrMask) error {
	if mask&verbs.QPAttrPort != 0 && a.Port != 1 {
		return fmt.Errorf("%w: port %d (the device has port 1)", verbs.ErrInvalid, a.Port)
	}
	if mask&verbs.QPAttrPKeyIndex != 0 && a.PKeyIndex != 0 {
		return fmt.Errorf("%w: pkey index %d (the port has one pkey)", verbs.ErrInvalid, a.PKeyIndex)
	}
	if mask&verbs.QPAttrAV != 0 && a.AH.NoGRH {
		return fmt.Errorf("%w: %s", verbs.ErrInvalid, errNoGRH)
	}
	if mask&verbs.QPAttrAV != 0 && a.AH.DGID == (verbs.GID{}) {
		return fmt.Errorf("%w: address vector without a destination GID", verbs.ErrInvalid)
	}
	return nil
}

// errNoGRH says why the soft device refuses an InfiniBand address vector.
const errNoGRH = "address vector without a GRH: the port is RoCE (Ethernet), which routes by GID, not LID"

func (q *qp) applyAttr(a *verbs.QPAttr, mask verbs.QPAttrMask) {
	t := &q.attr
	if mask&verbs.QPAttrAccessFlags != 0 {
		t.AccessFlags = a.AccessFlags
	}
	if mask&verbs.QPAttrPKeyIndex != 0 {
		t.PKeyIndex = a.PKeyIndex
	}
	if mask&verbs.QPAttrPort != 0 {
		t.Port = a.Port
	}
	if mask&verbs.QPAttrQKey != 0 {
		t.QKey = a.QKey
	}
	if mask&verbs.QPAttrAV != 0 {
		t.AH = a.AH
	}
	if mask&verbs.QPAttrPathMTU != 0 {
		t.PathMTU = a.PathMTU
		q.mtu = uint32(a.PathMTU.Bytes())
	}
	if mask&verbs.QPAttrTimeout != 0 {
		t.Timeout = a.Timeout
	}
	if mask&verbs.QPAttrRetryCnt != 0 {
		t.RetryCnt = a.RetryCnt
	}
	if mask&verbs.QPAttrRNRRetry != 0 {
		t.RNRRetry = a.RNRRetry
	}
	if mask&verbs.QPAttrRQPSN != 0 {
		t.RQPSN = a.RQPSN
	}
	if mask&verbs.QPAttrSQPSN != 0 {
		t.SQPSN = a.SQPSN
	}
	if mask&verbs.QPAttrMaxQPRdAtomic != 0 {
		t.MaxRdAtomic = a.MaxRdAtomic
	}
	if mask&verbs.QPAttrMaxDestRdAtomic != 0 {
		t.MaxDestRdAtomic = a.MaxDestRdAtomic
	}
	if mask&verbs.QPAttrMinRNRTimer != 0 {
		t.MinRNRTimer = a.MinRNRTimer
	}
	if mask&verbs.QPAttrDestQPN != 0 {
		t.DestQPN = a.DestQPN
	}
	if q.typ == verbs.QPTypeUD && q.mtu == 0 {
		q.mtu = uint32(q.dev.mtu.Bytes())
	}
}

// reset returns the QP to RESET: queues emptied without completions.
func (q *qp) reset() {
	q.timer.Stop()
	sq := q.req.sq
	clear(sq)
	q.req = requester{sq: sq}
	q.resp = responder{}
	if q.rq != nil {
		q.rq.clear()
	}
	q.attr = verbs.QPAttr{}
	q.mtu = 0
}

// PostRecv posts to the QP's own receive queue.
func (q *qp) PostRecv(wrs []verbs.RecvWR) (int, error) {
	if q.rq == nil {
		return 0, fmt.Errorf("soft: post recv on qp %#x: %w: the QP uses an SRQ", q.qpn, verbs.ErrInvalid)
	}
	q.mu.Lock()
	defer q.mu.Unlock()
	if q.closed {
		return 0, fmt.Errorf("soft: post recv: %w", verbs.ErrClosed)
	}
	switch q.state {
	case verbs.QPStateReset:
		return 0, fmt.Errorf("soft: post recv on qp %#x: %w: %v", q.qpn, verbs.ErrInvalidState, q.state)
	case verbs.QPStateErr:
		// Accepted and flushed at once, as hardware does in the error state.
		n, err := q.rq.post(wrs)
		q.flushRecv()
		return n, err
	}
	return q.rq.post(wrs)
}

// PostSend posts a batch and transmits what the window allows.
func (q *qp) PostSend(wrs []verbs.SendWR) (int, error) {
	q.mu.Lock()
	defer q.mu.Unlock()
	if q.closed {
		return 0, fmt.Errorf("soft: post send: %w", verbs.ErrClosed)
	}
	if q.state != verbs.QPStateRTS && q.state != verbs.QPStateErr {
		return 0, fmt.Errorf("soft: post send on qp %#x: %w: %v", q.qpn, verbs.ErrInvalidState, q.state)
	}
	r := &q.req
	lim := verbs.SendLimits{Type: q.typ, MaxSGE: q.cap.MaxSendSGE, MaxInline: q.cap.MaxInlineData, MTU: q.mtu}
	for i := range wrs {
		wr := &wrs[i]
		if err := q.checkSendWR(wr, &lim); err != nil {
			q.kick()
			return i, fmt.Errorf("soft: post send on %v qp %#x, wr %d: %w", q.typ, q.qpn, i, err)
		}
		if r.tail-r.head == uint64(len(r.sq)) {
			q.kick()
			return i, fmt.Errorf("soft: post send on qp %#x: %w", q.qpn, verbs.ErrQueueFull)
		}
		slot := r.tail % uint64(len(r.sq))
		w := &r.sq[slot]
		*w = swqe{wr: *wr, length: uint32(wr.Len()), signaled: q.sigAll || wr.Flags&verbs.SendSignaled != 0}
		if isLocalOp(wr.Opcode) {
			w.length = 0
			if wr.Opcode == verbs.WRBindMW {
				// RKey shows the key of the last bind posted, as
				// libibverbs keeps ibv_mw.rkey.
				if m := q.dev.mws.at(wr.MW); m != nil {
					m.posted.Store(m.key.Load()&^0xff | wr.RKey&0xff)
				}
			}
		}
		if wr.Flags&verbs.SendInline != 0 {
			// Inline data is copied now: the caller may reuse its buffer
			// as soon as PostSend returns, and its lkey is not checked.
			m := uint64(q.cap.MaxInlineData)
			w.inl = q.inline[slot*m : slot*m+uint64(w.length)]
			copyInline(w.inl, wr)
		}
		r.tail++
	}
	q.kick()
	return len(wrs), nil
}

// kick transmits what it can, or flushes when the QP is in ERR.
func (q *qp) kick() {
	if q.state == verbs.QPStateErr {
		q.flushSend(verbs.WCWRFlushErr)
		return
	}
	tx := q.dev.getTxq()
	q.pump(tx)
	q.dev.putTxq(tx)
}

// checkSendWR is PostSend's check of one WR: verbs.CheckSendWR, then what
// is the soft device's own.
func (q *qp) checkSendWR(wr *verbs.SendWR, lim *verbs.SendLimits) error {
	if err := verbs.CheckSendWR(wr, lim); err != nil {
		return err
	}
	// IBA's largest message (as the kernel's rxe refuses for its own QPs).
	if n := wr.Len(); n > 1<<31 {
		return fmt.Errorf("%w: message of %d bytes exceeds 2 GiB", verbs.ErrInvalid, n)
	}
	if isLocalOp(wr.Opcode) {
		return q.checkLocalOp(wr)
	}
	return nil
}

// toErr moves the QP to ERR: the oldest outstanding send WR completes with
// status, the rest and every receive with WR_FLUSH_ERR.
func (q *qp) toErr(status verbs.WCStatus) { q.toErrAt(q.req.head, status) }

// toErrAt moves the QP to ERR because of send WR i, which completes with
// status; every other outstanding WR completes with WR_FLUSH_ERR.
func (q *qp) toErrAt(i uint64, status verbs.WCStatus) {
	q.state = verbs.QPStateErr
	q.req.armed = false
	q.timer.Stop()
	q.flushSendAt(i, status)
	q.flushRecv()
}

func (q *qp) flushSend(status verbs.WCStatus) { q.flushSendAt(q.req.head, status) }

func (q *qp) flushSendAt(i uint64, status verbs.WCStatus) {
	r := &q.req
	for r.head < r.tail {
		s := verbs.WCWRFlushErr
		if r.head == i {
			s = status
		}
		q.completeSend(q.wqe(r.head), s)
		r.head++
	}
	r.cur = r.head
	r.off = 0
}

func (q *qp) flushRecv() {
	var wc verbs.WC
	if q.resp.hasRecv {
		q.resp.hasRecv = false
		wc = verbs.WC{WRID: q.resp.recv.WRID, Status: verbs.WCWRFlushErr, Opcode: verbs.WCRecv, QPN: q.qpn}
		q.recvCQ.push(&wc, false)
	}
	if q.rq == nil {
		return
	}
	var wr verbs.RecvWR
	for q.rq.take(&wr) {
		wc = verbs.WC{WRID: wr.WRID, Status: verbs.WCWRFlushErr, Opcode: verbs.WCRecv, QPN: q.qpn}
		q.recvCQ.push(&wc, false)
	}
}

// completeSend reports a send WR's completion, if it is signaled or failed.
func (q *qp) completeSend(w *swqe, status verbs.WCStatus) {
	if status == verbs.WCSuccess && !w.signaled {
		return
	}
	wc := verbs.WC{WRID: w.wr.WRID, Status: status, QPN: q.qpn, ByteLen: w.length}
	switch w.wr.Opcode {
	case verbs.WRRDMAWrite, verbs.WRRDMAWriteWithImm:
		wc.Opcode = verbs.WCRDMAWrite
	case verbs.WRRDMARead:
		wc.Opcode = verbs.WCRDMARead
	case verbs.WRBindMW:
		wc.Opcode = verbs.WCBindMW
	case verbs.WRLocalInv:
		wc.Opcode = verbs.WCLocalInv
	default:
		wc.Opcode = verbs.WCSend
	}
	q.sendCQ.push(&wc, false)
}

// takeRecv takes the next receive WR from the SRQ or the QP's queue.
func (q *qp) takeRecv(out *verbs.RecvWR) bool {
	if q.srq != nil {
		return q.srq.rq.take(out)
	}
	return q.rq.take(out)
}
