package verbstest

import (
	"errors"
	"slices"
	"testing"

	"github.com/rdmavisor/rdmavisor/internal/verbs"
)

// Memory windows, type 2: the owner of a region registers it with local
// write and MW bind only (its own rkey grants nothing remotely) and lends a
// range of it to its peer through a window bound on the one QP the peer's
// requests arrive on. In these cases B owns the region and binds on p.B;
// A reads and writes through the window.

const (
	mwMRSize = 8192
	mwOff    = 1024 // the window's first byte in the region
	mwLen    = 4096
	mwMR     = verbs.AccessLocalWrite | verbs.AccessMWBind
	mwRW     = verbs.AccessRemoteRead | verbs.AccessRemoteWrite
)

// needMW skips a case on a device without type 2 windows.
func needMW(t *testing.T, dev verbs.Device) {
	t.Helper()
	if dev.Attr().MaxMW == 0 {
		t.Skip("not applicable: the device has no type 2 memory windows (MaxMW 0)")
	}
}

// AllocMW allocates a type 2 window, closed at the end of the test.
func AllocMW(t testing.TB, pd verbs.PD) verbs.MW {
	t.Helper()
	mw, err := pd.AllocMW()
	if err != nil {
		t.Fatalf("AllocMW: %v", err)
	}
	closeLater(t, "MW", mw)
	return mw
}

// NextMWKey is key with new low 8 bits, as ibv_inc_rkey makes them.
func NextMWKey(key uint32) uint32 { return key&^0xff | (key+1)&0xff }

// BindMWWR returns a signaled WRBindMW of mw to n bytes of mr from off,
// giving it key.
func BindMWWR(wrid uint64, mw verbs.MW, key uint32, mr verbs.MR, off, n int, access verbs.Access) verbs.SendWR {
	w := SendWR(wrid, verbs.WRBindMW, SGE(mr, off, n))
	w.MW, w.RKey, w.MWAccess = mw.Handle(), key, access
	return w
}

// LocalInvWR returns a signaled WRLocalInv of the window whose key is key.
func LocalInvWR(wrid uint64, key uint32) verbs.SendWR {
	w := SendWR(wrid, verbs.WRLocalInv)
	w.RKey = key
	return w
}

// BindMW binds mw on qp to n bytes of mr from off with a new key, waits for
// the completion on cq, and returns the key.
func BindMW(t testing.TB, qp verbs.QP, cq verbs.CQ, mw verbs.MW, mr verbs.MR, off, n int, access verbs.Access) uint32 {
	t.Helper()
	key := NextMWKey(mw.RKey())
	MustPostSend(t, qp, BindMWWR(900, mw, key, mr, off, n, access))
	CheckWCs(t, WaitCQ(t, cq, 1, waitDone), verbs.WC{WRID: 900, Status: verbs.WCSuccess, Opcode: verbs.WCBindMW, QPN: qp.QPN()})
	if got := mw.RKey(); got != key {
		t.Errorf("MW.RKey() %#x after a bind to %#x", got, key)
	}
	return key
}

// InvalidateMW invalidates the window with key on qp and waits for it.
func InvalidateMW(t testing.TB, qp verbs.QP, cq verbs.CQ, key uint32) {
	t.Helper()
	MustPostSend(t, qp, LocalInvWR(901, key))
	CheckWCs(t, WaitCQ(t, cq, 1, waitDone), verbs.WC{WRID: 901, Status: verbs.WCSuccess, Opcode: verbs.WCLocalInv, QPN: qp.QPN()})
}

// mwFixture is a pair, B's region (mwMR) and a window of it, and A's
// buffer.
type mwFixture struct {
	p       *Pair
	src, mr verbs.MR
	mw      verbs.MW
}

func newMWFixture(t *testing.T, devs []verbs.Device) *mwFixture {
	t.Helper()
	p := NewPair(t, devs[0], devs[1], PairConfig{})
	f := &mwFixture{p: p, src: RegMR(t, p.PDA, mwMRSize, local), mr: RegMR(t, p.PDB, mwMRSize, mwMR)}
	f.mw = AllocMW(t, p.PDB)
	Fill(f.src.Bytes(), 71)
	Fill(f.mr.Bytes(), 72)
	return f
}

// raddr is the remote address of window offset off.
func mwAddr(f *mwFixture, access verbs.Access, off int) uint64 {
	if access&verbs.AccessZeroBased != 0 {
		return uint64(off)
	}
	return f.mr.Addr() + mwOff + uint64(off)
}

// expectRemoteAccessErr posts one RDMA op on qp and expects it to fail
// with WCRemAccessErr, leaving the target untouched.
func expectRemoteAccessErr(t *testing.T, qp verbs.QP, cq verbs.CQ, op verbs.WROpcode, raddr uint64, rkey uint32, sg verbs.SGE, target verbs.MR) {
	t.Helper()
	before := slices.Clone(target.Bytes())
	MustPostSend(t, qp, RDMAWR(1, op, raddr, rkey, sg))
	CheckWCs(t, WaitCQ(t, cq, 1, waitDone), verbs.WC{WRID: 1, Status: verbs.WCRemAccessErr, QPN: qp.QPN()})
	WaitState(t, qp, verbs.QPStateErr, waitDone)
	expectBytes(t, "target region", target.Bytes(), before)
}

// testMWReadWrite: a window bound on B's QP, zero-based or at virtual
// addresses, carries A's RDMA WRITE and READ into and out of the bound
// range of a region whose own rkey grants no remote access.
func testMWReadWrite(t *testing.T, f Factory) {
	devs := openDevices(t, f, 2, Options{})
	needMW(t, devs[1])
	for _, c := range []struct {
		name   string
		access verbs.Access
	}{{"VA", mwRW}, {"ZeroBased", mwRW | verbs.AccessZeroBased}} {
		t.Run(c.name, func(t *testing.T) {
			x := newMWFixture(t, devs)
			p := x.p
			key := BindMW(t, p.B, p.CQB, x.mw, x.mr, mwOff, mwLen, c.access)
			if key == x.mr.RKey() {
				t.Errorf("window key %#x is the region's", key)
			}
			// Write 300 bytes at window offset 100, and the window's last byte.
			MustPostSend(t, p.A,
				RDMAWR(1, verbs.WRRDMAWrite, mwAddr(x, c.access, 100), key, SGE(x.src, 0, 300)),
				RDMAWR(2, verbs.WRRDMAWrite, mwAddr(x, c.access, mwLen-1), key, SGE(x.src, 500, 1)),
				RDMAWR(3, verbs.WRRDMARead, mwAddr(x, c.access, 0), key, SGE(x.src, 4096, mwLen)))
			CheckWCs(t, WaitCQ(t, p.CQA, 3, waitDone),
				verbs.WC{WRID: 1, Opcode: verbs.WCRDMAWrite, QPN: p.A.QPN()},
				verbs.WC{WRID: 2, Opcode: verbs.WCRDMAWrite, QPN: p.A.QPN()},
				verbs.WC{WRID: 3, Opcode: verbs.WCRDMARead, QPN: p.A.QPN()})
			b := x.mr.Bytes()
			expectBytes(t, "written range", b[mwOff+100:mwOff+400], x.src.Bytes()[:300])
			expectBytes(t, "window's last byte", b[mwOff+mwLen-1:mwOff+mwLen], x.src.Bytes()[500:501])
			expectBytes(t, "read window", x.src.Bytes()[4096:4096+mwLen], b[mwOff:mwOff+mwLen])
			if s := p.B.State(); s != verbs.QPStateRTS {
				t.Errorf("B's QP in %v after bind and access, want RTS", s)
			}
		})
	}
}

// testMWRefused: requests the window does not allow complete at A with
// WCRemAccessErr and change nothing: the region's own rkey (no remote
// access), the window's key on another QP between the same two PDs, a
// range outside the window (and its region), an access the bind did not grant, the key after
// WRLocalInv, the old key after a rebind (the new key works), and the key
// after MW.Close.
func testMWRefused(t *testing.T, f Factory) {
	devs := openDevices(t, f, 2, Options{})
	needMW(t, devs[1])
	for _, c := range mwRefusedCases {
		t.Run(c.name, func(t *testing.T) {
			x := newMWFixture(t, devs)
			key := BindMW(t, x.p.B, x.p.CQB, x.mw, x.mr, mwOff, mwLen, c.access)
			c.run(t, mwEnv{x, key})
		})
	}
}

// mwEnv is a testMWRefused case's: a fixture of its own, its window bound
// on B's QP with key.
type mwEnv struct {
	x   *mwFixture
	key uint32
}

// refused expects op from qp at raddr with key, 100 bytes, to fail with
// WCRemAccessErr and leave the region alone.
func (e mwEnv) refused(t *testing.T, qp verbs.QP, op verbs.WROpcode, raddr uint64, key uint32) {
	t.Helper()
	expectRemoteAccessErr(t, qp, e.x.p.CQA, op, raddr, key, SGE(e.x.src, 0, 100), e.x.mr)
}

// otherQP connects another RC QP pair between p's PDs, on p's CQs, and
// returns A's.
func otherQP(t *testing.T, p *Pair) verbs.QP {
	a2 := CreateQP(t, p.PDA, verbs.QPInitAttr{Type: verbs.QPTypeRC, SendCQ: p.CQA, RecvCQ: p.CQA, Cap: DefaultCap})
	b2 := CreateQP(t, p.PDB, verbs.QPInitAttr{Type: verbs.QPTypeRC, SendCQ: p.CQB, RecvCQ: p.CQB, Cap: DefaultCap})
	Connect(t, a2, b2, p.DevA, p.DevB, ConnectOptions{})
	return a2
}

// mwRefusedCases are testMWRefused's: each binds the window with access
// and runs.
var mwRefusedCases = []struct {
	name   string
	access verbs.Access
	run    func(t *testing.T, e mwEnv)
}{
	{"MRKeyWithoutRemoteAccess", mwRW, func(t *testing.T, e mwEnv) {
		e.refused(t, e.x.p.A, verbs.WRRDMAWrite, e.x.mr.Addr()+mwOff, e.x.mr.RKey())
	}},
	{"MRKeyReadWithoutRemoteAccess", mwRW, func(t *testing.T, e mwEnv) {
		e.refused(t, e.x.p.A, verbs.WRRDMARead, e.x.mr.Addr()+mwOff, e.x.mr.RKey())
	}},
	{"OtherQP", mwRW, func(t *testing.T, e mwEnv) {
		e.refused(t, otherQP(t, e.x.p), verbs.WRRDMAWrite, mwAddr(e.x, mwRW, 0), e.key)
	}},
	{"OtherQPRead", mwRW | verbs.AccessZeroBased, func(t *testing.T, e mwEnv) {
		e.refused(t, otherQP(t, e.x.p), verbs.WRRDMARead, 0, e.key)
	}},
	// The kernel's rxe checks a request against the window's region,
	// not the window (rxe_resp.c check_rkey), so these windows end
	// where the region does; the soft provider's own tests check
	// ranges inside the region but outside the window.
	{"PastWindowEnd", mwRW, func(t *testing.T, e mwEnv) {
		key := rebindAt(t, e.x, e.key, mwMRSize-mwLen, mwRW)
		e.refused(t, e.x.p.A, verbs.WRRDMAWrite, e.x.mr.Addr()+mwMRSize-10, key)
	}},
	{"ZeroBasedPastWindowEnd", mwRW, func(t *testing.T, e mwEnv) {
		key := rebindAt(t, e.x, e.key, mwMRSize-mwLen, mwRW|verbs.AccessZeroBased)
		e.refused(t, e.x.p.A, verbs.WRRDMARead, mwLen-10, key)
	}},
	{"BeforeWindowStart", mwRW, func(t *testing.T, e mwEnv) {
		key := rebindAt(t, e.x, e.key, 0, mwRW)
		e.refused(t, e.x.p.A, verbs.WRRDMAWrite, e.x.mr.Addr()-50, key)
	}},
	{"WriteToReadOnlyWindow", verbs.AccessRemoteRead, func(t *testing.T, e mwEnv) {
		e.refused(t, e.x.p.A, verbs.WRRDMAWrite, mwAddr(e.x, 0, 0), e.key)
	}},
	{"ReadFromWriteOnlyWindow", verbs.AccessRemoteWrite, func(t *testing.T, e mwEnv) {
		e.refused(t, e.x.p.A, verbs.WRRDMARead, mwAddr(e.x, 0, 0), e.key)
	}},
	{"AfterLocalInv", mwRW, func(t *testing.T, e mwEnv) {
		InvalidateMW(t, e.x.p.B, e.x.p.CQB, e.key)
		e.refused(t, e.x.p.A, verbs.WRRDMAWrite, mwAddr(e.x, mwRW, 0), e.key)
	}},
	{"OldKeyAfterRebind", mwRW, func(t *testing.T, e mwEnv) {
		p, x := e.x.p, e.x
		InvalidateMW(t, p.B, p.CQB, e.key)
		key2 := BindMW(t, p.B, p.CQB, x.mw, x.mr, 0, mwLen, mwRW|verbs.AccessZeroBased)
		if key2 == e.key || key2>>8 != e.key>>8 {
			t.Fatalf("rebind gave key %#x after %#x: want new low 8 bits only", key2, e.key)
		}
		MustPostSend(t, p.A, RDMAWR(2, verbs.WRRDMAWrite, 8, key2, SGE(x.src, 0, 64)))
		CheckWCs(t, WaitCQ(t, p.CQA, 1, waitDone), verbs.WC{WRID: 2, Opcode: verbs.WCRDMAWrite, QPN: p.A.QPN()})
		expectBytes(t, "written through the new key", x.mr.Bytes()[8:72], x.src.Bytes()[:64])
		e.refused(t, p.A, verbs.WRRDMAWrite, mwAddr(x, mwRW, 0), e.key)
	}},
	{"AfterMWClose", mwRW, func(t *testing.T, e mwEnv) {
		if err := e.x.mw.Close(); err != nil {
			t.Fatalf("MW.Close of a bound window: %v", err)
		}
		e.refused(t, e.x.p.A, verbs.WRRDMAWrite, mwAddr(e.x, mwRW, 0), e.key)
	}},
}

// rebindAt invalidates the window bound with key and binds it again to
// mwLen bytes of the region from off; it returns the new key.
func rebindAt(t *testing.T, x *mwFixture, key uint32, off int, access verbs.Access) uint32 {
	t.Helper()
	InvalidateMW(t, x.p.B, x.p.CQB, key)
	return BindMW(t, x.p.B, x.p.CQB, x.mw, x.mr, off, mwLen, access)
}

// testMWBindErrors: a bind the device refuses completes with WCMWBindErr
// and moves the QP to ERR, flushing the WR after it: the window already
// bound, a region without MW bind access, zero length, a range outside the
// region, and remote write on a region without local write. (A key whose
// low 8 bits do not change is not refused by rxe, and is not tested.)
func testMWBindErrors(t *testing.T, f Factory) {
	devs := openDevices(t, f, 2, Options{})
	needMW(t, devs[1])
	cases := []struct {
		name string
		wr   func(t *testing.T, x *mwFixture) verbs.SendWR
	}{
		{"AlreadyBound", func(t *testing.T, x *mwFixture) verbs.SendWR {
			BindMW(t, x.p.B, x.p.CQB, x.mw, x.mr, 0, 100, mwRW)
			return BindMWWR(1, x.mw, NextMWKey(x.mw.RKey()), x.mr, 200, 100, mwRW)
		}},
		{"MRWithoutMWBind", func(t *testing.T, x *mwFixture) verbs.SendWR {
			mr := RegMR(t, x.p.PDB, mwMRSize, local)
			return BindMWWR(1, x.mw, NextMWKey(x.mw.RKey()), mr, 0, 100, mwRW)
		}},
		{"ZeroLength", func(t *testing.T, x *mwFixture) verbs.SendWR {
			return BindMWWR(1, x.mw, NextMWKey(x.mw.RKey()), x.mr, 0, 0, mwRW)
		}},
		{"PastMREnd", func(t *testing.T, x *mwFixture) verbs.SendWR {
			return BindMWWR(1, x.mw, NextMWKey(x.mw.RKey()), x.mr, mwMRSize-100, 200, mwRW)
		}},
		{"RemoteWriteWithoutLocalWrite", func(t *testing.T, x *mwFixture) verbs.SendWR {
			mr := RegMR(t, x.p.PDB, mwMRSize, verbs.AccessMWBind)
			return BindMWWR(1, x.mw, NextMWKey(x.mw.RKey()), mr, 0, 100, verbs.AccessRemoteWrite)
		}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			x := newMWFixture(t, devs)
			failsLocally(t, x, c.wr(t, x), verbs.WCMWBindErr)
		})
	}
}

// failsLocally posts wr (WRID 1) and a send behind it on the fixture's
// QP B, and checks that wr completes with st, the send is flushed and the
// QP goes to ERR.
func failsLocally(t *testing.T, x *mwFixture, wr verbs.SendWR, st verbs.WCStatus) {
	t.Helper()
	p := x.p
	MustPostSend(t, p.B, wr, SendWR(2, verbs.WRSend, SGE(x.mr, 0, 10)))
	CheckWCs(t, WaitCQ(t, p.CQB, 2, waitDone),
		verbs.WC{WRID: 1, Status: st, QPN: p.B.QPN()},
		verbs.WC{WRID: 2, Status: verbs.WCWRFlushErr, QPN: p.B.QPN()})
	WaitState(t, p.B, verbs.QPStateErr, waitDone)
}

// testMWLocalInvErrors: a WRLocalInv whose key is no bound window's (a
// key never given, or the window's key before its last bind) completes
// with WCLocQPOpErr (rxe_do_local_ops) and moves the QP to ERR.
func testMWLocalInvErrors(t *testing.T, f Factory) {
	devs := openDevices(t, f, 2, Options{})
	needMW(t, devs[1])
	for _, c := range []struct {
		name string
		key  func(bound uint32) uint32
	}{
		{"BadKey", badKey},
		{"OldKey", func(bound uint32) uint32 { return bound&^0xff | (bound-1)&0xff }},
	} {
		t.Run(c.name, func(t *testing.T) {
			x := newMWFixture(t, devs)
			p := x.p
			key := BindMW(t, p.B, p.CQB, x.mw, x.mr, 0, 100, mwRW)
			failsLocally(t, x, LocalInvWR(1, c.key(key)), verbs.WCLocQPOpErr)
		})
	}
}

// testMWLifetime: a region with a bound window is not deregistered
// (ErrBusy) until the window is invalidated; the PD is busy while a window
// of it is allocated; binds and invalidates are refused at post on a UD QP
// and when the region is another PD's.
func testMWLifetime(t *testing.T, f Factory) {
	devs := openDevices(t, f, 2, Options{})
	needMW(t, devs[1])
	x := newMWFixture(t, devs)
	p := x.p
	key := BindMW(t, p.B, p.CQB, x.mw, x.mr, 0, 100, mwRW)
	if err := x.mr.Close(); !errors.Is(err, verbs.ErrBusy) {
		t.Fatalf("MR.Close with a bound window: %v, want ErrBusy", err)
	}
	// The region still works through the window.
	MustPostSend(t, p.A, RDMAWR(1, verbs.WRRDMAWrite, x.mr.Addr()+10, key, SGE(x.src, 0, 20)))
	CheckWCs(t, WaitCQ(t, p.CQA, 1, waitDone), verbs.WC{WRID: 1, Opcode: verbs.WCRDMAWrite, QPN: p.A.QPN()})
	expectBytes(t, "written after a refused Close", x.mr.Bytes()[10:30], x.src.Bytes()[:20])
	InvalidateMW(t, p.B, p.CQB, key)
	if err := x.mr.Close(); err != nil {
		t.Fatalf("MR.Close after the window's invalidation: %v", err)
	}

	other := RegMR(t, AllocPD(t, devs[1]), mwMRSize, mwMR)
	wr := BindMWWR(2, x.mw, NextMWKey(x.mw.RKey()), other, 0, 100, mwRW)
	n, err := p.B.PostSend([]verbs.SendWR{wr})
	expectRefused(t, "bind to an MR of another PD", n, err, 0, verbs.ErrInvalid)

	ud := CreateQP(t, p.PDB, verbs.QPInitAttr{Type: verbs.QPTypeUD, SendCQ: p.CQB, RecvCQ: p.CQB, Cap: DefaultCap})
	ToRTSUD(t, ud, 0x1234)
	mr := RegMR(t, p.PDB, mwMRSize, mwMR)
	n, err = ud.PostSend([]verbs.SendWR{BindMWWR(3, x.mw, NextMWKey(x.mw.RKey()), mr, 0, 100, mwRW)})
	expectRefused(t, "bind on a UD QP", n, err, 0, verbs.ErrInvalid)
	n, err = ud.PostSend([]verbs.SendWR{LocalInvWR(4, key)})
	expectRefused(t, "local invalidate on a UD QP", n, err, 0, verbs.ErrInvalid)
	ExpectIdle(t, p.CQB, waitIdle)
}
