//go:build ibverbs && linux

package ibv

// #include <string.h>
// #include "shim.h"
import "C"

import (
	"fmt"
	"sync"
	"sync/atomic"
	"syscall"
	"unsafe"

	"github.com/rdmavisor/rdmavisor/internal/verbs"
)

type qp struct {
	life
	pd         *pd
	qp         *C.struct_ibv_qp
	typ        verbs.QPType
	qpn        uint32
	send, recv *cq
	srq        *srq
	// lim is what PostSend checks a WR against (verbs.CheckSendWR); it
	// never changes after create.
	lim verbs.SendLimits
	cap verbs.QPCap
	// state is the state the last successful Modify set. Posts are
	// checked against it (the provider would queue a WR and fail only at
	// the doorbell); a move to ERR by the device still lets posts through,
	// to be flushed, as libibverbs does.
	state atomic.Uint32
	mu    sync.Mutex // serializes Modify
}

var _ verbs.QP = (*qp)(nil)

func asCQ(c verbs.CQ, which string) (*cq, error) {
	x, ok := c.(*cq)
	if !ok {
		return nil, fmt.Errorf("ibv: create QP: %w: %s CQ is an %T (%w)", verbs.ErrInvalid, which, c, errForeign)
	}
	return x, nil
}

func (p *pd) CreateQP(attr *verbs.QPInitAttr) (verbs.QP, error) {
	if err := verbs.CheckQPInitAttr(attr); err != nil {
		return nil, fmt.Errorf("ibv: create QP: %w", err)
	}
	what := fmt.Sprintf("create %v QP", attr.Type)
	scq, err := asCQ(attr.SendCQ, "send")
	if err != nil {
		return nil, err
	}
	rcq, err := asCQ(attr.RecvCQ, "receive")
	if err != nil {
		return nil, err
	}
	var s *srq
	if attr.SRQ != nil {
		x, ok := attr.SRQ.(*srq)
		if !ok {
			return nil, fmt.Errorf("ibv: %s: %w: SRQ is an %T (%w)", what, verbs.ErrInvalid, attr.SRQ, errForeign)
		}
		s = x
	}
	var ia C.struct_ibv_qp_init_attr
	ia.send_cq, ia.recv_cq = scq.cq, rcq.cq
	if s != nil {
		ia.srq = s.srq
	}
	ia.qp_type = C.enum_ibv_qp_type(attr.Type)
	ia.cap.max_send_wr = C.uint32_t(attr.Cap.MaxSendWR)
	ia.cap.max_send_sge = C.uint32_t(attr.Cap.MaxSendSGE)
	ia.cap.max_inline_data = C.uint32_t(attr.Cap.MaxInlineData)
	if s == nil {
		ia.cap.max_recv_wr = C.uint32_t(attr.Cap.MaxRecvWR)
		ia.cap.max_recv_sge = C.uint32_t(attr.Cap.MaxRecvSGE)
	}
	if attr.SigAll {
		ia.sq_sig_all = 1
	}
	// Hold every object the QP uses, so none closes under it.
	held := []*life{&p.life, &scq.life, &rcq.life}
	if s != nil {
		held = append(held, &s.life)
	}
	for i, l := range held {
		if err := l.hold(what); err != nil {
			for _, h := range held[:i] {
				h.release()
			}
			return nil, err
		}
	}
	q, cerr := C.ibv_create_qp(p.pd, &ia)
	if q == nil {
		for _, h := range held {
			h.release()
		}
		return nil, wrap(what, errnoOf(0, cerr), false)
	}
	x := &qp{pd: p, qp: q, typ: attr.Type, qpn: uint32(q.qp_num), send: scq, recv: rcq, srq: s}
	// The capacity the QP really has: rxe rounds its queues up to a power
	// of two less one and reports the rounded size only through
	// ibv_query_qp, not in the create call's cap.
	c := ia.cap
	var qa C.struct_ibv_qp_attr
	var qi C.struct_ibv_qp_init_attr
	if C.ibv_query_qp(q, &qa, C.IBV_QP_CAP, &qi) == 0 {
		c.max_send_wr = max(c.max_send_wr, qa.cap.max_send_wr)
		c.max_send_sge = max(c.max_send_sge, qa.cap.max_send_sge)
		c.max_inline_data = max(c.max_inline_data, qa.cap.max_inline_data)
		if s == nil {
			c.max_recv_wr = max(c.max_recv_wr, qa.cap.max_recv_wr)
			c.max_recv_sge = max(c.max_recv_sge, qa.cap.max_recv_sge)
		}
	}
	ia.cap = c
	x.cap = verbs.QPCap{MaxSendWR: uint32(c.max_send_wr), MaxRecvWR: uint32(c.max_recv_wr),
		MaxSendSGE: uint32(c.max_send_sge), MaxRecvSGE: uint32(c.max_recv_sge), MaxInlineData: uint32(c.max_inline_data)}
	x.lim = verbs.SendLimits{Type: attr.Type, MaxSGE: x.cap.MaxSendSGE, MaxInline: x.cap.MaxInlineData, MTU: p.dev.mtu}
	return x, nil
}

func (q *qp) QPN() uint32        { return q.qpn }
func (q *qp) Type() verbs.QPType { return q.typ }

// State asks the device: it moves a QP to ERR on its own.
func (q *qp) State() verbs.QPState {
	if q.dead.Load() {
		return verbs.QPState(q.state.Load())
	}
	var a C.struct_ibv_qp_attr
	var ia C.struct_ibv_qp_init_attr
	if C.ibv_query_qp(q.qp, &a, C.IBV_QP_STATE, &ia) != 0 {
		return verbs.QPState(q.state.Load())
	}
	return verbs.QPState(a.qp_state)
}

func (q *qp) Modify(attr *verbs.QPAttr, mask verbs.QPAttrMask) error {
	if err := q.closed(fmt.Sprintf("modify %v QP %#x", q.typ, q.qpn)); err != nil {
		return err
	}
	if err := verbs.CheckQPAttr(attr, mask); err != nil {
		return fmt.Errorf("ibv: modify %v QP %#x (mask %#x): %w", q.typ, q.qpn, uint32(mask), err)
	}
	what := fmt.Sprintf("modify %v QP %#x to %v (mask %#x)", q.typ, q.qpn, attr.State, uint32(mask))
	var a C.struct_ibv_qp_attr
	a.qp_state = C.enum_ibv_qp_state(attr.State)
	a.cur_qp_state = C.enum_ibv_qp_state(attr.CurState)
	a.path_mtu = C.enum_ibv_mtu(attr.PathMTU)
	a.qkey = C.uint32_t(attr.QKey)
	a.rq_psn = C.uint32_t(attr.RQPSN)
	a.sq_psn = C.uint32_t(attr.SQPSN)
	a.dest_qp_num = C.uint32_t(attr.DestQPN)
	a.qp_access_flags = C.uint(attr.AccessFlags)
	a.cap.max_send_wr = C.uint32_t(attr.Cap.MaxSendWR)
	a.cap.max_recv_wr = C.uint32_t(attr.Cap.MaxRecvWR)
	a.cap.max_send_sge = C.uint32_t(attr.Cap.MaxSendSGE)
	a.cap.max_recv_sge = C.uint32_t(attr.Cap.MaxRecvSGE)
	a.cap.max_inline_data = C.uint32_t(attr.Cap.MaxInlineData)
	a.pkey_index = C.uint16_t(attr.PKeyIndex)
	a.port_num = C.uint8_t(attr.Port)
	a.max_rd_atomic = C.uint8_t(attr.MaxRdAtomic)
	a.max_dest_rd_atomic = C.uint8_t(attr.MaxDestRdAtomic)
	a.min_rnr_timer = C.uint8_t(attr.MinRNRTimer)
	a.timeout = C.uint8_t(attr.Timeout)
	a.retry_cnt = C.uint8_t(attr.RetryCnt)
	a.rnr_retry = C.uint8_t(attr.RNRRetry)
	if mask&verbs.QPAttrAV != 0 {
		if err := q.pd.dev.fillAH(&a.ah_attr, &attr.AH); err != nil {
			return fmt.Errorf("ibv: %s: %w", what, err)
		}
	}
	q.mu.Lock()
	defer q.mu.Unlock()
	if rc := C.ibv_modify_qp(q.qp, &a, C.int(mask)); rc != 0 {
		return wrap(what, errnoOf(int(rc), nil), false)
	}
	if mask&verbs.QPAttrState != 0 {
		q.state.Store(uint32(attr.State))
	}
	return nil
}

const queryMask = C.IBV_QP_STATE | C.IBV_QP_CUR_STATE | C.IBV_QP_ACCESS_FLAGS | C.IBV_QP_PKEY_INDEX | C.IBV_QP_PORT |
	C.IBV_QP_QKEY | C.IBV_QP_AV | C.IBV_QP_PATH_MTU | C.IBV_QP_TIMEOUT | C.IBV_QP_RETRY_CNT | C.IBV_QP_RNR_RETRY |
	C.IBV_QP_RQ_PSN | C.IBV_QP_MAX_QP_RD_ATOMIC | C.IBV_QP_MIN_RNR_TIMER | C.IBV_QP_SQ_PSN |
	C.IBV_QP_MAX_DEST_RD_ATOMIC | C.IBV_QP_CAP | C.IBV_QP_DEST_QPN

// Query reports the device's view; Cap is what the QP was created with
// (after the provider rounded it up).
func (q *qp) Query() verbs.QPAttr {
	out := verbs.QPAttr{State: verbs.QPState(q.state.Load()), Cap: q.cap}
	if q.dead.Load() {
		return out
	}
	var a C.struct_ibv_qp_attr
	var ia C.struct_ibv_qp_init_attr
	if C.ibv_query_qp(q.qp, &a, queryMask, &ia) != 0 {
		return out
	}
	out.State = verbs.QPState(a.qp_state)
	out.CurState = verbs.QPState(a.cur_qp_state)
	out.PathMTU = verbs.MTU(a.path_mtu)
	out.QKey = uint32(a.qkey)
	out.RQPSN = uint32(a.rq_psn)
	out.SQPSN = uint32(a.sq_psn)
	out.DestQPN = uint32(a.dest_qp_num)
	out.AccessFlags = verbs.Access(a.qp_access_flags)
	out.AH = q.pd.dev.readAH(&a.ah_attr)
	out.PKeyIndex = uint16(a.pkey_index)
	out.Port = uint8(a.port_num)
	out.MaxRdAtomic = uint8(a.max_rd_atomic)
	out.MaxDestRdAtomic = uint8(a.max_dest_rd_atomic)
	out.MinRNRTimer = uint8(a.min_rnr_timer)
	out.Timeout = uint8(a.timeout)
	out.RetryCnt = uint8(a.retry_cnt)
	out.RNRRetry = uint8(a.rnr_retry)
	return out
}

// postResult splits a C post helper's result (see shim.h).
func postResult(r C.int64_t) (int, syscall.Errno) {
	return int(uint32(r)), syscall.Errno(uint32(uint64(r) >> 32))
}

func (q *qp) PostSend(wrs []verbs.SendWR) (int, error) {
	if len(wrs) == 0 {
		return 0, nil
	}
	if q.dead.Load() {
		return 0, fmt.Errorf("ibv: QP %#x: post send: %w", q.qpn, verbs.ErrClosed)
	}
	switch verbs.QPState(q.state.Load()) {
	case verbs.QPStateRTS, verbs.QPStateSQD, verbs.QPStateSQE, verbs.QPStateErr:
	default:
		return 0, fmt.Errorf("ibv: %v QP %#x: post send in %v: %w", q.typ, q.qpn, verbs.QPState(q.state.Load()), verbs.ErrInvalidState)
	}
	// The WRs up to the first that a check refuses are posted, as a
	// provider posts those before the one it refuses.
	n, bad := len(wrs), error(nil)
	for i := range wrs {
		if err := verbs.CheckSendWR(&wrs[i], &q.lim); err != nil {
			n, bad = i, err
			break
		}
	}
	var r C.int64_t
	wp := (*C.struct_rv_send_wr)(unsafe.Pointer(&wrs[0]))
	switch {
	case n == 0:
	case q.typ == verbs.QPTypeUD:
		p := q.pd
		p.ahMu.RLock()
		if i, err := p.checkAHs(wrs[:n]); err != nil {
			n, bad = i, err
		}
		var ahs **C.struct_ibv_ah
		if len(p.ahs) > 0 {
			ahs = &p.ahs[0]
		}
		r = C.rv_post_send(q.qp, C.uint32_t(q.typ), ahs, C.uint32_t(len(p.ahs)), nil, wp, C.int(n))
		p.ahMu.RUnlock()
	case hasBind(wrs[:n]):
		r, n, bad = q.postBinds(wp, wrs[:n], bad)
	default:
		r = C.rv_post_send(q.qp, C.uint32_t(q.typ), nil, 0, nil, wp, C.int(n))
	}
	posted, e := postResult(r)
	if e != 0 {
		return posted, q.postErr("send", posted, len(wrs), wrs[posted].WRID, e)
	}
	if bad != nil {
		// EINVAL in the chain too, as when the provider refuses.
		return posted, fmt.Errorf("ibv: %v QP %#x: post send: WR %d of %d (wr_id %#x) refused: %w (%w)", q.typ, q.qpn, n, len(wrs), wrs[n].WRID, bad, syscall.EINVAL)
	}
	return posted, nil
}

// checkAHs returns the index of the first WR whose address handle is not
// one of the PD's (len(wrs) when none) and why; ahMu read-locked.
func (p *pd) checkAHs(wrs []verbs.SendWR) (int, error) {
	for i := range wrs {
		if h := wrs[i].AH; h == 0 || int(h) > len(p.ahs) || p.ahs[h-1] == nil {
			return i, fmt.Errorf("%w: address handle %d is not one of the PD's", verbs.ErrInvalid, h)
		}
	}
	return len(wrs), nil
}

func (q *qp) postErr(kind string, n, total int, wrid uint64, e syscall.Errno) error {
	return wrap(fmt.Sprintf("%v QP %#x: post %s: WR %d of %d (wr_id %#x) refused", q.typ, q.qpn, kind, n, total, wrid), e, true)
}

func (q *qp) PostRecv(wrs []verbs.RecvWR) (int, error) {
	if len(wrs) == 0 {
		return 0, nil
	}
	if q.dead.Load() {
		return 0, fmt.Errorf("ibv: QP %#x: post receive: %w", q.qpn, verbs.ErrClosed)
	}
	if q.srq != nil {
		return 0, fmt.Errorf("ibv: QP %#x: post receive: %w: the QP takes its receives from an SRQ", q.qpn, verbs.ErrInvalid)
	}
	if verbs.QPState(q.state.Load()) == verbs.QPStateReset {
		return 0, fmt.Errorf("ibv: %v QP %#x: post receive in RESET: %w", q.typ, q.qpn, verbs.ErrInvalidState)
	}
	r := C.rv_post_recv(q.qp, nil, C.uint32_t(q.cap.MaxRecvSGE), (*C.struct_rv_recv_wr)(unsafe.Pointer(&wrs[0])), C.int(len(wrs)))
	n, e := postResult(r)
	if n > 0 && verbs.QPState(q.state.Load()) == verbs.QPStateErr {
		// A receive posted in ERR must complete flushed. rxe (user QPs)
		// takes receives without entering the kernel, whose responder
		// flushes only when it runs; moving to ERR again runs it.
		C.rv_reenter_err(q.qp)
	}
	if e != 0 {
		return n, q.postErr("receive", n, len(wrs), wrs[n].WRID, e)
	}
	return n, nil
}

func (q *qp) Close() error {
	return q.life.close(fmt.Sprintf("QP %#x", q.qpn), func() error {
		if rc := C.ibv_destroy_qp(q.qp); rc != 0 {
			return wrap(fmt.Sprintf("destroy QP %#x", q.qpn), errnoOf(int(rc), nil), false)
		}
		q.pd.release()
		q.send.release()
		q.recv.release()
		if q.srq != nil {
			q.srq.release()
		}
		return nil
	})
}

type srq struct {
	life
	pd     *pd
	srq    *C.struct_ibv_srq
	maxSGE C.uint32_t
}

var _ verbs.SRQ = (*srq)(nil)

func (p *pd) CreateSRQ(attr *verbs.SRQInitAttr) (verbs.SRQ, error) {
	what := fmt.Sprintf("create SRQ of %d WRs", attr.MaxWR)
	if err := p.hold(what); err != nil {
		return nil, err
	}
	var ia C.struct_ibv_srq_init_attr
	ia.attr.max_wr = C.uint32_t(attr.MaxWR)
	ia.attr.max_sge = C.uint32_t(attr.MaxSGE)
	ia.attr.srq_limit = C.uint32_t(attr.Limit)
	s, cerr := C.ibv_create_srq(p.pd, &ia)
	if s == nil {
		p.release()
		return nil, wrap(what, errnoOf(0, cerr), false)
	}
	return &srq{pd: p, srq: s, maxSGE: ia.attr.max_sge}, nil
}

func (s *srq) PostRecv(wrs []verbs.RecvWR) (int, error) {
	if len(wrs) == 0 {
		return 0, nil
	}
	if s.dead.Load() {
		return 0, fmt.Errorf("ibv: SRQ: post receive: %w", verbs.ErrClosed)
	}
	r := C.rv_post_recv(nil, s.srq, s.maxSGE, (*C.struct_rv_recv_wr)(unsafe.Pointer(&wrs[0])), C.int(len(wrs)))
	n, e := postResult(r)
	if e != 0 {
		return n, wrap(fmt.Sprintf("SRQ: post receive: WR %d of %d (wr_id %#x) refused", n, len(wrs), wrs[n].WRID), e, true)
	}
	return n, nil
}

func (s *srq) Close() error {
	return s.life.close("SRQ", func() error {
		if rc := C.ibv_destroy_srq(s.srq); rc != 0 {
			return wrap("destroy SRQ", errnoOf(int(rc), nil), false)
		}
		s.pd.release()
		return nil
	})
}
