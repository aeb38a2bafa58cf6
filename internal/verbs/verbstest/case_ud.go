package verbstest

import (
	"fmt"
	"slices"
	"testing"

	"github.com/rdmavisor/rdmavisor/internal/verbs"
)

// udSide is one device's end of a UD test: a PD, one CQ, a UD QP in RTS.
type udSide struct {
	pd verbs.PD
	cq verbs.CQ
	qp verbs.QP
}

func newUD(t testing.TB, dev verbs.Device, qkey uint32) udSide {
	t.Helper()
	pd := AllocPD(t, dev)
	cq := CreateCQ(t, dev, 256)
	return udSide{pd: pd, cq: cq, qp: newUDQP(t, pd, cq, qkey)}
}

func newUDQP(t testing.TB, pd verbs.PD, cq verbs.CQ, qkey uint32) verbs.QP {
	t.Helper()
	qp := CreateQP(t, pd, verbs.QPInitAttr{Type: verbs.QPTypeUD, SendCQ: cq, RecvCQ: cq, Cap: DefaultCap})
	ToRTSUD(t, qp, qkey)
	return qp
}

// udMTU is the largest UD payload between devs: the smaller active MTU.
func udMTU(t testing.TB, devs ...verbs.Device) int {
	t.Helper()
	m := 0
	for i, d := range devs {
		b := d.Attr().ActiveMTU.Bytes()
		if b == 0 {
			t.Fatalf("device %d: ActiveMTU %v", i, d.Attr().ActiveMTU)
		}
		if m == 0 || b < m {
			m = b
		}
	}
	return m
}

// testUDSendRecv: a UD receive gets GRHSize bytes of GRH space at the head
// of its scatter list and the payload after it, WCWithGRH, the sender's QPN
// in SrcQP, and ByteLen = payload + 40; with immediate it also gets
// WCWithImm. The GRH may go to an SGE of its own. A payload of exactly the
// active MTU is delivered.
func testUDSendRecv(t *testing.T, f Factory) {
	devs := openDevices(t, f, 2, Options{})
	const qkeyA, qkeyB = 0x0BADF00D, 0x12345678
	a := newUD(t, devs[0], qkeyA)
	a2 := newUDQP(t, a.pd, a.cq, qkeyA)
	b := newUD(t, devs[1], qkeyB)
	ah := CreateAH(t, a.pd, devs[1])
	mtu := udMTU(t, devs...)
	t.Logf("active MTU %d bytes", mtu)
	src := RegMR(t, a.pd, 8192, local)
	Fill(src.Bytes(), 41)
	slot := verbs.GRHSize + mtu
	dst := RegMR(t, b.pd, 3*slot, local)
	grh := RegMR(t, b.pd, verbs.GRHSize, local)
	dst2 := RegMR(t, b.pd, mtu, local)
	Fill(dst.Bytes(), 0xD5)
	before := slices.Clone(dst.Bytes())
	MustPostRecv(t, b.qp,
		RecvWR(10, SGE(dst, 0, slot)),
		RecvWR(11, SGE(dst, slot, slot)),
		RecvWR(12, SGE(dst, 2*slot, slot)),
		RecvWR(13, SGE(grh, 0, verbs.GRHSize), SGE(dst2, 0, mtu)))

	w2 := UDWR(2, ah, b.qp.QPN(), qkeyB)
	w2.Opcode, w2.ImmData = verbs.WRSendWithImm, 0x600DF00D
	MustPostSend(t, a.qp, UDWR(1, ah, b.qp.QPN(), qkeyB, SGE(src, 0, 100)), w2)
	CheckWCs(t, WaitCQ(t, a.cq, 2, waitDone),
		verbs.WC{WRID: 1, Opcode: verbs.WCSend, QPN: a.qp.QPN()},
		verbs.WC{WRID: 2, Opcode: verbs.WCSend, QPN: a.qp.QPN()})
	CheckWCs(t, WaitCQ(t, b.cq, 2, waitDone),
		verbs.WC{WRID: 10, Opcode: verbs.WCRecv, Flags: verbs.WCWithGRH, ByteLen: 100 + verbs.GRHSize, QPN: b.qp.QPN(), SrcQP: a.qp.QPN()},
		verbs.WC{WRID: 11, Opcode: verbs.WCRecv, Flags: verbs.WCWithGRH | verbs.WCWithImm, ImmData: 0x600DF00D, ByteLen: verbs.GRHSize, QPN: b.qp.QPN(), SrcQP: a.qp.QPN()})
	expectBytes(t, "UD payload after the GRH space", dst.Bytes()[verbs.GRHSize:verbs.GRHSize+100], src.Bytes()[:100])
	expectBytes(t, "UD receive buffer past the payload", dst.Bytes()[verbs.GRHSize+100:slot], before[verbs.GRHSize+100:slot])

	MustPostSend(t, a2, UDWR(3, ah, b.qp.QPN(), qkeyB, SGE(src, 0, mtu)))
	CheckWCs(t, WaitCQ(t, a.cq, 1, waitDone), verbs.WC{WRID: 3, Opcode: verbs.WCSend, QPN: a2.QPN()})
	CheckWCs(t, WaitCQ(t, b.cq, 1, waitDone),
		verbs.WC{WRID: 12, Opcode: verbs.WCRecv, Flags: verbs.WCWithGRH, ByteLen: uint32(mtu + verbs.GRHSize), QPN: b.qp.QPN(), SrcQP: a2.QPN()})
	off := 2*slot + verbs.GRHSize
	expectBytes(t, "UD payload of one MTU", dst.Bytes()[off:off+mtu], src.Bytes()[:mtu])

	MustPostSend(t, a.qp, UDWR(4, ah, b.qp.QPN(), qkeyB, SGE(src, 1000, 200)))
	CheckWCs(t, WaitCQ(t, a.cq, 1, waitDone), verbs.WC{WRID: 4, Opcode: verbs.WCSend, QPN: a.qp.QPN()})
	CheckWCs(t, WaitCQ(t, b.cq, 1, waitDone),
		verbs.WC{WRID: 13, Opcode: verbs.WCRecv, Flags: verbs.WCWithGRH, ByteLen: 200 + verbs.GRHSize, QPN: b.qp.QPN(), SrcQP: a.qp.QPN()})
	expectBytes(t, "UD payload after a GRH-only SGE", dst2.Bytes()[:200], src.Bytes()[1000:1200])
	ExpectIdle(t, b.cq, waitIdle)
}

// testUDRejectsOversize: a UD send longer than the sender's active MTU is
// refused by PostSend with ErrInvalid, as bad_wr: the WRs before it are
// posted and delivered, it and those after it are not. A payload of exactly
// the MTU still passes.
func testUDRejectsOversize(t *testing.T, f Factory) {
	devs := openDevices(t, f, 2, Options{})
	const qkey = 0x2468ACE
	a := newUD(t, devs[0], qkey)
	b := newUD(t, devs[1], qkey)
	ah := CreateAH(t, a.pd, devs[1])
	mtuA := devs[0].Attr().ActiveMTU.Bytes()
	mtu := udMTU(t, devs...)
	t.Logf("active MTU %d and %d bytes", mtuA, devs[1].Attr().ActiveMTU.Bytes())
	src := RegMR(t, a.pd, 8192, local)
	Fill(src.Bytes(), 42)
	slot := verbs.GRHSize + mtu
	dst := RegMR(t, b.pd, 2*slot, local)
	MustPostRecv(t, b.qp, RecvWR(10, SGE(dst, 0, slot)), RecvWR(11, SGE(dst, slot, slot)))

	n, err := a.qp.PostSend([]verbs.SendWR{
		UDWR(1, ah, b.qp.QPN(), qkey, SGE(src, 0, 100)),
		UDWR(2, ah, b.qp.QPN(), qkey, SGE(src, 0, mtuA+1)),
		UDWR(3, ah, b.qp.QPN(), qkey, SGE(src, 0, 50)),
	})
	expectRefused(t, fmt.Sprintf("UD send of %d bytes at active MTU %d", mtuA+1, mtuA), n, err, 1, verbs.ErrInvalid)
	CheckWCs(t, WaitCQ(t, a.cq, 1, waitDone), verbs.WC{WRID: 1, Opcode: verbs.WCSend, QPN: a.qp.QPN()})
	CheckWCs(t, WaitCQ(t, b.cq, 1, waitDone),
		verbs.WC{WRID: 10, Opcode: verbs.WCRecv, Flags: verbs.WCWithGRH, ByteLen: 100 + verbs.GRHSize, QPN: b.qp.QPN(), SrcQP: a.qp.QPN()})
	ExpectIdle(t, a.cq, waitIdle)
	ExpectIdle(t, b.cq, 0)

	MustPostSend(t, a.qp, UDWR(4, ah, b.qp.QPN(), qkey, SGE(src, 0, mtu)))
	CheckWCs(t, WaitCQ(t, a.cq, 1, waitDone), verbs.WC{WRID: 4, Opcode: verbs.WCSend, QPN: a.qp.QPN()})
	CheckWCs(t, WaitCQ(t, b.cq, 1, waitDone),
		verbs.WC{WRID: 11, Opcode: verbs.WCRecv, Flags: verbs.WCWithGRH, ByteLen: uint32(mtu + verbs.GRHSize), QPN: b.qp.QPN(), SrcQP: a.qp.QPN()})
	expectBytes(t, "UD payload of one MTU", dst.Bytes()[slot+verbs.GRHSize:2*slot], src.Bytes()[:mtu])
}

// testUDQKeyMismatch: a datagram whose Q_Key differs from the receiver's is
// dropped silently: the sender's completion succeeds (UD has no ACKs), the
// receiver sees nothing, and the receive it would have used stays posted
// and serves the next good datagram.
func testUDQKeyMismatch(t *testing.T, f Factory) {
	devs := openDevices(t, f, 2, Options{})
	const qkey = 0x11223344
	a := newUD(t, devs[0], qkey)
	b := newUD(t, devs[1], qkey)
	ah := CreateAH(t, a.pd, devs[1])
	src := RegMR(t, a.pd, 4096, local)
	Fill(src.Bytes(), 43)
	dst := RegMR(t, b.pd, 8192, local)
	MustPostRecv(t, b.qp, RecvWR(20, SGE(dst, 0, 4096)), RecvWR(21, SGE(dst, 4096, 4096)))

	MustPostSend(t, a.qp, UDWR(1, ah, b.qp.QPN(), qkey^1, SGE(src, 0, 64)))
	CheckWCs(t, WaitCQ(t, a.cq, 1, waitDone), verbs.WC{WRID: 1, Opcode: verbs.WCSend, QPN: a.qp.QPN()})
	ExpectIdle(t, b.cq, waitIdle)

	MustPostSend(t, a.qp, UDWR(2, ah, b.qp.QPN(), qkey, SGE(src, 100, 64)))
	CheckWCs(t, WaitCQ(t, a.cq, 1, waitDone), verbs.WC{WRID: 2, Opcode: verbs.WCSend, QPN: a.qp.QPN()})
	CheckWCs(t, WaitCQ(t, b.cq, 1, waitDone),
		verbs.WC{WRID: 20, Opcode: verbs.WCRecv, Flags: verbs.WCWithGRH, ByteLen: 64 + verbs.GRHSize, QPN: b.qp.QPN(), SrcQP: a.qp.QPN()})
	expectBytes(t, "datagram with the right Q_Key", dst.Bytes()[verbs.GRHSize:verbs.GRHSize+64], src.Bytes()[100:164])

	// A datagram to a QPN the receiving device does not have is dropped too.
	MustPostSend(t, a.qp, UDWR(3, ah, b.qp.QPN()^0x800000, qkey, SGE(src, 0, 64)))
	CheckWCs(t, WaitCQ(t, a.cq, 1, waitDone), verbs.WC{WRID: 3, Opcode: verbs.WCSend, QPN: a.qp.QPN()})
	ExpectIdle(t, b.cq, waitIdle)
}
