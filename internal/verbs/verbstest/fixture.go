package verbstest

import (
	"errors"
	"testing"

	"github.com/rdmavisor/rdmavisor/internal/verbs"
)

// Addressing and the defaults Connect uses for ConnectOptions fields left zero.
const (
	// PortNum is the port every QP and AH uses (devices have one port).
	PortNum = 1
	// GIDIndex is the GID table entry that addresses a device.
	GIDIndex = 0
	// HopLimit is the GRH hop limit of every path (RoCEv2 routes over IP).
	HopLimit = 64

	DefaultTimeout     = 12 // 4.096 µs × 2^12 ≈ 16.8 ms
	DefaultRetryCnt    = 7
	DefaultRNRRetry    = 7 // retry forever
	DefaultMinRNRTimer = 4 // 0.04 ms
	DefaultRdAtomic    = 1
	DefaultAccess      = verbs.AccessRemoteWrite | verbs.AccessRemoteRead
)

// ConnectOptions are the path and retry attributes Connect gives both QPs.
// A zero field takes its default; for the integer fields a negative value
// asks for a literal 0 (as net.Dialer.KeepAlive does), since 0 is meaningful
// in IB: Timeout 0 waits forever, RetryCnt/RNRRetry 0 never retry,
// MinRNRTimer 0 is 655.36 ms.
type ConnectOptions struct {
	// MTU is the path MTU; zero picks the smaller ActiveMTU of the devices.
	MTU verbs.MTU
	// Timeout is the local ACK timeout exponent: 4.096 µs × 2^Timeout.
	Timeout int
	// RetryCnt is how many times a request is retransmitted after a timeout
	// (0..7).
	RetryCnt int
	// RNRRetry is how many times a request is retried after an RNR NAK
	// (0..7; 7 retries forever).
	RNRRetry int
	// MinRNRTimer is the IB-encoded delay the responder asks for in its RNR
	// NAKs (1 is 0.01 ms, 14 is 1.28 ms, 22 is 20.48 ms).
	MinRNRTimer int
	// Access is the QPs' remote access flags; zero is DefaultAccess.
	Access verbs.Access
	// RdAtomic is how many RDMA reads each side may have outstanding as
	// requester and as responder.
	RdAtomic int
	// PSNA and PSNB are the first PSNs A and B send; zero derives them from
	// the QPN (so they are rarely 0 and differ per QP).
	PSNA, PSNB int
}

// connParams are ConnectOptions resolved to the values written to the QPs.
type connParams struct {
	mtu                                                verbs.MTU
	timeout, retryCnt, rnrRetry, minRNRTimer, rdAtomic uint8
	access                                             verbs.Access
	psnA, psnB                                         uint32
}

func orDefault(v, def int) uint8 {
	switch {
	case v == 0:
		return uint8(def)
	case v < 0:
		return 0
	}
	return uint8(v)
}

func psnFor(v int, qpn uint32) uint32 {
	switch {
	case v == 0:
		return (qpn*0x9E3779B1 + 0x5BD1E9) & 0xFFFFFF
	case v < 0:
		return 0
	}
	return uint32(v) & 0xFFFFFF
}

func (o ConnectOptions) resolve(t testing.TB, a, b verbs.QP, devA, devB verbs.Device) connParams {
	t.Helper()
	p := connParams{
		mtu:         o.MTU,
		timeout:     orDefault(o.Timeout, DefaultTimeout),
		retryCnt:    orDefault(o.RetryCnt, DefaultRetryCnt),
		rnrRetry:    orDefault(o.RNRRetry, DefaultRNRRetry),
		minRNRTimer: orDefault(o.MinRNRTimer, DefaultMinRNRTimer),
		rdAtomic:    orDefault(o.RdAtomic, DefaultRdAtomic),
		access:      o.Access,
		psnA:        psnFor(o.PSNA, a.QPN()),
		psnB:        psnFor(o.PSNB, b.QPN()),
	}
	if p.access == 0 {
		p.access = DefaultAccess
	}
	if p.mtu == 0 {
		p.mtu = min(devA.Attr().ActiveMTU, devB.Attr().ActiveMTU)
		if p.mtu.Bytes() == 0 {
			t.Fatalf("devices report active MTUs %v and %v", devA.Attr().ActiveMTU, devB.Attr().ActiveMTU)
		}
	}
	return p
}

// initAttr is RESET→INIT with the attributes libibverbs requires: P_Key
// index, port and (RC, UC) access flags or (UD) Q_Key.
func initAttr(typ verbs.QPType, access verbs.Access, qkey uint32) (verbs.QPAttr, verbs.QPAttrMask) {
	a := verbs.QPAttr{State: verbs.QPStateInit, PKeyIndex: 0, Port: PortNum}
	m := verbs.QPAttrState | verbs.QPAttrPKeyIndex | verbs.QPAttrPort
	if typ == verbs.QPTypeUD {
		a.QKey = qkey
		m |= verbs.QPAttrQKey
	} else {
		a.AccessFlags = access
		m |= verbs.QPAttrAccessFlags
	}
	return a, m
}

// ahTo is the path to a GID.
func ahTo(gid verbs.GID) verbs.AHAttr {
	return verbs.AHAttr{DGID: gid, SGIDIndex: GIDIndex, HopLimit: HopLimit, PortNum: PortNum}
}

// rtrAttr is INIT→RTR: for UD the state alone; for UC the path, MTU,
// destination QPN and expected PSN; for RC also the responder's read depth
// and RNR timer.
func rtrAttr(typ verbs.QPType, p connParams, dgid verbs.GID, dqpn, rqpsn uint32) (verbs.QPAttr, verbs.QPAttrMask) {
	a := verbs.QPAttr{State: verbs.QPStateRTR}
	m := verbs.QPAttrState
	if typ == verbs.QPTypeUD {
		return a, m
	}
	a.AH = ahTo(dgid)
	a.PathMTU = p.mtu
	a.DestQPN = dqpn
	a.RQPSN = rqpsn
	m |= verbs.QPAttrAV | verbs.QPAttrPathMTU | verbs.QPAttrDestQPN | verbs.QPAttrRQPSN
	if typ == verbs.QPTypeRC {
		a.MaxDestRdAtomic = p.rdAtomic
		a.MinRNRTimer = p.minRNRTimer
		m |= verbs.QPAttrMaxDestRdAtomic | verbs.QPAttrMinRNRTimer
	}
	return a, m
}

// rtsAttr is RTR→RTS: the send PSN, and for RC the retry attributes and
// the requester's read depth.
func rtsAttr(typ verbs.QPType, p connParams, sqpsn uint32) (verbs.QPAttr, verbs.QPAttrMask) {
	a := verbs.QPAttr{State: verbs.QPStateRTS, SQPSN: sqpsn}
	m := verbs.QPAttrState | verbs.QPAttrSQPSN
	if typ == verbs.QPTypeRC {
		a.Timeout = p.timeout
		a.RetryCnt = p.retryCnt
		a.RNRRetry = p.rnrRetry
		a.MaxRdAtomic = p.rdAtomic
		m |= verbs.QPAttrTimeout | verbs.QPAttrRetryCnt | verbs.QPAttrRNRRetry | verbs.QPAttrMaxQPRdAtomic
	}
	return a, m
}

func mustModify(t testing.TB, qp verbs.QP, attr verbs.QPAttr, mask verbs.QPAttrMask) {
	t.Helper()
	if err := qp.Modify(&attr, mask); err != nil {
		t.Fatalf("QP %#x: %v → %v (mask %#x): %v", qp.QPN(), qp.State(), attr.State, uint32(mask), err)
	}
	if got := qp.State(); got != attr.State {
		t.Fatalf("QP %#x: state %v after a successful Modify to %v", qp.QPN(), got, attr.State)
	}
}

// moveTo moves qp to ERR or RESET (the transitions that need no attributes).
func moveTo(t testing.TB, qp verbs.QP, s verbs.QPState) {
	t.Helper()
	mustModify(t, qp, verbs.QPAttr{State: s}, verbs.QPAttrState)
}

// GID returns the device's GID at GIDIndex.
func GID(t testing.TB, dev verbs.Device) verbs.GID {
	t.Helper()
	g, err := dev.GID(GIDIndex)
	if err != nil {
		t.Fatalf("GID(%d): %v", GIDIndex, err)
	}
	return g
}

// Connect takes two RC or UC QPs in RESET, a on devA and b on devB, to RTS
// connected to each other: both RESET→INIT, both INIT→RTR, then both
// RTR→RTS, each with exactly the attribute mask libibverbs requires.
func Connect(t testing.TB, a, b verbs.QP, devA, devB verbs.Device, o ConnectOptions) {
	t.Helper()
	typ := a.Type()
	if b.Type() != typ || (typ != verbs.QPTypeRC && typ != verbs.QPTypeUC) {
		t.Fatalf("Connect: QP types %v and %v, want two RC or two UC", typ, b.Type())
	}
	p := o.resolve(t, a, b, devA, devB)
	gidA, gidB := GID(t, devA), GID(t, devB)
	ia, im := initAttr(typ, p.access, 0)
	mustModify(t, a, ia, im)
	mustModify(t, b, ia, im)
	ra, rm := rtrAttr(typ, p, gidB, b.QPN(), p.psnB)
	mustModify(t, a, ra, rm)
	ra, rm = rtrAttr(typ, p, gidA, a.QPN(), p.psnA)
	mustModify(t, b, ra, rm)
	sa, sm := rtsAttr(typ, p, p.psnA)
	mustModify(t, a, sa, sm)
	sa, sm = rtsAttr(typ, p, p.psnB)
	mustModify(t, b, sa, sm)
}

// ToRTSUD takes a UD QP in RESET to RTS with Q_Key qkey.
func ToRTSUD(t testing.TB, qp verbs.QP, qkey uint32) {
	t.Helper()
	if qp.Type() != verbs.QPTypeUD {
		t.Fatalf("ToRTSUD: QP type %v", qp.Type())
	}
	var p connParams
	ia, im := initAttr(verbs.QPTypeUD, 0, qkey)
	mustModify(t, qp, ia, im)
	ra, rm := rtrAttr(verbs.QPTypeUD, p, verbs.GID{}, 0, 0)
	mustModify(t, qp, ra, rm)
	sa, sm := rtsAttr(verbs.QPTypeUD, p, psnFor(0, qp.QPN()))
	mustModify(t, qp, sa, sm)
}

// DefaultCap is the QP capacity NewPair uses for fields left zero.
var DefaultCap = verbs.QPCap{MaxSendWR: 128, MaxRecvWR: 128, MaxSendSGE: 4, MaxRecvSGE: 4}

// Pair is two QPs on two devices, each side with its own PD and one CQ for
// both its send and receive completions.
type Pair struct {
	DevA, DevB verbs.Device
	PDA, PDB   verbs.PD
	CQA, CQB   verbs.CQ
	A, B       verbs.QP
}

// PairConfig says how NewPair builds a Pair.
type PairConfig struct {
	Type      verbs.QPType // RC (the default) or UC
	Cap       verbs.QPCap  // zero fields take DefaultCap's
	SigAll    bool
	CQE       int // CQ size; zero is 1024
	Connect   ConnectOptions
	NoConnect bool // leave both QPs in RESET
}

// NewPair creates a Pair on devA and devB and, unless cfg.NoConnect,
// connects it. Every object is closed at the end of the test.
func NewPair(t testing.TB, devA, devB verbs.Device, cfg PairConfig) *Pair {
	t.Helper()
	typ := cfg.Type
	if typ == 0 {
		typ = verbs.QPTypeRC
	}
	cqe := cfg.CQE
	if cqe == 0 {
		cqe = 1024
	}
	c := cfg.Cap
	c.MaxSendWR = cmpOr(c.MaxSendWR, DefaultCap.MaxSendWR)
	c.MaxRecvWR = cmpOr(c.MaxRecvWR, DefaultCap.MaxRecvWR)
	c.MaxSendSGE = cmpOr(c.MaxSendSGE, DefaultCap.MaxSendSGE)
	c.MaxRecvSGE = cmpOr(c.MaxRecvSGE, DefaultCap.MaxRecvSGE)
	p := &Pair{DevA: devA, DevB: devB}
	p.PDA, p.PDB = AllocPD(t, devA), AllocPD(t, devB)
	p.CQA, p.CQB = CreateCQ(t, devA, cqe), CreateCQ(t, devB, cqe)
	p.A = CreateQP(t, p.PDA, verbs.QPInitAttr{Type: typ, SendCQ: p.CQA, RecvCQ: p.CQA, Cap: c, SigAll: cfg.SigAll})
	p.B = CreateQP(t, p.PDB, verbs.QPInitAttr{Type: typ, SendCQ: p.CQB, RecvCQ: p.CQB, Cap: c, SigAll: cfg.SigAll})
	if !cfg.NoConnect {
		Connect(t, p.A, p.B, devA, devB, cfg.Connect)
	}
	return p
}

func cmpOr(v, def uint32) uint32 {
	if v == 0 {
		return def
	}
	return v
}

// closeLater closes c when the test ends; a test may close it first.
func closeLater(t testing.TB, what string, c interface{ Close() error }) {
	t.Cleanup(func() {
		if err := c.Close(); err != nil && !errors.Is(err, verbs.ErrClosed) {
			t.Errorf("close %s: %v", what, err)
		}
	})
}

// AllocPD allocates a PD closed at the end of the test.
func AllocPD(t testing.TB, dev verbs.Device) verbs.PD {
	t.Helper()
	pd, err := dev.AllocPD()
	if err != nil {
		t.Fatalf("AllocPD: %v", err)
	}
	closeLater(t, "PD", pd)
	return pd
}

// CreateCQ creates a CQ of at least cqe entries, closed at the end of the test.
func CreateCQ(t testing.TB, dev verbs.Device, cqe int) verbs.CQ {
	t.Helper()
	cq, err := dev.CreateCQ(cqe)
	if err != nil {
		t.Fatalf("CreateCQ(%d): %v", cqe, err)
	}
	closeLater(t, "CQ", cq)
	return cq
}

// CreateQP creates a QP closed at the end of the test, and checks what a
// new QP must look like: RESET, its type, a QPN that fits 24 bits and is
// not one of the special QPs 0 and 1, and at least the capacity asked for.
func CreateQP(t testing.TB, pd verbs.PD, attr verbs.QPInitAttr) verbs.QP {
	t.Helper()
	qp, err := pd.CreateQP(&attr)
	if err != nil {
		t.Fatalf("CreateQP(%v): %v", attr.Type, err)
	}
	closeLater(t, "QP", qp)
	if s := qp.State(); s != verbs.QPStateReset {
		t.Errorf("new QP in state %v, want RESET", s)
	}
	if qp.Type() != attr.Type {
		t.Errorf("new QP has type %v, want %v", qp.Type(), attr.Type)
	}
	if n := qp.QPN(); n < 2 || n >= 1<<24 {
		t.Errorf("QPN %#x: want 2 ≤ QPN < 2^24", n)
	}
	q := qp.Query()
	if q.State != verbs.QPStateReset {
		t.Errorf("new QP: Query().State %v, want RESET", q.State)
	}
	c := q.Cap
	if c.MaxSendWR < attr.Cap.MaxSendWR || c.MaxSendSGE < attr.Cap.MaxSendSGE ||
		c.MaxInlineData < attr.Cap.MaxInlineData ||
		(attr.SRQ == nil && (c.MaxRecvWR < attr.Cap.MaxRecvWR || c.MaxRecvSGE < attr.Cap.MaxRecvSGE)) {
		t.Errorf("new QP: Query().Cap %+v is less than created with %+v", c, attr.Cap)
	}
	return qp
}

// CreateSRQ creates an SRQ closed at the end of the test.
func CreateSRQ(t testing.TB, pd verbs.PD, attr verbs.SRQInitAttr) verbs.SRQ {
	t.Helper()
	srq, err := pd.CreateSRQ(&attr)
	if err != nil {
		t.Fatalf("CreateSRQ: %v", err)
	}
	closeLater(t, "SRQ", srq)
	return srq
}

// CreateAH creates an address handle to dst's GID, closed at the end of the
// test.
func CreateAH(t testing.TB, pd verbs.PD, dst verbs.Device) verbs.AH {
	t.Helper()
	a := ahTo(GID(t, dst))
	ah, err := pd.CreateAH(&a)
	if err != nil {
		t.Fatalf("CreateAH: %v", err)
	}
	closeLater(t, "AH", ah)
	return ah
}

// RegMR registers size bytes with access, closed at the end of the test, and
// checks that Bytes and Addr describe the same memory.
func RegMR(t testing.TB, pd verbs.PD, size int, access verbs.Access) verbs.MR {
	t.Helper()
	mr, err := pd.RegMR(size, access)
	if err != nil {
		t.Fatalf("RegMR(%d, %#x): %v", size, uint32(access), err)
	}
	closeLater(t, "MR", mr)
	if b := mr.Bytes(); len(b) != size || mr.Addr() != verbs.AddrOf(b) {
		t.Fatalf("MR: len(Bytes()) %d, Addr %#x, AddrOf(Bytes()) %#x; want %d bytes at Addr", len(b), mr.Addr(), verbs.AddrOf(b), size)
	}
	return mr
}

// SGE is n bytes of mr from offset off.
func SGE(mr verbs.MR, off, n int) verbs.SGE {
	return verbs.SGE{Addr: mr.Addr() + uint64(off), Length: uint32(n), LKey: mr.LKey()}
}

// SendWR returns a signaled work request; RDMA and UD fields are the
// caller's to set.
func SendWR(wrid uint64, op verbs.WROpcode, sg ...verbs.SGE) verbs.SendWR {
	w := verbs.SendWR{WRID: wrid, Opcode: op, Flags: verbs.SendSignaled, NumSGE: uint8(len(sg))}
	copy(w.SG[:], sg)
	return w
}

// RDMAWR returns a signaled RDMA work request for the remote address raddr
// under rkey.
func RDMAWR(wrid uint64, op verbs.WROpcode, raddr uint64, rkey uint32, sg ...verbs.SGE) verbs.SendWR {
	w := SendWR(wrid, op, sg...)
	w.RemoteAddr, w.RKey = raddr, rkey
	return w
}

// UDWR returns a signaled UD send to QP qpn behind ah with Q_Key qkey.
func UDWR(wrid uint64, ah verbs.AH, qpn, qkey uint32, sg ...verbs.SGE) verbs.SendWR {
	w := SendWR(wrid, verbs.WRSend, sg...)
	w.AH, w.RemoteQPN, w.RemoteQKey = ah.Handle(), qpn, qkey
	return w
}

// RecvWR returns a receive work request.
func RecvWR(wrid uint64, sg ...verbs.SGE) verbs.RecvWR {
	w := verbs.RecvWR{WRID: wrid, NumSGE: uint8(len(sg))}
	copy(w.SG[:], sg)
	return w
}

// MustPostSend posts wrs and fails the test unless all were accepted.
func MustPostSend(t testing.TB, qp verbs.QP, wrs ...verbs.SendWR) {
	t.Helper()
	if n, err := qp.PostSend(wrs); err != nil || n != len(wrs) {
		t.Fatalf("QP %#x (%v): PostSend accepted %d of %d: %v", qp.QPN(), qp.State(), n, len(wrs), err)
	}
}

// MustPostRecv posts wrs and fails the test unless all were accepted.
func MustPostRecv(t testing.TB, qp verbs.QP, wrs ...verbs.RecvWR) {
	t.Helper()
	if n, err := qp.PostRecv(wrs); err != nil || n != len(wrs) {
		t.Fatalf("QP %#x (%v): PostRecv accepted %d of %d: %v", qp.QPN(), qp.State(), n, len(wrs), err)
	}
}

// MustPostSRQ posts wrs to srq and fails the test unless all were accepted.
func MustPostSRQ(t testing.TB, srq verbs.SRQ, wrs ...verbs.RecvWR) {
	t.Helper()
	if n, err := srq.PostRecv(wrs); err != nil || n != len(wrs) {
		t.Fatalf("SRQ: PostRecv accepted %d of %d: %v", n, len(wrs), err)
	}
}

// expectRefused fails the test unless a post returned an error matching
// target after accepting exactly n work requests.
func expectRefused(t testing.TB, what string, n int, err error, wantN int, target error) {
	t.Helper()
	if err == nil || !errors.Is(err, target) || n != wantN {
		t.Errorf("%s: accepted %d, error %v; want %d accepted and an error matching %q", what, n, err, wantN, target)
	}
}

// expectModifyRefused fails the test unless Modify fails with ErrInvalid
// and leaves the QP in the state it was in.
func expectModifyRefused(t testing.TB, what string, qp verbs.QP, attr verbs.QPAttr, mask verbs.QPAttrMask) {
	t.Helper()
	before := qp.State()
	err := qp.Modify(&attr, mask)
	if !errors.Is(err, verbs.ErrInvalid) {
		t.Errorf("%s: Modify returned %v, want an error matching ErrInvalid", what, err)
	}
	if s := qp.State(); s != before {
		t.Errorf("%s: a refused Modify moved the QP from %v to %v", what, before, s)
		if before == verbs.QPStateReset {
			// Put it back, so the steps after this one still test something.
			_ = qp.Modify(&verbs.QPAttr{State: verbs.QPStateReset}, verbs.QPAttrState)
		}
	}
}

// isAny reports whether err matches one of targets.
func isAny(err error, targets ...error) bool {
	for _, target := range targets {
		if errors.Is(err, target) {
			return true
		}
	}
	return false
}
