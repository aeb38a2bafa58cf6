package verbstest

import (
	"fmt"
	"slices"
	"testing"

	"github.com/rdmavisor/rdmavisor/internal/verbs"
)

const (
	local  = verbs.AccessLocalWrite
	remote = verbs.AccessLocalWrite | verbs.AccessRemoteWrite | verbs.AccessRemoteRead
)

// testRCSendRecv: sends of 1 byte to several MTUs each land in the next
// receive, in order, byte-exact, with nothing written past the message; the
// requester sees WCSend, the responder WCRecv with the length.
func testRCSendRecv(t *testing.T, f Factory) {
	devs := openDevices(t, f, 2, Options{})
	p := NewPair(t, devs[0], devs[1], PairConfig{})
	sizes := []int{1, 1000, 4000, 9000}
	const slot = 12 << 10
	src := RegMR(t, p.PDA, len(sizes)*slot, local)
	dst := RegMR(t, p.PDB, len(sizes)*slot, local)
	Fill(dst.Bytes(), 0xD5)
	before := slices.Clone(dst.Bytes())
	var recvs []verbs.RecvWR
	var sends []verbs.SendWR
	for i, n := range sizes {
		Fill(src.Bytes()[i*slot:i*slot+n], uint64(100+i))
		recvs = append(recvs, RecvWR(uint64(200+i), SGE(dst, i*slot, slot)))
		sends = append(sends, SendWR(uint64(100+i), verbs.WRSend, SGE(src, i*slot, n)))
	}
	MustPostRecv(t, p.B, recvs...)
	MustPostSend(t, p.A, sends...)
	sw := WaitCQ(t, p.CQA, len(sizes), waitDone)
	rw := WaitCQ(t, p.CQB, len(sizes), waitDone)
	for i, n := range sizes {
		CheckWC(t, sw[i], verbs.WC{WRID: uint64(100 + i), Opcode: verbs.WCSend, QPN: p.A.QPN()})
		CheckWC(t, rw[i], verbs.WC{WRID: uint64(200 + i), Opcode: verbs.WCRecv, ByteLen: uint32(n), QPN: p.B.QPN()})
		buf := dst.Bytes()[i*slot : (i+1)*slot]
		expectBytes(t, fmt.Sprintf("message %d (%d bytes)", i, n), buf[:n], Pattern(n, uint64(100+i)))
		expectBytes(t, fmt.Sprintf("receive buffer %d past the message", i), buf[n:], before[i*slot+n:(i+1)*slot])
	}
	ExpectIdle(t, p.CQA, waitIdle)
	ExpectIdle(t, p.CQB, waitIdle)
}

// testRCSendWithImm: the responder's WCRecv carries WCWithImm and the
// immediate in host order; an immediate of 0 is still flagged, and a
// zero-length send with immediate completes with ByteLen 0.
func testRCSendWithImm(t *testing.T, f Factory) {
	devs := openDevices(t, f, 2, Options{})
	p := NewPair(t, devs[0], devs[1], PairConfig{})
	src := RegMR(t, p.PDA, 4096, local)
	dst := RegMR(t, p.PDB, 8192, local)
	Fill(src.Bytes()[:100], 3)
	MustPostRecv(t, p.B, RecvWR(10, SGE(dst, 0, 4096)), RecvWR(11, SGE(dst, 4096, 4096)))
	w1 := SendWR(1, verbs.WRSendWithImm, SGE(src, 0, 100))
	w1.ImmData = 0xDEADBEEF
	w2 := SendWR(2, verbs.WRSendWithImm)
	w2.ImmData = 0
	MustPostSend(t, p.A, w1, w2)
	CheckWCs(t, WaitCQ(t, p.CQA, 2, waitDone),
		verbs.WC{WRID: 1, Opcode: verbs.WCSend, QPN: p.A.QPN()},
		verbs.WC{WRID: 2, Opcode: verbs.WCSend, QPN: p.A.QPN()})
	CheckWCs(t, WaitCQ(t, p.CQB, 2, waitDone),
		verbs.WC{WRID: 10, Opcode: verbs.WCRecv, Flags: verbs.WCWithImm, ImmData: 0xDEADBEEF, ByteLen: 100, QPN: p.B.QPN()},
		verbs.WC{WRID: 11, Opcode: verbs.WCRecv, Flags: verbs.WCWithImm, ImmData: 0, ByteLen: 0, QPN: p.B.QPN()})
	expectBytes(t, "payload", dst.Bytes()[:100], Pattern(100, 3))
}

// testRCWrite: an RDMA write lands byte-exact at the remote address and
// nowhere else, completes WCRDMAWrite at the requester, and produces no
// completion and consumes no receive at the responder. A send posted after a
// write is delivered after the write's data is visible.
func testRCWrite(t *testing.T, f Factory) {
	devs := openDevices(t, f, 2, Options{})
	p := NewPair(t, devs[0], devs[1], PairConfig{})
	src := RegMR(t, p.PDA, 16<<10, local)
	dst := RegMR(t, p.PDB, 16<<10, remote)
	rbuf := RegMR(t, p.PDB, 4096, local)
	Fill(dst.Bytes(), 0xD5)
	before := slices.Clone(dst.Bytes())
	MustPostRecv(t, p.B, RecvWR(50, SGE(rbuf, 0, 4096)))

	Fill(src.Bytes()[:3000], 7)
	MustPostSend(t, p.A, RDMAWR(1, verbs.WRRDMAWrite, dst.Addr()+100, dst.RKey(), SGE(src, 0, 3000)))
	CheckWCs(t, WaitCQ(t, p.CQA, 1, waitDone), verbs.WC{WRID: 1, Opcode: verbs.WCRDMAWrite, QPN: p.A.QPN()})
	expectBytes(t, "written range", dst.Bytes()[100:3100], Pattern(3000, 7))
	expectBytes(t, "before the written range", dst.Bytes()[:100], before[:100])
	expectBytes(t, "after the written range", dst.Bytes()[3100:], before[3100:])
	ExpectIdle(t, p.CQB, waitIdle)

	// Write then send in one batch: when the send's receive completes, the
	// write's data is in place (RC executes a QP's requests in order). The
	// receive posted before the first write is the one consumed now.
	Fill(src.Bytes()[4096:12096], 8)
	MustPostSend(t, p.A,
		RDMAWR(2, verbs.WRRDMAWrite, dst.Addr()+4096, dst.RKey(), SGE(src, 4096, 8000)),
		SendWR(3, verbs.WRSend, SGE(src, 0, 8)))
	CheckWCs(t, WaitCQ(t, p.CQB, 1, waitDone), verbs.WC{WRID: 50, Opcode: verbs.WCRecv, ByteLen: 8, QPN: p.B.QPN()})
	expectBytes(t, "write followed by a send", dst.Bytes()[4096:12096], Pattern(8000, 8))
	CheckWCs(t, WaitCQ(t, p.CQA, 2, waitDone),
		verbs.WC{WRID: 2, Opcode: verbs.WCRDMAWrite, QPN: p.A.QPN()},
		verbs.WC{WRID: 3, Opcode: verbs.WCSend, QPN: p.A.QPN()})
}

// testRCWriteWithImm: the responder consumes one receive (even one with no
// scatter list) and gets WCRecvRDMAWithImm with WCWithImm, the immediate
// and ByteLen = the write's length; the data lands at the remote address,
// not in the receive buffer. The requester sees WCRDMAWrite. A zero-length
// write with immediate needs no valid rkey (IBTA C9-88).
func testRCWriteWithImm(t *testing.T, f Factory) {
	devs := openDevices(t, f, 2, Options{})
	p := NewPair(t, devs[0], devs[1], PairConfig{})
	src := RegMR(t, p.PDA, 8192, local)
	dst := RegMR(t, p.PDB, 8192, remote)
	rbuf := RegMR(t, p.PDB, 4096, local)
	Fill(rbuf.Bytes(), 0xD5)
	rbefore := slices.Clone(rbuf.Bytes())
	MustPostRecv(t, p.B, RecvWR(60), RecvWR(61, SGE(rbuf, 0, 4096)))

	Fill(src.Bytes()[:5000], 9)
	w := RDMAWR(1, verbs.WRRDMAWriteWithImm, dst.Addr(), dst.RKey(), SGE(src, 0, 5000))
	w.ImmData = 0x01020304
	MustPostSend(t, p.A, w)
	CheckWCs(t, WaitCQ(t, p.CQA, 1, waitDone), verbs.WC{WRID: 1, Opcode: verbs.WCRDMAWrite, QPN: p.A.QPN()})
	CheckWCs(t, WaitCQ(t, p.CQB, 1, waitDone),
		verbs.WC{WRID: 60, Opcode: verbs.WCRecvRDMAWithImm, Flags: verbs.WCWithImm, ImmData: 0x01020304, ByteLen: 5000, QPN: p.B.QPN()})
	expectBytes(t, "written range", dst.Bytes()[:5000], Pattern(5000, 9))

	w = RDMAWR(2, verbs.WRRDMAWriteWithImm, 0, 0)
	w.ImmData = 0xFFFFFFFF
	MustPostSend(t, p.A, w)
	CheckWCs(t, WaitCQ(t, p.CQA, 1, waitDone), verbs.WC{WRID: 2, Opcode: verbs.WCRDMAWrite, QPN: p.A.QPN()})
	CheckWCs(t, WaitCQ(t, p.CQB, 1, waitDone),
		verbs.WC{WRID: 61, Opcode: verbs.WCRecvRDMAWithImm, Flags: verbs.WCWithImm, ImmData: 0xFFFFFFFF, ByteLen: 0, QPN: p.B.QPN()})
	expectBytes(t, "receive buffer of a write with immediate", rbuf.Bytes(), rbefore)
	ExpectIdle(t, p.CQB, waitIdle)
}

// testRCRead: several reads posted in one batch (more than the read depth
// of 1, so the requester must queue them) complete in order with
// WCRDMARead, each byte-exact into its local range and nowhere else; the
// responder sees no completion.
func testRCRead(t *testing.T, f Factory) {
	devs := openDevices(t, f, 2, Options{})
	p := NewPair(t, devs[0], devs[1], PairConfig{})
	dst := RegMR(t, p.PDA, 16<<10, local)
	src := RegMR(t, p.PDB, 16<<10, remote)
	Fill(src.Bytes(), 11)
	Fill(dst.Bytes(), 0xD5)
	want := slices.Clone(dst.Bytes())
	reads := []struct{ roff, loff, n int }{{0, 0, 1}, {10, 100, 1000}, {2000, 2000, 3000}, {8000, 6000, 5000}}
	var wrs []verbs.SendWR
	var wcs []verbs.WC
	for i, r := range reads {
		wrs = append(wrs, RDMAWR(uint64(i+1), verbs.WRRDMARead, src.Addr()+uint64(r.roff), src.RKey(), SGE(dst, r.loff, r.n)))
		wcs = append(wcs, verbs.WC{WRID: uint64(i + 1), Opcode: verbs.WCRDMARead, QPN: p.A.QPN()})
		copy(want[r.loff:r.loff+r.n], src.Bytes()[r.roff:r.roff+r.n])
	}
	MustPostSend(t, p.A, wrs...)
	CheckWCs(t, WaitCQ(t, p.CQA, len(wrs), waitDone), wcs...)
	expectBytes(t, "local memory after the reads", dst.Bytes(), want)
	ExpectIdle(t, p.CQB, waitIdle)
}

// testRCScatterGather: a send gathered from three SGEs in two MRs scatters
// over four receive SGEs in order; a write gathers from two SGEs into one
// remote range; a read scatters one remote range over three SGEs.
func testRCScatterGather(t *testing.T, f Factory) {
	devs := openDevices(t, f, 2, Options{})
	p := NewPair(t, devs[0], devs[1], PairConfig{})
	a1 := RegMR(t, p.PDA, 8192, local)
	a2 := RegMR(t, p.PDA, 8192, local)
	b := RegMR(t, p.PDB, 16<<10, remote)
	Fill(a1.Bytes(), 21)
	Fill(a2.Bytes(), 22)
	Fill(b.Bytes(), 0xD5)
	want := slices.Clone(b.Bytes())

	// Send: 100 + 700 + 1 = 801 bytes over receive SGEs of 100, 1, 500, 3000.
	msg := slices.Concat(a1.Bytes()[10:110], a2.Bytes()[1000:1700], a1.Bytes()[5000:5001])
	copy(want[0:100], msg[0:100])
	copy(want[200:201], msg[100:101])
	copy(want[300:800], msg[101:601])
	copy(want[1000:1200], msg[601:801])
	MustPostRecv(t, p.B, RecvWR(30, SGE(b, 0, 100), SGE(b, 200, 1), SGE(b, 300, 500), SGE(b, 1000, 3000)))
	MustPostSend(t, p.A, SendWR(1, verbs.WRSend, SGE(a1, 10, 100), SGE(a2, 1000, 700), SGE(a1, 5000, 1)))
	CheckWCs(t, WaitCQ(t, p.CQA, 1, waitDone), verbs.WC{WRID: 1, Opcode: verbs.WCSend, QPN: p.A.QPN()})
	CheckWCs(t, WaitCQ(t, p.CQB, 1, waitDone), verbs.WC{WRID: 30, Opcode: verbs.WCRecv, ByteLen: 801, QPN: p.B.QPN()})
	expectBytes(t, "scattered receive", b.Bytes(), want)

	// Write: gather 3000 + 2000 bytes into b[8192:13192].
	copy(want[8192:], a2.Bytes()[0:3000])
	copy(want[11192:], a1.Bytes()[4000:6000])
	MustPostSend(t, p.A, RDMAWR(2, verbs.WRRDMAWrite, b.Addr()+8192, b.RKey(), SGE(a2, 0, 3000), SGE(a1, 4000, 2000)))
	CheckWCs(t, WaitCQ(t, p.CQA, 1, waitDone), verbs.WC{WRID: 2, Opcode: verbs.WCRDMAWrite, QPN: p.A.QPN()})
	expectBytes(t, "gathered write", b.Bytes(), want)

	// Read: b[8192:13192] scattered over a1[0:1], a2[4096:8096], a1[7000:7999].
	awant1, awant2 := slices.Clone(a1.Bytes()), slices.Clone(a2.Bytes())
	copy(awant1[0:1], want[8192:8193])
	copy(awant2[4096:8096], want[8193:12193])
	copy(awant1[7000:7999], want[12193:13192])
	MustPostSend(t, p.A, RDMAWR(3, verbs.WRRDMARead, b.Addr()+8192, b.RKey(), SGE(a1, 0, 1), SGE(a2, 4096, 4000), SGE(a1, 7000, 999)))
	CheckWCs(t, WaitCQ(t, p.CQA, 1, waitDone), verbs.WC{WRID: 3, Opcode: verbs.WCRDMARead, QPN: p.A.QPN()})
	expectBytes(t, "first MR after the scattered read", a1.Bytes(), awant1)
	expectBytes(t, "second MR after the scattered read", a2.Bytes(), awant2)
	ExpectIdle(t, p.CQB, waitIdle)
}

// testRCZeroLength: zero-length sends (no SGE, or one SGE of length 0)
// complete with ByteLen 0, into a receive with or without an SGE, writing
// nothing; zero-length writes and reads succeed without a valid rkey or
// address (IBTA C9-88) and the write gives the responder no completion.
func testRCZeroLength(t *testing.T, f Factory) {
	devs := openDevices(t, f, 2, Options{})
	p := NewPair(t, devs[0], devs[1], PairConfig{})
	src := RegMR(t, p.PDA, 4096, local)
	dst := RegMR(t, p.PDB, 4096, local)
	Fill(dst.Bytes(), 0xD5)
	before := slices.Clone(dst.Bytes())
	MustPostRecv(t, p.B, RecvWR(70, SGE(dst, 0, 4096)), RecvWR(71), RecvWR(72, SGE(dst, 0, 64)))
	MustPostSend(t, p.A,
		SendWR(1, verbs.WRSend),
		SendWR(2, verbs.WRSend),
		SendWR(3, verbs.WRSend, SGE(src, 0, 0)),
		RDMAWR(4, verbs.WRRDMAWrite, 0, 0),
		RDMAWR(5, verbs.WRRDMARead, 0, 0))
	CheckWCs(t, WaitCQ(t, p.CQA, 5, waitDone),
		verbs.WC{WRID: 1, Opcode: verbs.WCSend, QPN: p.A.QPN()},
		verbs.WC{WRID: 2, Opcode: verbs.WCSend, QPN: p.A.QPN()},
		verbs.WC{WRID: 3, Opcode: verbs.WCSend, QPN: p.A.QPN()},
		verbs.WC{WRID: 4, Opcode: verbs.WCRDMAWrite, QPN: p.A.QPN()},
		verbs.WC{WRID: 5, Opcode: verbs.WCRDMARead, QPN: p.A.QPN()})
	CheckWCs(t, WaitCQ(t, p.CQB, 3, waitDone),
		verbs.WC{WRID: 70, Opcode: verbs.WCRecv, ByteLen: 0, QPN: p.B.QPN()},
		verbs.WC{WRID: 71, Opcode: verbs.WCRecv, ByteLen: 0, QPN: p.B.QPN()},
		verbs.WC{WRID: 72, Opcode: verbs.WCRecv, ByteLen: 0, QPN: p.B.QPN()})
	expectBytes(t, "receive buffer of zero-length sends", dst.Bytes(), before)
	ExpectIdle(t, p.CQB, waitIdle)
}

// testRCInline: inline data is copied when PostSend returns (the source may
// be overwritten at once) and its L_Key is not checked, for sends and
// writes; inline data longer than the QP's MaxInlineData is refused with
// ErrInvalid.
func testRCInline(t *testing.T, f Factory) {
	devs := openDevices(t, f, 2, Options{})
	p := NewPair(t, devs[0], devs[1], PairConfig{Cap: verbs.QPCap{MaxInlineData: 64}})
	src := RegMR(t, p.PDA, 8192, local)
	dst := RegMR(t, p.PDB, 4096, remote)
	rbuf := RegMR(t, p.PDB, 4096, local)
	MustPostRecv(t, p.B, RecvWR(10, SGE(rbuf, 0, 4096)))

	Fill(src.Bytes()[:60], 5)
	w := SendWR(1, verbs.WRSend, SGE(src, 0, 60))
	w.Flags |= verbs.SendInline
	w.SG[0].LKey = 0
	MustPostSend(t, p.A, w)
	Fill(src.Bytes()[:60], 6)

	Fill(src.Bytes()[64:128], 7)
	w = RDMAWR(2, verbs.WRRDMAWrite, dst.Addr()+100, dst.RKey(), SGE(src, 64, 64))
	w.Flags |= verbs.SendInline
	w.SG[0].LKey = 0
	MustPostSend(t, p.A, w)
	Fill(src.Bytes()[64:128], 8)

	CheckWCs(t, WaitCQ(t, p.CQA, 2, waitDone),
		verbs.WC{WRID: 1, Opcode: verbs.WCSend, QPN: p.A.QPN()},
		verbs.WC{WRID: 2, Opcode: verbs.WCRDMAWrite, QPN: p.A.QPN()})
	CheckWCs(t, WaitCQ(t, p.CQB, 1, waitDone), verbs.WC{WRID: 10, Opcode: verbs.WCRecv, ByteLen: 60, QPN: p.B.QPN()})
	expectBytes(t, "inline send", rbuf.Bytes()[:60], Pattern(60, 5))
	expectBytes(t, "inline write", dst.Bytes()[100:164], Pattern(64, 7))

	limit := int(p.A.Query().Cap.MaxInlineData)
	if limit+1 > len(src.Bytes()) {
		t.Logf("MaxInlineData %d: not checking the refusal of longer inline data", limit)
		return
	}
	w = SendWR(3, verbs.WRSend, SGE(src, 0, limit+1))
	w.Flags |= verbs.SendInline
	n, err := p.A.PostSend([]verbs.SendWR{w})
	expectRefused(t, fmt.Sprintf("inline send of %d bytes with MaxInlineData %d", limit+1, limit), n, err, 0, verbs.ErrInvalid)
	ExpectIdle(t, p.CQA, waitIdle)
}

// testRC1MiB: at path MTU mtu, a 1 MiB send, write and read are byte-exact,
// with the first PSNs just below 2^24 so each message wraps the PSN space.
func testRC1MiB(mtu verbs.MTU) func(*testing.T, Factory) {
	return func(t *testing.T, f Factory) {
		devs := openDevices(t, f, 2, Options{})
		for i, d := range devs {
			if m := d.Attr().MaxMTU; m < mtu {
				t.Fatalf("device %d: MaxMTU %v; the suite requires path MTU %v", i, m, mtu)
			}
		}
		p := NewPair(t, devs[0], devs[1], PairConfig{Connect: ConnectOptions{MTU: mtu, PSNA: 0xFFFFC0, PSNB: 0xFFFFFF}})
		if got := p.A.Query().PathMTU; got != mtu {
			t.Errorf("Query().PathMTU %v, want %v", got, mtu)
		}
		const size = 1 << 20
		a := RegMR(t, p.PDA, size, remote)
		b := RegMR(t, p.PDB, size, remote)

		Fill(a.Bytes(), 1)
		MustPostRecv(t, p.B, RecvWR(1, SGE(b, 0, size)))
		MustPostSend(t, p.A, SendWR(2, verbs.WRSend, SGE(a, 0, size)))
		CheckWCs(t, WaitCQ(t, p.CQA, 1, waitDone), verbs.WC{WRID: 2, Opcode: verbs.WCSend, QPN: p.A.QPN()})
		CheckWCs(t, WaitCQ(t, p.CQB, 1, waitDone), verbs.WC{WRID: 1, Opcode: verbs.WCRecv, ByteLen: size, QPN: p.B.QPN()})
		if err := Check(b.Bytes(), 1); err != nil {
			t.Errorf("1 MiB send: %v", err)
		}

		Fill(a.Bytes(), 2)
		MustPostSend(t, p.A, RDMAWR(3, verbs.WRRDMAWrite, b.Addr(), b.RKey(), SGE(a, 0, size)))
		CheckWCs(t, WaitCQ(t, p.CQA, 1, waitDone), verbs.WC{WRID: 3, Opcode: verbs.WCRDMAWrite, QPN: p.A.QPN()})
		if err := Check(b.Bytes(), 2); err != nil {
			t.Errorf("1 MiB write: %v", err)
		}

		Fill(b.Bytes(), 3)
		clear(a.Bytes())
		MustPostSend(t, p.A, RDMAWR(4, verbs.WRRDMARead, b.Addr(), b.RKey(), SGE(a, 0, size)))
		CheckWCs(t, WaitCQ(t, p.CQA, 1, waitDone), verbs.WC{WRID: 4, Opcode: verbs.WCRDMARead, QPN: p.A.QPN()})
		if err := Check(a.Bytes(), 3); err != nil {
			t.Errorf("1 MiB read: %v", err)
		}
		ExpectIdle(t, p.CQB, waitIdle)
	}
}

// testUnsignaled: with SigAll false, unsignaled sends produce no completion
// and a later signaled one does; an unsignaled WR that fails still
// completes (with its error). With SigAll, every WR completes.
func testUnsignaled(t *testing.T, f Factory) {
	devs := openDevices(t, f, 2, Options{})
	p := NewPair(t, devs[0], devs[1], PairConfig{})
	src := RegMR(t, p.PDA, 4096, local)
	dst := RegMR(t, p.PDB, 4096, local)
	var recvs []verbs.RecvWR
	var wants []verbs.WC
	for i := range 4 {
		recvs = append(recvs, RecvWR(uint64(10+i), SGE(dst, i*1024, 1024)))
		wants = append(wants, verbs.WC{WRID: uint64(10 + i), Opcode: verbs.WCRecv, ByteLen: 16, QPN: p.B.QPN()})
	}
	MustPostRecv(t, p.B, recvs...)
	wrs := []verbs.SendWR{
		SendWR(1, verbs.WRSend, SGE(src, 0, 16)),
		SendWR(2, verbs.WRSend, SGE(src, 0, 16)),
		SendWR(3, verbs.WRSend, SGE(src, 0, 16)),
		SendWR(4, verbs.WRSend, SGE(src, 0, 16)),
	}
	for i := range 3 {
		wrs[i].Flags = 0
	}
	MustPostSend(t, p.A, wrs...)
	CheckWCs(t, WaitCQ(t, p.CQB, 4, waitDone), wants...)
	CheckWCs(t, WaitCQ(t, p.CQA, 1, waitDone), verbs.WC{WRID: 4, Opcode: verbs.WCSend, QPN: p.A.QPN()})
	ExpectIdle(t, p.CQA, waitIdle)

	bad := RDMAWR(5, verbs.WRRDMAWrite, dst.Addr(), dst.RKey()^0x00FFFF00, SGE(src, 0, 8))
	bad.Flags = 0
	MustPostSend(t, p.A, bad)
	CheckWCs(t, WaitCQ(t, p.CQA, 1, waitDone), verbs.WC{WRID: 5, Status: verbs.WCRemAccessErr, QPN: p.A.QPN()})

	q := NewPair(t, devs[0], devs[1], PairConfig{SigAll: true})
	src = RegMR(t, q.PDA, 4096, local)
	dst = RegMR(t, q.PDB, 4096, local)
	MustPostRecv(t, q.B, RecvWR(10, SGE(dst, 0, 1024)), RecvWR(11, SGE(dst, 1024, 1024)))
	w1, w2 := SendWR(1, verbs.WRSend, SGE(src, 0, 16)), SendWR(2, verbs.WRSend, SGE(src, 0, 16))
	w1.Flags, w2.Flags = 0, 0
	MustPostSend(t, q.A, w1, w2)
	CheckWCs(t, WaitCQ(t, q.CQA, 2, waitDone),
		verbs.WC{WRID: 1, Opcode: verbs.WCSend, QPN: q.A.QPN()},
		verbs.WC{WRID: 2, Opcode: verbs.WCSend, QPN: q.A.QPN()})
	WaitCQ(t, q.CQB, 2, waitDone)
}

// testUCSendWrite: on a perfect network UC delivers sends, writes and
// writes with immediate like RC: WCSend/WCRDMAWrite at the requester,
// WCRecv and WCRecvRDMAWithImm at the responder, byte-exact.
func testUCSendWrite(t *testing.T, f Factory) {
	devs := openDevices(t, f, 2, Options{})
	p := NewPair(t, devs[0], devs[1], PairConfig{Type: verbs.QPTypeUC})
	src := RegMR(t, p.PDA, 16<<10, local)
	dst := RegMR(t, p.PDB, 16<<10, remote)
	rbuf := RegMR(t, p.PDB, 8192, local)
	Fill(src.Bytes(), 31)
	MustPostRecv(t, p.B, RecvWR(10, SGE(rbuf, 0, 8192)), RecvWR(11))
	w := RDMAWR(3, verbs.WRRDMAWriteWithImm, dst.Addr()+8192, dst.RKey(), SGE(src, 8192, 3000))
	w.ImmData = 0xA5A5
	MustPostSend(t, p.A,
		SendWR(1, verbs.WRSend, SGE(src, 0, 5000)),
		RDMAWR(2, verbs.WRRDMAWrite, dst.Addr(), dst.RKey(), SGE(src, 0, 6000)),
		w)
	CheckWCs(t, WaitCQ(t, p.CQA, 3, waitDone),
		verbs.WC{WRID: 1, Opcode: verbs.WCSend, QPN: p.A.QPN()},
		verbs.WC{WRID: 2, Opcode: verbs.WCRDMAWrite, QPN: p.A.QPN()},
		verbs.WC{WRID: 3, Opcode: verbs.WCRDMAWrite, QPN: p.A.QPN()})
	CheckWCs(t, WaitCQ(t, p.CQB, 2, waitDone),
		verbs.WC{WRID: 10, Opcode: verbs.WCRecv, ByteLen: 5000, QPN: p.B.QPN()},
		verbs.WC{WRID: 11, Opcode: verbs.WCRecvRDMAWithImm, Flags: verbs.WCWithImm, ImmData: 0xA5A5, ByteLen: 3000, QPN: p.B.QPN()})
	expectBytes(t, "UC send", rbuf.Bytes()[:5000], src.Bytes()[:5000])
	expectBytes(t, "UC write", dst.Bytes()[:6000], src.Bytes()[:6000])
	expectBytes(t, "UC write with immediate", dst.Bytes()[8192:11192], src.Bytes()[8192:11192])
}
