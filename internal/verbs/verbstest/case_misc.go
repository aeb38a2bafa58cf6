package verbstest

import (
	"errors"
	"testing"

	"github.com/rdmavisor/rdmavisor/internal/verbs"
)

// testSRQShared: three RC QPs on one device share an SRQ; sends from three
// peers are each received in order on the QP connected to their sender
// (WC.QPN), consuming SRQ receives first-in first-out. A QP with an SRQ
// refuses QP.PostRecv with ErrInvalid, and an SRQ in use refuses Close with
// ErrBusy. A QP of the SRQ that goes to ERR does not flush the SRQ's
// receives: the other QPs keep consuming them.
func testSRQShared(t *testing.T, f Factory) {
	x := newSRQShared(t, openDevices(t, f, 4, Options{}))
	n, err := x.clients[0].server.PostRecv([]verbs.RecvWR{RecvWR(1, SGE(x.rbuf, 0, 8))})
	expectRefused(t, "QP.PostRecv on a QP with an SRQ", n, err, 0, verbs.ErrInvalid)

	for c := range x.clients {
		x.send(c, 0, 10)
	}
	x.check(WaitCQ(t, x.cq, 30, waitDone))
	for i := range 30 {
		if !x.used[uint64(1000+i)] {
			t.Errorf("SRQ receive %d was not consumed while later ones were: an SRQ is first-in first-out", 1000+i)
		}
	}
	ExpectIdle(t, x.cq, waitIdle)
	if err := x.srq.Close(); !errors.Is(err, verbs.ErrBusy) {
		t.Errorf("SRQ.Close with QPs attached: %v, want ErrBusy", err)
	}

	moveTo(t, x.clients[0].server, verbs.QPStateErr)
	ExpectIdle(t, x.cq, waitIdle)
	x.send(1, 10, 15)
	x.send(2, 10, 15)
	x.check(WaitCQ(t, x.cq, 10, waitDone))
	for i := 30; i < 40; i++ {
		if !x.used[uint64(1000+i)] {
			t.Errorf("SRQ receive %d was not consumed after a QP of the SRQ went to ERR", 1000+i)
		}
	}
	ExpectIdle(t, x.cq, waitIdle)
}

// srqShared is testSRQShared's fixture: a server device whose RC QPs, one
// per client device, share an SRQ with srqPosted receives of srqSlot bytes
// each in rbuf.
type srqShared struct {
	t       *testing.T
	cq      verbs.CQ
	srq     verbs.SRQ
	rbuf    verbs.MR
	clients []srqClient
	next    []int           // the message each client's server QP receives next
	used    map[uint64]bool // the SRQ receives consumed
}

type srqClient struct {
	cq         verbs.CQ
	qp, server verbs.QP
	buf        verbs.MR
}

const srqSlot, srqPosted = 256, 48

func newSRQShared(t *testing.T, devs []verbs.Device) *srqShared {
	srv := devs[0]
	pd := AllocPD(t, srv)
	x := &srqShared{t: t, cq: CreateCQ(t, srv, 1024), used: map[uint64]bool{}}
	x.srq = CreateSRQ(t, pd, verbs.SRQInitAttr{MaxWR: 64, MaxSGE: 1})
	x.rbuf = RegMR(t, pd, srqPosted*srqSlot, local)
	var recvs []verbs.RecvWR
	for i := range srqPosted {
		recvs = append(recvs, RecvWR(uint64(1000+i), SGE(x.rbuf, i*srqSlot, srqSlot)))
	}
	MustPostSRQ(t, x.srq, recvs...)
	for _, dev := range devs[1:] {
		cpd := AllocPD(t, dev)
		ccq := CreateCQ(t, dev, 256)
		cqp := CreateQP(t, cpd, verbs.QPInitAttr{Type: verbs.QPTypeRC, SendCQ: ccq, RecvCQ: ccq, Cap: DefaultCap})
		sqp := CreateQP(t, pd, verbs.QPInitAttr{Type: verbs.QPTypeRC, SendCQ: x.cq, RecvCQ: x.cq, SRQ: x.srq,
			Cap: verbs.QPCap{MaxSendWR: 16, MaxSendSGE: 1}})
		Connect(t, cqp, sqp, dev, srv, ConnectOptions{})
		x.clients = append(x.clients, srqClient{cq: ccq, qp: cqp, server: sqp, buf: RegMR(t, cpd, 4096, local)})
	}
	x.next = make([]int, len(x.clients))
	return x
}

// srqMsgLen is the length of message seq of client c.
func srqMsgLen(c, seq int) int { return 20 + 10*c + seq }

// srqMessage is message seq of client c: byte 0 is c, byte 1 is seq, then
// a pattern.
func srqMessage(c, seq int) []byte {
	b := Pattern(srqMsgLen(c, seq), uint64(c<<16|seq))
	b[0], b[1] = byte(c), byte(seq)
	return b
}

// send sends client c's messages from to to, and waits for their
// completions.
func (x *srqShared) send(c, from, to int) {
	t := x.t
	t.Helper()
	cl := x.clients[c]
	var wrs []verbs.SendWR
	var wants []verbs.WC
	for seq := from; seq < to; seq++ {
		off := (seq % 16) * 256
		copy(cl.buf.Bytes()[off:], srqMessage(c, seq))
		wrs = append(wrs, SendWR(uint64(seq), verbs.WRSend, SGE(cl.buf, off, srqMsgLen(c, seq))))
		wants = append(wants, verbs.WC{WRID: uint64(seq), Opcode: verbs.WCSend, QPN: cl.qp.QPN()})
	}
	MustPostSend(t, cl.qp, wrs...)
	CheckWCs(t, WaitCQ(t, cl.cq, len(wrs), waitDone), wants...)
}

// check checks the server's receive completions wcs: each consumed an SRQ
// receive not consumed before, on the QP of the client whose message it
// holds, in the client's order.
func (x *srqShared) check(wcs []verbs.WC) {
	t := x.t
	t.Helper()
	for _, wc := range wcs {
		if wc.Status != verbs.WCSuccess || wc.Opcode != verbs.WCRecv || wc.ByteLen < 2 || wc.ByteLen > srqSlot {
			t.Errorf("SRQ completion %s", FormatWC(wc))
			continue
		}
		if wc.WRID < 1000 || wc.WRID >= 1000+srqPosted || x.used[wc.WRID] {
			t.Errorf("completion %s: wr_id is not an SRQ receive not yet consumed", FormatWC(wc))
			continue
		}
		x.used[wc.WRID] = true
		i := int(wc.WRID - 1000)
		got := x.rbuf.Bytes()[i*srqSlot : i*srqSlot+int(wc.ByteLen)]
		c, seq := int(got[0]), int(got[1])
		if c >= len(x.clients) || seq != x.next[c] {
			t.Errorf("completion %s holds message %d of client %d; want message %d", FormatWC(wc), seq, c, x.next[min(c, len(x.next)-1)])
			continue
		}
		x.next[c]++
		if wc.QPN != x.clients[c].server.QPN() {
			t.Errorf("message from client %d completed on QP %#x, want %#x", c, wc.QPN, x.clients[c].server.QPN())
		}
		expectBytes(t, "SRQ receive", got, srqMessage(c, seq))
	}
}

// testCQNotify: the completion channel. Unarmed, a completion raises no
// event. ReqNotify arms the CQ: the next completion makes FD readable and
// AckEvents consumes the event(s); one arming gives one event however many
// completions follow, and the CQ is disarmed after it. Armed for solicited
// completions only, an unsolicited receive raises nothing and a solicited
// one (SendSolicited) does.
func testCQNotify(t *testing.T, f Factory) {
	x := newCQNotify(t, openDevices(t, f, 2, Options{}))
	cq, fd := x.cq, x.fd
	x.send(false)
	WaitCQ(t, cq, 1, waitDone)
	if fdReadable(t, fd, waitIdle) {
		t.Errorf("FD readable after a completion on a CQ never armed")
	}
	x.ack("never armed", 0)

	x.arm(false)
	if fdReadable(t, fd, 0) {
		t.Errorf("FD readable right after ReqNotify, before any new completion")
	}
	x.send(false)
	if !fdReadable(t, fd, waitDone) {
		t.Fatalf("FD not readable within %v of a completion on an armed CQ", waitDone)
	}
	WaitCQ(t, cq, 1, waitDone)
	if n, err := cq.AckEvents(); err != nil || n < 1 {
		t.Errorf("AckEvents() after an event = %d, %v; want ≥ 1", n, err)
	}
	if fdReadable(t, fd, 0) {
		t.Errorf("FD still readable after AckEvents")
	}

	x.arm(false)
	x.send(false)
	x.send(false)
	if !fdReadable(t, fd, waitDone) {
		t.Fatalf("FD not readable within %v of completions on an armed CQ", waitDone)
	}
	WaitCQ(t, cq, 2, waitDone)
	x.ack("two completions after one ReqNotify", 1)

	x.send(false)
	WaitCQ(t, cq, 1, waitDone)
	if fdReadable(t, fd, waitIdle) {
		t.Errorf("FD readable after a completion on a CQ whose one event was consumed and not re-armed")
	}
	x.ack("not re-armed", 0)
	x.solicitedOnly()
}

// cqNotify is testCQNotify's fixture: a pair whose B side has 16 receives
// posted, and its CQ's completion channel.
type cqNotify struct {
	t   *testing.T
	p   *Pair
	src verbs.MR
	cq  verbs.CQ // B's
	fd  int
	id  uint64 // the next send's wr_id
}

func newCQNotify(t *testing.T, devs []verbs.Device) *cqNotify {
	p := NewPair(t, devs[0], devs[1], PairConfig{})
	x := &cqNotify{t: t, p: p, src: RegMR(t, p.PDA, 4096, local), cq: p.CQB}
	dst := RegMR(t, p.PDB, 16*64, local)
	var recvs []verbs.RecvWR
	for i := range 16 {
		recvs = append(recvs, RecvWR(uint64(i), SGE(dst, i*64, 64)))
	}
	MustPostRecv(t, p.B, recvs...)
	x.fd = x.cq.FD()
	if x.fd < 0 {
		t.Fatalf("CQ.FD() = %d", x.fd)
	}
	return x
}

// send sends one message from A, solicited or not, and waits for its
// completion.
func (x *cqNotify) send(solicited bool) {
	x.t.Helper()
	w := SendWR(x.id, verbs.WRSend, SGE(x.src, 0, 8))
	if solicited {
		w.Flags |= verbs.SendSolicited
	}
	x.id++
	MustPostSend(x.t, x.p.A, w)
	WaitCQ(x.t, x.p.CQA, 1, waitDone)
}

// ack acknowledges the CQ's events, which should be want.
func (x *cqNotify) ack(what string, want int) {
	x.t.Helper()
	if n, err := x.cq.AckEvents(); err != nil || n != want {
		x.t.Errorf("%s: AckEvents() = %d, %v; want %d", what, n, err, want)
	}
}

func (x *cqNotify) arm(solicitedOnly bool) {
	x.t.Helper()
	if err := x.cq.ReqNotify(solicitedOnly); err != nil {
		x.t.Fatalf("ReqNotify(%v): %v", solicitedOnly, err)
	}
}

// solicitedOnly: armed for solicited completions only, an unsolicited
// receive raises nothing and a solicited one does.
func (x *cqNotify) solicitedOnly() {
	t, cq, fd := x.t, x.cq, x.fd
	x.arm(true)
	x.send(false)
	WaitCQ(t, cq, 1, waitDone)
	if fdReadable(t, fd, waitIdle) {
		t.Errorf("FD readable after an unsolicited receive on a CQ armed for solicited completions")
	}
	x.send(true)
	if !fdReadable(t, fd, waitDone) {
		t.Fatalf("FD not readable within %v of a solicited receive on a CQ armed for solicited completions", waitDone)
	}
	CheckWCs(t, WaitCQ(t, cq, 1, waitDone), verbs.WC{WRID: 6, Opcode: verbs.WCRecv, ByteLen: 8, QPN: x.p.B.QPN()})
	x.ack("solicited", 1)
}

// testCloseOrder: Close fails with ErrBusy while dependents exist (PD with
// MRs, QPs, SRQs, AHs; CQ and SRQ with QPs; device with PDs and CQs), as
// ibv_dealloc_pd and friends do with EBUSY; in dependency order everything
// closes; a second Close, and any use of a closed object, fails with
// ErrClosed.
func testCloseOrder(t *testing.T, f Factory) {
	dev := openDevices(t, f, 1, Options{})[0]
	pd := AllocPD(t, dev)
	cq := CreateCQ(t, dev, 16)
	srq := CreateSRQ(t, pd, verbs.SRQInitAttr{MaxWR: 16, MaxSGE: 1})
	qp := CreateQP(t, pd, verbs.QPInitAttr{Type: verbs.QPTypeRC, SendCQ: cq, RecvCQ: cq, SRQ: srq,
		Cap: verbs.QPCap{MaxSendWR: 16, MaxSendSGE: 1}})
	mr := RegMR(t, pd, 4096, local)
	ah := CreateAH(t, pd, dev)
	want := func(what string, err, target error) {
		t.Helper()
		if target == nil && err != nil {
			t.Errorf("%s: %v", what, err)
		} else if target != nil && !errors.Is(err, target) {
			t.Errorf("%s: %v, want an error matching %q", what, err, target)
		}
	}
	want("PD.Close with an MR, a QP, an SRQ and an AH", pd.Close(), verbs.ErrBusy)
	want("CQ.Close with a QP", cq.Close(), verbs.ErrBusy)
	want("SRQ.Close with a QP", srq.Close(), verbs.ErrBusy)
	want("Device.Close with a PD and a CQ", dev.Close(), verbs.ErrBusy)

	want("QP.Close", qp.Close(), nil)
	want("QP.Close again", qp.Close(), verbs.ErrClosed)
	_, err := qp.PostSend([]verbs.SendWR{SendWR(1, verbs.WRSend, SGE(mr, 0, 8))})
	want("PostSend on a closed QP", err, verbs.ErrClosed)
	want("Modify on a closed QP", qp.Modify(&verbs.QPAttr{State: verbs.QPStateErr}, verbs.QPAttrState), verbs.ErrClosed)
	want("SRQ.Close", srq.Close(), nil)
	want("CQ.Close", cq.Close(), nil)
	want("CQ.Close again", cq.Close(), verbs.ErrClosed)
	want("PD.Close with an MR and an AH", pd.Close(), verbs.ErrBusy)
	want("MR.Close", mr.Close(), nil)
	want("MR.Close again", mr.Close(), verbs.ErrClosed)
	want("PD.Close with an AH", pd.Close(), verbs.ErrBusy)
	want("AH.Close", ah.Close(), nil)
	want("PD.Close", pd.Close(), nil)
	want("PD.Close again", pd.Close(), verbs.ErrClosed)
	if m, err := pd.RegMR(4096, local); err == nil {
		m.Close()
		t.Errorf("RegMR on a closed PD succeeded")
	} else {
		want("RegMR on a closed PD", err, verbs.ErrClosed)
	}
	want("Device.Close", dev.Close(), nil)
	want("Device.Close again", dev.Close(), verbs.ErrClosed)
	if p, err := dev.AllocPD(); err == nil {
		p.Close()
		t.Errorf("AllocPD on a closed device succeeded")
	} else {
		want("AllocPD on a closed device", err, verbs.ErrClosed)
	}
}

// testPortActive: an opened device's port is ACTIVE, as the ibverbs
// backend requires to open one, and stays so while nothing touches its
// link: the agent's rail watcher reads anything else as the rail down.
func testPortActive(t *testing.T, f Factory) {
	for i, dev := range openDevices(t, f, 2, Options{}) {
		for range 2 {
			st, err := dev.PortState()
			if err != nil || st != verbs.PortStateActive || !st.Active() {
				t.Fatalf("device %d (%s): port %v, %v; want ACTIVE", i, dev.Attr().Name, st, err)
			}
		}
	}
}
