package verbstest

import (
	"errors"
	"fmt"
	"testing"

	"github.com/rdmavisor/rdmavisor/internal/verbs"
)

// testStateMachine checks the QP state machine as ib_modify_qp_is_ok and
// the providers' post paths enforce it.
func testStateMachine(t *testing.T, f Factory) {
	devs := openDevices(t, f, 2, Options{})
	t.Run("RC", func(t *testing.T) { testStateMachineRC(t, devs) })
	t.Run("UD", func(t *testing.T) { testStateMachineUD(t, devs[0]) })
}

// testStateMachineRC: posting sends is refused with ErrInvalidState in RESET,
// INIT and RTR, posting receives in RESET; transitions the IB table lacks
// (RESET→RTR, RESET→RTS, RESET→ERR, INIT→RTS, RTR→INIT, ERR→RTS), masks that
// lack a required attribute or carry one the transition does not take, and
// out-of-range values fail with ErrInvalid and leave the state alone. In ERR
// posts are accepted and complete with WCWRFlushErr; moving to ERR flushes
// posted receives in order; RESET discards posted WRs without consuming
// them, and a QP taken back through RESET connects and works again.
func testStateMachineRC(t *testing.T, devs []verbs.Device) {
	w := newRCStateWalk(t, devs)
	w.fromReset()
	w.fromInit()
	w.fromRTR()
	w.traffic()
	w.errorAndReset()
	w.rtsToReset()
}

// rcStateWalk is testStateMachineRC's fixture: a pair not connected, whose
// QP a the test walks through the states by hand, with each transition's
// attributes.
type rcStateWalk struct {
	t          *testing.T
	devs       []verbs.Device
	p          *Pair
	a, b       verbs.QP
	abuf, bbuf verbs.MR
	prm        connParams
	gidA, gidB verbs.GID
	ia, ra, sa verbs.QPAttr // RESET→INIT, INIT→RTR, RTR→RTS
	im, rm, sm verbs.QPAttrMask
}

func newRCStateWalk(t *testing.T, devs []verbs.Device) *rcStateWalk {
	p := NewPair(t, devs[0], devs[1], PairConfig{NoConnect: true})
	w := &rcStateWalk{t: t, devs: devs, p: p, a: p.A, b: p.B,
		abuf: RegMR(t, p.PDA, 4096, local), bbuf: RegMR(t, p.PDB, 4096, local)}
	w.prm = ConnectOptions{}.resolve(t, w.a, w.b, devs[0], devs[1])
	w.gidA, w.gidB = GID(t, devs[0]), GID(t, devs[1])
	w.ia, w.im = initAttr(verbs.QPTypeRC, w.prm.access, 0)
	w.ra, w.rm = rtrAttr(verbs.QPTypeRC, w.prm, w.gidB, w.b.QPN(), w.prm.psnB)
	w.sa, w.sm = rtsAttr(verbs.QPTypeRC, w.prm, w.prm.psnA)
	return w
}

func (w *rcStateWalk) recv(id uint64) verbs.RecvWR { return RecvWR(id, SGE(w.abuf, 0, 256)) }
func (w *rcStateWalk) send(id uint64) verbs.SendWR {
	return SendWR(id, verbs.WRSend, SGE(w.abuf, 1024, 16))
}
func (w *rcStateWalk) bsend(id uint64) verbs.SendWR {
	return SendWR(id, verbs.WRSend, SGE(w.bbuf, 1024, 16))
}

func stateAttr(s verbs.QPState) verbs.QPAttr { return verbs.QPAttr{State: s} }

// refusedPosts: a refuses a send, and a receive if recvToo, in state.
func (w *rcStateWalk) refusedPosts(state string, recvToo bool) {
	w.t.Helper()
	n, err := w.a.PostSend([]verbs.SendWR{w.send(1)})
	expectRefused(w.t, "PostSend in "+state, n, err, 0, verbs.ErrInvalidState)
	if recvToo {
		n, err := w.a.PostRecv([]verbs.RecvWR{w.recv(1)})
		expectRefused(w.t, "PostRecv in "+state, n, err, 0, verbs.ErrInvalidState)
	}
}

// fromReset: in RESET, a refuses posts and every transition but a
// complete RESET→INIT, which it then takes.
func (w *rcStateWalk) fromReset() {
	t, a, ia, im := w.t, w.a, w.ia, w.im
	w.refusedPosts("RESET", true)
	expectModifyRefused(t, "RESET→RTR", a, w.ra, w.rm)
	expectModifyRefused(t, "RESET→RTS", a, w.sa, w.sm)
	expectModifyRefused(t, "RESET→ERR", a, stateAttr(verbs.QPStateErr), verbs.QPAttrState)
	expectModifyRefused(t, "RESET→INIT without PORT", a, ia, im&^verbs.QPAttrPort)
	expectModifyRefused(t, "RESET→INIT without PKEY_INDEX", a, ia, im&^verbs.QPAttrPKeyIndex)
	expectModifyRefused(t, "RESET→INIT without ACCESS_FLAGS", a, ia, im&^verbs.QPAttrAccessFlags)
	expectModifyRefused(t, "RESET→INIT with SQ_PSN", a, ia, im|verbs.QPAttrSQPSN)
	expectModifyRefused(t, "RESET→INIT of an RC QP with QKEY", a, ia, im|verbs.QPAttrQKey)
	bad := ia
	bad.Port = 2
	expectModifyRefused(t, "RESET→INIT to port 2 of a one-port device", a, bad, im)
	mustModify(t, a, ia, im)
}

// fromInit: in INIT, a refuses sends, takes a receive, and refuses
// INIT→RTS and an incomplete or wrong INIT→RTR; then it takes INIT→RTR.
func (w *rcStateWalk) fromInit() {
	t, a, ra, rm := w.t, w.a, w.ra, w.rm
	w.refusedPosts("INIT", false)
	MustPostRecv(t, a, w.recv(100))
	expectModifyRefused(t, "INIT→RTS", a, w.sa, w.sm)
	for _, c := range []struct {
		name string
		bit  verbs.QPAttrMask
	}{
		{"AV", verbs.QPAttrAV}, {"PATH_MTU", verbs.QPAttrPathMTU}, {"DEST_QPN", verbs.QPAttrDestQPN},
		{"RQ_PSN", verbs.QPAttrRQPSN}, {"MAX_DEST_RD_ATOMIC", verbs.QPAttrMaxDestRdAtomic},
		{"MIN_RNR_TIMER", verbs.QPAttrMinRNRTimer},
	} {
		expectModifyRefused(t, "INIT→RTR without "+c.name, a, ra, rm&^c.bit)
	}
	expectModifyRefused(t, "INIT→RTR with SQ_PSN", a, ra, rm|verbs.QPAttrSQPSN)
	bad := ra
	bad.PathMTU = verbs.MTU(6)
	expectModifyRefused(t, "INIT→RTR with path MTU enum 6", a, bad, rm)
	mustModify(t, a, ra, rm)
}

// fromRTR: in RTR, a refuses sends, takes a receive, and refuses RTR→INIT
// and an incomplete or out-of-range RTR→RTS; then it takes RTR→RTS.
func (w *rcStateWalk) fromRTR() {
	t, a, b, sa, sm := w.t, w.a, w.b, w.sa, w.sm
	w.refusedPosts("RTR", false)
	MustPostRecv(t, a, w.recv(101))
	expectModifyRefused(t, "RTR→INIT", a, stateAttr(verbs.QPStateInit), verbs.QPAttrState)
	for _, c := range []struct {
		name string
		bit  verbs.QPAttrMask
	}{
		{"SQ_PSN", verbs.QPAttrSQPSN}, {"TIMEOUT", verbs.QPAttrTimeout}, {"RETRY_CNT", verbs.QPAttrRetryCnt},
		{"RNR_RETRY", verbs.QPAttrRNRRetry}, {"MAX_QP_RD_ATOMIC", verbs.QPAttrMaxQPRdAtomic},
	} {
		expectModifyRefused(t, "RTR→RTS without "+c.name, a, sa, sm&^c.bit)
	}
	bad := sa
	bad.RetryCnt = 8
	expectModifyRefused(t, "RTR→RTS with RetryCnt 8", a, bad, sm)
	bad = sa
	bad.RNRRetry = 8
	expectModifyRefused(t, "RTR→RTS with RNRRetry 8", a, bad, sm)
	bad = sa
	bad.Timeout = 32
	expectModifyRefused(t, "RTR→RTS with Timeout 32", a, bad, sm)
	mustModify(t, a, sa, sm)
	if q := a.Query(); q.State != verbs.QPStateRTS || q.PathMTU != w.prm.mtu || q.DestQPN != b.QPN() {
		t.Errorf("Query() after RTS: %v; want state=RTS mtu=%v dest_qpn=%#x", &q, w.prm.mtu, b.QPN())
	}
}

// traffic brings b up by hand and exchanges traffic both ways; a's
// receives posted in INIT and RTR serve it.
func (w *rcStateWalk) traffic() {
	t, a, b, p, prm := w.t, w.a, w.b, w.p, w.prm
	mustModify(t, b, w.ia, w.im)
	rb, rbm := rtrAttr(verbs.QPTypeRC, prm, w.gidA, a.QPN(), prm.psnA)
	mustModify(t, b, rb, rbm)
	sb, sbm := rtsAttr(verbs.QPTypeRC, prm, prm.psnB)
	mustModify(t, b, sb, sbm)
	MustPostRecv(t, b, RecvWR(200, SGE(w.bbuf, 0, 256)))
	MustPostSend(t, b, w.bsend(11), w.bsend(12))
	CheckWCs(t, WaitCQ(t, p.CQA, 2, waitDone),
		verbs.WC{WRID: 100, Opcode: verbs.WCRecv, ByteLen: 16, QPN: a.QPN()},
		verbs.WC{WRID: 101, Opcode: verbs.WCRecv, ByteLen: 16, QPN: a.QPN()})
	WaitCQ(t, p.CQB, 2, waitDone)
	MustPostSend(t, a, w.send(13))
	CheckWCs(t, WaitCQ(t, p.CQA, 1, waitDone), verbs.WC{WRID: 13, Opcode: verbs.WCSend, QPN: a.QPN()})
	CheckWCs(t, WaitCQ(t, p.CQB, 1, waitDone), verbs.WC{WRID: 200, Opcode: verbs.WCRecv, ByteLen: 16, QPN: b.QPN()})
}

// errorAndReset: RTS→ERR flushes posted receives, in order; in ERR posts
// complete flushed; through RESET the QP connects anew.
func (w *rcStateWalk) errorAndReset() {
	t, a, b, p := w.t, w.a, w.b, w.p
	MustPostRecv(t, a, w.recv(102), w.recv(103))
	moveTo(t, a, verbs.QPStateErr)
	CheckWCs(t, WaitCQ(t, p.CQA, 2, waitDone),
		verbs.WC{WRID: 102, Status: verbs.WCWRFlushErr, QPN: a.QPN()},
		verbs.WC{WRID: 103, Status: verbs.WCWRFlushErr, QPN: a.QPN()})

	// ERR: posts are accepted and complete flushed.
	MustPostSend(t, a, w.send(14))
	CheckWCs(t, WaitCQ(t, p.CQA, 1, waitDone), verbs.WC{WRID: 14, Status: verbs.WCWRFlushErr, QPN: a.QPN()})
	MustPostRecv(t, a, w.recv(104))
	CheckWCs(t, WaitCQ(t, p.CQA, 1, waitDone), verbs.WC{WRID: 104, Status: verbs.WCWRFlushErr, QPN: a.QPN()})
	expectModifyRefused(t, "ERR→RTS", a, w.sa, w.sm)
	expectModifyRefused(t, "ERR→INIT", a, w.ia, w.im)

	// RESET: posts are refused again, and the QP connects anew.
	moveTo(t, a, verbs.QPStateReset)
	w.refusedPosts("RESET after ERR", true)
	moveTo(t, b, verbs.QPStateReset)
	ExpectIdle(t, p.CQA, waitIdle)
	ExpectIdle(t, p.CQB, 0)
	Connect(t, a, b, w.devs[0], w.devs[1], ConnectOptions{})
}

// rtsToReset: RTS→RESET discards a posted receive: it is never consumed
// (at most it is flushed); connected again, the QP works.
func (w *rcStateWalk) rtsToReset() {
	t, a, b, p := w.t, w.a, w.b, w.p
	MustPostRecv(t, a, w.recv(300))
	moveTo(t, a, verbs.QPStateReset)
	for _, wc := range drainCQ(p.CQA, waitIdle) {
		if wc.WRID != 300 || wc.Status != verbs.WCWRFlushErr {
			t.Errorf("after RTS→RESET: completion %s; at most a flush of wr_id 0x12c", FormatWC(wc))
		}
	}
	moveTo(t, b, verbs.QPStateReset)
	Connect(t, a, b, w.devs[0], w.devs[1], ConnectOptions{})
	MustPostRecv(t, a, w.recv(301))
	MustPostSend(t, b, w.bsend(15))
	CheckWCs(t, WaitCQ(t, p.CQA, 1, waitDone), verbs.WC{WRID: 301, Opcode: verbs.WCRecv, ByteLen: 16, QPN: a.QPN()})
	CheckWCs(t, WaitCQ(t, p.CQB, 1, waitDone), verbs.WC{WRID: 15, Opcode: verbs.WCSend, QPN: b.QPN()})
}

// testStateMachineUD: UD's RESET→INIT needs QKEY and takes no access flags,
// INIT→RTR takes no path, RTR→RTS needs SQ_PSN; receives post from INIT,
// sends only in RTS; Query reports the Q_Key.
func testStateMachineUD(t *testing.T, dev verbs.Device) {
	pd := AllocPD(t, dev)
	cq := CreateCQ(t, dev, 64)
	qp := CreateQP(t, pd, verbs.QPInitAttr{Type: verbs.QPTypeUD, SendCQ: cq, RecvCQ: cq, Cap: DefaultCap})
	buf := RegMR(t, pd, 4096, local)
	const qkey = 0x1234
	var prm connParams
	ia, im := initAttr(verbs.QPTypeUD, 0, qkey)
	expectModifyRefused(t, "UD RESET→INIT without QKEY", qp, ia, im&^verbs.QPAttrQKey)
	expectModifyRefused(t, "UD RESET→INIT with ACCESS_FLAGS", qp, ia, im|verbs.QPAttrAccessFlags)
	mustModify(t, qp, ia, im)
	MustPostRecv(t, qp, RecvWR(1, SGE(buf, 0, 256)))
	n, err := qp.PostSend([]verbs.SendWR{SendWR(2, verbs.WRSend, SGE(buf, 1024, 16))})
	expectRefused(t, "UD PostSend in INIT", n, err, 0, verbs.ErrInvalidState)
	ra, rm := rtrAttr(verbs.QPTypeUD, prm, verbs.GID{}, 0, 0)
	expectModifyRefused(t, "UD INIT→RTR with DEST_QPN", qp, ra, rm|verbs.QPAttrDestQPN)
	mustModify(t, qp, ra, rm)
	n, err = qp.PostSend([]verbs.SendWR{SendWR(3, verbs.WRSend, SGE(buf, 1024, 16))})
	expectRefused(t, "UD PostSend in RTR", n, err, 0, verbs.ErrInvalidState)
	sa, sm := rtsAttr(verbs.QPTypeUD, prm, 0x42)
	expectModifyRefused(t, "UD RTR→RTS without SQ_PSN", qp, sa, sm&^verbs.QPAttrSQPSN)
	mustModify(t, qp, sa, sm)
	if q := qp.Query(); q.State != verbs.QPStateRTS || q.QKey != qkey {
		t.Errorf("UD Query(): state %v qkey %#x; want RTS and %#x", q.State, q.QKey, qkey)
	}
	moveTo(t, qp, verbs.QPStateErr)
	CheckWCs(t, WaitCQ(t, cq, 1, waitDone), verbs.WC{WRID: 1, Status: verbs.WCWRFlushErr, QPN: qp.QPN()})
}

// testCreateValidation: device attributes are sane; creating objects with
// arguments libibverbs refuses fails (ErrInvalid, or ErrNoResources past a
// device limit); MRs with REMOTE_WRITE or REMOTE_ATOMIC need LOCAL_WRITE;
// keys and QPNs are distinct.
func testCreateValidation(t *testing.T, f Factory) {
	dev := openDevices(t, f, 1, Options{})[0]
	a := dev.Attr()
	if a.ActiveMTU.Bytes() == 0 || a.MaxMTU.Bytes() == 0 || a.ActiveMTU > a.MaxMTU {
		t.Errorf("Attr: ActiveMTU %v, MaxMTU %v", a.ActiveMTU, a.MaxMTU)
	}
	if a.PortCount != 1 {
		t.Errorf("Attr: PortCount %d; a verbs.Device has one port", a.PortCount)
	}
	if a.MaxQP < 1 || a.MaxQPWR < 1 || a.MaxSGE < 1 || a.MaxCQ < 1 || a.MaxCQE < 1 || a.MaxMR < 1 ||
		a.MaxMRSize < 1<<20 || a.MaxPD < 1 || a.MaxSRQ < 1 || a.MaxSRQWR < 1 || a.MaxAH < 1 {
		t.Errorf("Attr: a limit below what the suite needs: %+v", a)
	}
	if g := GID(t, dev); g == (verbs.GID{}) {
		t.Errorf("GID(%d) is zero", GIDIndex)
	}
	if _, err := dev.GID(1 << 16); !errors.Is(err, verbs.ErrInvalid) {
		t.Errorf("GID(65536): %v, want an error matching ErrInvalid", err)
	}
	pd := AllocPD(t, dev)
	cq := CreateCQ(t, dev, 16)

	refused := func(what string, c interface{ Close() error }, err error, targets ...error) {
		t.Helper()
		if err == nil {
			if c != nil {
				c.Close()
			}
			t.Errorf("%s: succeeded", what)
		} else if !isAny(err, targets...) {
			t.Errorf("%s: %v, want an error matching one of %q", what, err, targets)
		}
	}
	c, err := dev.CreateCQ(0)
	refused("CreateCQ(0)", c, err, verbs.ErrInvalid)
	if a.MaxCQE > 0 && a.MaxCQE < 1<<22 {
		c, err := dev.CreateCQ(a.MaxCQE + 1)
		refused(fmt.Sprintf("CreateCQ(MaxCQE+1 = %d)", a.MaxCQE+1), c, err, verbs.ErrInvalid, verbs.ErrNoResources)
	}

	m, err := pd.RegMR(0, local)
	refused("RegMR of 0 bytes", m, err, verbs.ErrInvalid)
	m, err = pd.RegMR(4096, verbs.AccessRemoteWrite)
	refused("RegMR with REMOTE_WRITE without LOCAL_WRITE", m, err, verbs.ErrInvalid)
	m, err = pd.RegMR(4096, verbs.AccessRemoteAtomic)
	refused("RegMR with REMOTE_ATOMIC without LOCAL_WRITE", m, err, verbs.ErrInvalid)
	m1, m2 := RegMR(t, pd, 4096, remote), RegMR(t, pd, 4096, remote)
	if m1.LKey() == m2.LKey() || m1.RKey() == m2.RKey() {
		t.Errorf("two MRs share a key: lkeys %#x %#x, rkeys %#x %#x", m1.LKey(), m2.LKey(), m1.RKey(), m2.RKey())
	}

	base := verbs.QPInitAttr{Type: verbs.QPTypeRC, SendCQ: cq, RecvCQ: cq, Cap: verbs.QPCap{MaxSendWR: 16, MaxRecvWR: 16, MaxSendSGE: 1, MaxRecvSGE: 1}}
	tryQP := func(what string, mod func(*verbs.QPInitAttr), targets ...error) {
		t.Helper()
		attr := base
		mod(&attr)
		qp, err := pd.CreateQP(&attr)
		refused("CreateQP "+what, qp, err, targets...)
	}
	tryQP("without a send CQ", func(a *verbs.QPInitAttr) { a.SendCQ = nil }, verbs.ErrInvalid)
	tryQP("without a receive CQ", func(a *verbs.QPInitAttr) { a.RecvCQ = nil }, verbs.ErrInvalid)
	tryQP("of type 9", func(a *verbs.QPInitAttr) { a.Type = 9 }, verbs.ErrInvalid)
	tryQP("with MaxSendSGE = MaxSGE+1", func(q *verbs.QPInitAttr) { q.Cap.MaxSendSGE = uint32(a.MaxSGE + 1) }, verbs.ErrInvalid, verbs.ErrNoResources)
	tryQP("with MaxRecvSGE = MaxSGE+1", func(q *verbs.QPInitAttr) { q.Cap.MaxRecvSGE = uint32(a.MaxSGE + 1) }, verbs.ErrInvalid, verbs.ErrNoResources)
	tryQP("with MaxSendWR = MaxQPWR+1", func(q *verbs.QPInitAttr) { q.Cap.MaxSendWR = uint32(a.MaxQPWR + 1) }, verbs.ErrInvalid, verbs.ErrNoResources)
	tryQP("with MaxRecvWR = MaxQPWR+1", func(q *verbs.QPInitAttr) { q.Cap.MaxRecvWR = uint32(a.MaxQPWR + 1) }, verbs.ErrInvalid, verbs.ErrNoResources)
	seen := map[uint32]bool{}
	for _, typ := range []verbs.QPType{verbs.QPTypeRC, verbs.QPTypeRC, verbs.QPTypeUC, verbs.QPTypeUD} {
		attr := base
		attr.Type = typ
		qp := CreateQP(t, pd, attr)
		if seen[qp.QPN()] {
			t.Errorf("QPN %#x given twice on one device", qp.QPN())
		}
		seen[qp.QPN()] = true
	}
}

// testPostValidation: PostSend and PostRecv refuse with ErrInvalid a WR with
// more SGEs than the QP's capacity (or than verbs.MaxSGE) or an unknown
// opcode, and report bad_wr: in a batch the WRs before the bad one are
// posted and executed, it and those after are not. An opcode the transport
// lacks (RDMA read on UC, RDMA write on UD) is refused or completes in
// error, never succeeds.
func testPostValidation(t *testing.T, f Factory) {
	devs := openDevices(t, f, 2, Options{})
	p := NewPair(t, devs[0], devs[1], PairConfig{Cap: verbs.QPCap{MaxSendSGE: 2, MaxRecvSGE: 2}})
	c := p.A.Query().Cap
	src := RegMR(t, p.PDA, 4096, local)
	dst := RegMR(t, p.PDB, 4096, local)
	var sges [verbs.MaxSGE + 1]verbs.SGE
	for i := range sges {
		sges[i] = SGE(src, i*8, 8)
	}
	if int(c.MaxSendSGE) < verbs.MaxSGE {
		n, err := p.A.PostSend([]verbs.SendWR{SendWR(1, verbs.WRSend, sges[:c.MaxSendSGE+1]...)})
		expectRefused(t, fmt.Sprintf("send with %d SGEs on a QP with MaxSendSGE %d", c.MaxSendSGE+1, c.MaxSendSGE), n, err, 0, verbs.ErrInvalid)
	}
	if int(c.MaxRecvSGE) < verbs.MaxSGE {
		n, err := p.A.PostRecv([]verbs.RecvWR{RecvWR(1, sges[:c.MaxRecvSGE+1]...)})
		expectRefused(t, fmt.Sprintf("receive with %d SGEs on a QP with MaxRecvSGE %d", c.MaxRecvSGE+1, c.MaxRecvSGE), n, err, 0, verbs.ErrInvalid)
	}
	w := SendWR(2, verbs.WRSend, sges[0])
	w.NumSGE = verbs.MaxSGE + 1
	n, err := p.A.PostSend([]verbs.SendWR{w})
	expectRefused(t, "send with NumSGE = verbs.MaxSGE+1", n, err, 0, verbs.ErrInvalid)
	r := RecvWR(2, sges[0])
	r.NumSGE = verbs.MaxSGE + 1
	n, err = p.A.PostRecv([]verbs.RecvWR{r})
	expectRefused(t, "receive with NumSGE = verbs.MaxSGE+1", n, err, 0, verbs.ErrInvalid)
	n, err = p.A.PostSend([]verbs.SendWR{SendWR(3, verbs.WROpcode(42), sges[0])})
	expectRefused(t, "send with opcode 42", n, err, 0, verbs.ErrInvalid)

	MustPostRecv(t, p.B, RecvWR(20, SGE(dst, 0, 1024)), RecvWR(21, SGE(dst, 1024, 1024)))
	n, err = p.A.PostSend([]verbs.SendWR{
		SendWR(5, verbs.WRSend, sges[0]),
		SendWR(6, verbs.WROpcode(42), sges[0]),
		SendWR(7, verbs.WRSend, sges[0]),
	})
	expectRefused(t, "batch with a bad second WR", n, err, 1, verbs.ErrInvalid)
	CheckWCs(t, WaitCQ(t, p.CQA, 1, waitDone), verbs.WC{WRID: 5, Opcode: verbs.WCSend, QPN: p.A.QPN()})
	CheckWCs(t, WaitCQ(t, p.CQB, 1, waitDone), verbs.WC{WRID: 20, Opcode: verbs.WCRecv, ByteLen: 8, QPN: p.B.QPN()})
	ExpectIdle(t, p.CQA, waitIdle)
	ExpectIdle(t, p.CQB, 0)

	// bad_wr on the receive side: only the first receive of the batch is
	// posted; two sends consume 21 (left from above) and 30.
	r = RecvWR(31, sges[0])
	r.NumSGE = verbs.MaxSGE + 1
	n, err = p.B.PostRecv([]verbs.RecvWR{RecvWR(30, SGE(dst, 2048, 1024)), r, RecvWR(32, SGE(dst, 3072, 1024))})
	expectRefused(t, "receive batch with a bad second WR", n, err, 1, verbs.ErrInvalid)
	MustPostSend(t, p.A, SendWR(8, verbs.WRSend, sges[0]), SendWR(9, verbs.WRSend, sges[1]))
	WaitCQ(t, p.CQA, 2, waitDone)
	CheckWCs(t, WaitCQ(t, p.CQB, 2, waitDone),
		verbs.WC{WRID: 21, Opcode: verbs.WCRecv, ByteLen: 8, QPN: p.B.QPN()},
		verbs.WC{WRID: 30, Opcode: verbs.WCRecv, ByteLen: 8, QPN: p.B.QPN()})

	t.Run("ReadOnUC", func(t *testing.T) {
		q := NewPair(t, devs[0], devs[1], PairConfig{Type: verbs.QPTypeUC})
		l := RegMR(t, q.PDA, 4096, local)
		rm := RegMR(t, q.PDB, 4096, remote)
		expectOpRefused(t, "RDMA read on a UC QP", q.A, q.CQA, RDMAWR(1, verbs.WRRDMARead, rm.Addr(), rm.RKey(), SGE(l, 0, 8)))
	})
	t.Run("WriteOnUD", func(t *testing.T) {
		const qkey = 0x777
		a := newUD(t, devs[0], qkey)
		b := newUD(t, devs[1], qkey)
		ah := CreateAH(t, a.pd, devs[1])
		l := RegMR(t, a.pd, 4096, local)
		rm := RegMR(t, b.pd, 4096, remote)
		w := UDWR(1, ah, b.qp.QPN(), qkey, SGE(l, 0, 8))
		w.Opcode, w.RemoteAddr, w.RKey = verbs.WRRDMAWrite, rm.Addr(), rm.RKey()
		expectOpRefused(t, "RDMA write on a UD QP", a.qp, a.cq, w)
	})
}

// expectOpRefused posts w, which qp's transport does not support: PostSend
// must refuse it with ErrInvalid, or its completion must be an error.
func expectOpRefused(t *testing.T, what string, qp verbs.QP, cq verbs.CQ, w verbs.SendWR) {
	t.Helper()
	n, err := qp.PostSend([]verbs.SendWR{w})
	if err != nil {
		expectRefused(t, what, n, err, 0, verbs.ErrInvalid)
		return
	}
	wc := WaitCQ(t, cq, 1, waitDone)[0]
	if wc.Status == verbs.WCSuccess {
		t.Errorf("%s: accepted and completed successfully: %s", what, FormatWC(wc))
	}
}

// testQueueFull: a work queue holds Query().Cap entries. With nothing able
// to complete (the peer drops everything and the ACK timeout is infinite),
// a batch one longer than the capacity is accepted up to the capacity and
// then refused with ErrQueueFull, for both queues. Moving the QP to ERR
// flushes both queues, each in order; once those completions are polled
// the queue takes WRs again.
func testQueueFull(t *testing.T, f Factory) {
	devs := openDevices(t, f, 2, Options{})
	p := NewPair(t, devs[0], devs[1], PairConfig{
		Cap:     verbs.QPCap{MaxSendWR: 8, MaxRecvWR: 8, MaxSendSGE: 1, MaxRecvSGE: 1},
		Connect: ConnectOptions{Timeout: -1},
	})
	c := p.A.Query().Cap
	if c.MaxSendWR > 400 || c.MaxRecvWR > 400 {
		t.Fatalf("QP created with 8 WRs per queue reports %+v; the case needs a small queue", c)
	}
	moveTo(t, p.B, verbs.QPStateReset)
	buf := RegMR(t, p.PDA, 4096, local)

	var recvs []verbs.RecvWR
	var wantRecv []verbs.WC
	for i := range int(c.MaxRecvWR) + 1 {
		recvs = append(recvs, RecvWR(uint64(1000+i), SGE(buf, 0, 64)))
		wantRecv = append(wantRecv, verbs.WC{WRID: uint64(1000 + i), Status: verbs.WCWRFlushErr, QPN: p.A.QPN()})
	}
	n, err := p.A.PostRecv(recvs)
	expectRefused(t, fmt.Sprintf("%d receives into a queue of %d", len(recvs), c.MaxRecvWR), n, err, int(c.MaxRecvWR), verbs.ErrQueueFull)

	var sends []verbs.SendWR
	var wantSend []verbs.WC
	for i := range int(c.MaxSendWR) + 1 {
		sends = append(sends, SendWR(uint64(i), verbs.WRSend, SGE(buf, 64, 16)))
		wantSend = append(wantSend, verbs.WC{WRID: uint64(i), Status: verbs.WCWRFlushErr, QPN: p.A.QPN()})
	}
	n, err = p.A.PostSend(sends)
	expectRefused(t, fmt.Sprintf("%d sends into a queue of %d", len(sends), c.MaxSendWR), n, err, int(c.MaxSendWR), verbs.ErrQueueFull)
	ExpectIdle(t, p.CQA, waitIdle)
	n, err = p.A.PostSend(sends[:1])
	expectRefused(t, "a send into a full queue", n, err, 0, verbs.ErrQueueFull)

	moveTo(t, p.A, verbs.QPStateErr)
	var gotRecv, gotSend []verbs.WC
	for _, wc := range WaitCQ(t, p.CQA, int(c.MaxRecvWR+c.MaxSendWR), waitDone) {
		if wc.WRID >= 1000 {
			gotRecv = append(gotRecv, wc)
		} else {
			gotSend = append(gotSend, wc)
		}
	}
	CheckWCs(t, gotRecv, wantRecv[:c.MaxRecvWR]...)
	CheckWCs(t, gotSend, wantSend[:c.MaxSendWR]...)
	MustPostSend(t, p.A, SendWR(77, verbs.WRSend, SGE(buf, 64, 16)))
	CheckWCs(t, WaitCQ(t, p.CQA, 1, waitDone), verbs.WC{WRID: 77, Status: verbs.WCWRFlushErr, QPN: p.A.QPN()})
}
