package engine

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"net/netip"
	"testing"
	"time"

	"github.com/rdmavisor/rdmavisor/internal/engine/format"
	"github.com/rdmavisor/rdmavisor/internal/transport"
	"github.com/rdmavisor/rdmavisor/internal/verbs"
	"github.com/rdmavisor/rdmavisor/internal/verbs/soft"
	softwire "github.com/rdmavisor/rdmavisor/internal/verbs/soft/wire"
	"github.com/rdmavisor/rdmavisor/internal/vqpn"
)

// hostile is a node that speaks raw verbs on the soft provider, not
// through an engine: it can put any header and any imm_data on the wire,
// on QPs the engine under attack connected to it.
type hostile struct {
	t   testing.TB
	gid verbs.GID
	pd  verbs.PD
	cq  verbs.CQ
	mr  verbs.MR
	ud  verbs.QP
	off int
	// in is its RC QP connected to the engine's ingress QP (AcceptQP),
	// as a peer's pool QP is: what it sends arrives as from this peer.
	in verbs.QP
	// ins are all the QPs it connected to the engine's ingress QPs.
	ins []verbs.QP
	// out are the QPs it made for the engine's own send QPs toward it
	// (hostileLink.ConnectQP).
	out []verbs.QP
	// secrets are those the engine gave it, by the QPN of its QP (the
	// UD QP's: its datagrams'): a peer knows them, a spoofer does not.
	secrets map[uint32]uint64
}

func newHostile(t testing.TB, fb *softwire.Fabric, ip string) *hostile {
	t.Helper()
	gid := verbs.GIDFromAddr(netip.MustParseAddr(ip))
	w, err := fb.Attach(gid)
	if err != nil {
		t.Fatal(err)
	}
	dev, err := soft.Open(soft.Config{Name: ip, Wire: w})
	if err != nil {
		t.Fatal(err)
	}
	h := &hostile{t: t, gid: gid, secrets: map[uint32]uint64{}}
	t.Cleanup(func() {
		for _, q := range append(append(h.out, h.ins...), h.ud) {
			if q != nil {
				_ = q.Close()
			}
		}
		_ = h.mr.Close()
		_ = h.cq.Close()
		_ = h.pd.Close()
		_ = dev.Close()
	})
	if h.pd, err = dev.AllocPD(); err != nil {
		t.Fatal(err)
	}
	if h.cq, err = dev.CreateCQ(4096); err != nil {
		t.Fatal(err)
	}
	if h.mr, err = h.pd.RegMR(1<<20, verbs.AccessLocalWrite); err != nil {
		t.Fatal(err)
	}
	h.ud = h.qp(verbs.QPTypeUD)
	if err := verbs.ActivateUD(h.ud, 0, 0); err != nil {
		t.Fatal(err)
	}
	h.fill(h.ud)
	return h
}

// qp creates a QP with a receive queue of its own, which fill fills once
// connected, so what the engine sends it never waits for a buffer.
func (h *hostile) qp(typ verbs.QPType) verbs.QP {
	h.t.Helper()
	qp, err := h.pd.CreateQP(&verbs.QPInitAttr{Type: typ, SendCQ: h.cq, RecvCQ: h.cq,
		Cap: verbs.QPCap{MaxSendWR: 256, MaxRecvWR: 256, MaxSendSGE: 1, MaxRecvSGE: 1}})
	if err != nil {
		h.t.Fatal(err)
	}
	return qp
}

// fill gives a connected QP its receive buffers.
func (h *hostile) fill(qp verbs.QP) {
	h.t.Helper()
	wrs := make([]verbs.RecvWR, 256)
	for i := range wrs {
		wrs[i] = verbs.RecvWR{WRID: uint64(i), NumSGE: 1, SG: [verbs.MaxSGE]verbs.SGE{{Addr: h.mr.Addr() + 1<<19 + uint64(i)*2048, Length: 2048, LKey: h.mr.LKey()}}}
	}
	if _, err := qp.PostRecv(wrs); err != nil {
		h.t.Fatal(err)
	}
}

// hostileLink is the control plane as the hostile node answers it: it
// makes its own QPs for the engine's.
type hostileLink struct{ h *hostile }

func (l hostileLink) ConnectQP(_ context.Context, req QPRequest) (QPReply, error) {
	h := l.h
	qp := h.qp(req.Type)
	if err := verbs.ConnectQP(qp, verbs.Remote{GID: req.GID, QPN: req.QPN, PSN: req.PSN}, verbs.PathOptions{MTU: req.MTU, SQPSN: 7}); err != nil {
		return QPReply{}, err
	}
	h.fill(qp)
	h.out = append(h.out, qp)
	return QPReply{QPN: qp.QPN(), PSN: 7, UDQPNs: []uint32{h.ud.QPN()}, Secret: newSecret(), UDSecret: newSecret()}, nil
}

// join makes the hostile node e's peer: e holds a peer for it whose link
// it answers, and an ingress QP it made, as a peer agent's ConnectQP does
// (with a pool of one, so every vconn of the hostile's sends on it).
func (h *hostile) join(e *Engine) *Peer {
	h.t.Helper()
	p, err := e.Peer(h.gid, hostileLink{h})
	if err != nil {
		h.t.Fatal(err)
	}
	h.in = h.ingress(e, 1, 0)
	return p
}

// ingress makes an RC QP toward e as QP index of a pool of pool, connects
// and fills it.
func (h *hostile) ingress(e *Engine, pool, index int) verbs.QP {
	h.t.Helper()
	return h.ingressOf(e, verbs.QPTypeRC, pool, index)
}

// ingressOf is ingress for a QP of type t (RC or UC).
func (h *hostile) ingressOf(e *Engine, t verbs.QPType, pool, index int) verbs.QP {
	h.t.Helper()
	qp := h.qp(t)
	rep, err := e.AcceptQP(QPRequest{GID: h.gid, Type: t, QPN: qp.QPN(), PSN: 3, MTU: verbs.MTU1024, UDQPNs: []uint32{h.ud.QPN()}, Index: index, Pool: pool, Resends: true, ResendsAuto: true})
	if err != nil {
		h.t.Fatal(err)
	}
	if err := verbs.ConnectQP(qp, verbs.Remote{GID: e.GID(), QPN: rep.QPN, PSN: rep.PSN}, verbs.PathOptions{MTU: verbs.MTU1024, SQPSN: 3}); err != nil {
		h.t.Fatal(err)
	}
	h.fill(qp)
	h.ins = append(h.ins, qp)
	h.secrets[qp.QPN()], h.secrets[h.ud.QPN()] = rep.Secret, rep.UDSecret
	return qp
}

// send posts one message with the engine's header on qp (to a UD QP of
// e when qp is the hostile's UD QP), with the secret e gave it for qp,
// and waits for its completion.
func (h *hostile) send(qp verbs.QP, e *Engine, imm vqpn.ID, hd format.Header, payload []byte) {
	h.t.Helper()
	b := make([]byte, format.HeaderLen+len(payload))
	hd.Auth = h.secrets[qp.QPN()]
	hd.Put(b)
	copy(b[format.HeaderLen:], payload)
	h.sendRaw(qp, e, vqpn.Imm(imm), b)
}

// sendRaw posts msg, whatever it holds, with imm as imm_data.
func (h *hostile) sendRaw(qp verbs.QP, e *Engine, imm uint32, msg []byte) {
	h.t.Helper()
	if h.off+len(msg) > 1<<19 {
		h.off = 0
	}
	n := copy(h.mr.Bytes()[h.off:], msg)
	wr := verbs.SendWR{WRID: 1, Opcode: verbs.WRSendWithImm, ImmData: imm, Flags: verbs.SendSignaled, NumSGE: 1,
		SG: [verbs.MaxSGE]verbs.SGE{{Addr: h.mr.Addr() + uint64(h.off), Length: uint32(n), LKey: h.mr.LKey()}}}
	h.off += (n + 63) &^ 63
	if qp.Type() == verbs.QPTypeUD {
		ah, err := h.pd.CreateAH(&verbs.AHAttr{DGID: e.GID(), PortNum: 1, HopLimit: 64})
		if err != nil {
			h.t.Fatal(err)
		}
		defer func() { _ = ah.Close() }()
		wr.AH, wr.RemoteQPN, wr.RemoteQKey = ah.Handle(), e.UDQPNs()[0], e.cfg.QKey
	}
	if st := h.post(qp, wr, 5*time.Second); st != verbs.WCSuccess {
		h.t.Fatalf("hostile send: %v", st)
	}
}

// post posts wr, alone, on qp and returns its completion's status; the
// receive completions (the engine's grants) that come meanwhile are
// ignored. It fails the test if none comes within timeout.
func (h *hostile) post(qp verbs.QP, wr verbs.SendWR, timeout time.Duration) verbs.WCStatus {
	h.t.Helper()
	if _, err := qp.PostSend([]verbs.SendWR{wr}); err != nil {
		h.t.Fatal(err)
	}
	wcs := make([]verbs.WC, 16)
	deadline := time.Now().Add(timeout)
	for time.Now().Before(deadline) {
		for _, wc := range wcs[:h.cq.Poll(wcs)] {
			if wc.Opcode&verbs.WCRecv == 0 && wc.WRID == wr.WRID {
				return wc.Status
			}
		}
		time.Sleep(100 * time.Microsecond)
	}
	h.t.Fatalf("work request %d never completed", wr.WRID)
	return 0
}

// echo has a send a random message and b return it, and checks it comes
// back byte for byte.
func echo(ctx context.Context, t *testing.T, a, b *VConn) {
	t.Helper()
	msg := make([]byte, 1+rand.IntN(min(3000, a.MaxMessage())))
	for i := range msg {
		msg[i] = byte(rand.Uint32())
	}
	if err := a.Send(ctx, msg); err != nil {
		t.Fatalf("echo send: %v", err)
	}
	m, err := b.Recv(ctx)
	if err != nil {
		t.Fatalf("echo recv: %v", err)
	}
	err = b.Send(ctx, m.Data)
	m.Release()
	if err != nil {
		t.Fatalf("echo send back: %v", err)
	}
	if m, err = a.Recv(ctx); err != nil {
		t.Fatalf("echo recv back: %v", err)
	}
	defer m.Release()
	if !bytes.Equal(m.Data, msg) {
		t.Fatalf("echo: %d bytes came back differing from the %d sent", len(m.Data), len(msg))
	}
}

func waitRejected(t *testing.T, e *Engine, r RejectReason, n uint64) {
	t.Helper()
	waitFor(t, func() bool { return e.RejectStats()[r] >= n }, "rejections: "+r.String())
}

// TestAttacks: a hostile node that reaches the engine's QPs (as a peer
// of the engine, with its own vconn there) sends FIN, RESET, data and
// credit grants naming other tenants' vconns, inflates its own credits
// and sends past them. Each is refused and counted, and the tenants'
// vconns, one of them sharing its QP with the target, keep echoing.
func TestAttacks(t *testing.T) {
	for _, tr := range []transport.Kind{transport.RC, transport.UC, transport.UD, transport.Auto} {
		t.Run(tr.String(), func(t *testing.T) { testAttacks(t, tr) })
	}
}

func testAttacks(t *testing.T, tr transport.Kind) {
	fb := softwire.NewFabric(softwire.Faults{})
	t.Cleanup(func() { _ = fb.Close() })
	a, b := testEnginesOn(t, fb, Config{QPsPerPeer: 1})
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	victimA, victimB, err := Pair(ctx, a, b, VConnOptions{Transport: tr}, VConnOptions{Transport: tr})
	if err != nil {
		t.Fatal(err)
	}
	// The bystander shares the victim's QPs (one per peer).
	byA, byB, err := Pair(ctx, a, b, VConnOptions{Transport: tr}, VConnOptions{Transport: tr})
	if err != nil {
		t.Fatal(err)
	}
	check := func(what string) {
		t.Helper()
		echo(ctx, t, victimA, victimB)
		echo(ctx, t, byA, byB)
		echo(ctx, t, victimB, victimA)
		if err := errors.Join(victimA.Err(), victimB.Err(), byA.Err(), byB.Err()); err != nil {
			t.Fatalf("after %s: %v", what, err)
		}
	}
	check("nothing")

	h := newHostile(t, fb, "10.9.0.66")
	hp := h.join(a)
	// The hostile node's own vconn on a: it may send there, on credit.
	own, err := a.NewVConn(ctx, hp, VConnOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if err := own.Connect(vqpn.MakeID(7, 1)); err != nil {
		t.Fatal(err)
	}

	// Another tenant's vconn, named from the hostile node's QPs and as
	// datagrams: FIN, RESET, data, an inflated grant. None is the
	// victim's peer's.
	fin, rst := format.ControlHeader(format.Fin), format.ControlHeader(format.Reset)
	grant := format.ControlHeader(format.Credit)
	grant.Credit = 1 << 30
	data := format.DataHeader(5, 0, 0, false)
	data.Flags |= format.FlagFirst | format.FlagLast
	before := a.RejectStats()[RejectPeer]
	k := uint64(0)
	for _, hd := range []format.Header{fin, rst, data, grant} {
		payload := []byte(nil)
		if hd.Type == format.Data {
			payload = []byte("spliced")[:5]
		}
		h.send(h.in, a, victimA.ID(), hd, payload)
		h.send(h.ud, a, victimA.ID(), hd, payload)
		k += 2
	}
	// On the QP the engine sends to the hostile node on: a's own send QP
	// receives nothing.
	h.send(h.out[0], a, victimA.ID(), rst, nil)
	k++
	waitRejected(t, a, RejectPeer, before+k)
	check("FIN, RESET, data and a grant from another node")

	attackOwnVConn(t, a, h, own, fin, grant)
	check("a flood past credits")
	t.Logf("rejected: %v", a.RejectStats())
	own.Abort()
	_ = byA.Close()
	_ = byB.Close()
	closeAll(t, a, b, victimA, victimB)
}

// attackOwnVConn: the hostile node's own vconn on a sends control as a
// datagram, an inflated grant and data past its credits; each is refused
// and counted, and the flood fails the vconn.
func attackOwnVConn(t *testing.T, a *Engine, h *hostile, own *VConn, fin, grant format.Header) {
	t.Helper()
	// Its own vconn: control as a datagram (where its source is only
	// the datagram's say) is refused.
	before := a.RejectStats()[RejectTransport]
	h.send(h.ud, a, own.ID(), fin, nil)
	waitRejected(t, a, RejectTransport, before+1)
	if own.Err() != nil {
		t.Fatalf("own vconn: %v", own.Err())
	}

	// Credit inflation: a grant far past anything it could have made is
	// cut to MaxCredits past the last.
	lim := own.limit.Load()
	h.send(h.in, a, own.ID(), grant, nil)
	waitRejected(t, a, RejectGrant, 1)
	if got, max := own.limit.Load(), lim+uint32(a.cfg.MaxCredits); int32(got-max) > 0 {
		t.Fatalf("grant of %d took the limit from %d to %d; want at most %d", grant.Credit, lim, got, max)
	}

	// Sending past credits: the window's worth is queued, the next is
	// refused and the vconn fails, its queue no longer than the window.
	window := own.window.Size()
	for i := range window + 1 {
		d := format.DataHeader(4, i, 0, false)
		d.Flags |= format.FlagFirst | format.FlagLast
		d.Arg = i // numbered, as an engine numbers an RC vconn's chunks (ChunkNo)
		h.send(h.in, a, own.ID(), d, []byte("flood"[:4]))
	}
	waitRejected(t, a, RejectCredit, 1)
	waitFor(t, func() bool { return errors.Is(own.Err(), ErrCreditOverrun) }, "the overrun vconn to fail")
	queued := own.rcv.queued()
	if queued > int(window) {
		t.Fatalf("%d messages queued on a vconn with a window of %d", queued, window)
	}
}

// twoQPPeer is an engine a and a hostile node h at ip, peers, h with a
// pool of two QPs toward a (in0, in1), and a's vconn (of options o, RC
// without) to h's vconn of vQPN 7, which sends on in1.
func twoQPPeer(ctx context.Context, t *testing.T, ip string, o ...VConnOptions) (a *Engine, h *hostile, vc *VConn, in0, in1 verbs.QP) {
	t.Helper()
	fb := softwire.NewFabric(softwire.Faults{})
	t.Cleanup(func() { _ = fb.Close() })
	a, _ = testEnginesOn(t, fb, Config{})
	h = newHostile(t, fb, ip)
	hp, err := a.Peer(h.gid, hostileLink{h})
	if err != nil {
		t.Fatal(err)
	}
	in0, in1 = h.ingress(a, 2, 0), h.ingress(a, 2, 1)
	if vc, err = a.NewVConn(ctx, hp, append(o, VConnOptions{})[0]); err != nil {
		t.Fatal(err)
	}
	if err := vc.Connect(vqpn.MakeID(7, 1)); err != nil { // 7 mod 2: index 1
		t.Fatal(err)
	}
	return a, h, vc, in0, in1
}

// TestMessagesScopedToQP: a peer's vconn of vQPN v sends on its QPs of
// index v mod its pool size; the same message on another of the peer's
// QPs is refused, so a tenant's traffic cannot be injected through a QP
// that another vconn of the same peer sends on.
func TestMessagesScopedToQP(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	a, h, vc, in0, in1 := twoQPPeer(ctx, t, "10.9.0.68")
	data := func(n uint32) format.Header {
		d := format.DataHeader(5, n, 0, false)
		d.Flags |= format.FlagFirst | format.FlagLast
		return d
	}
	before := a.RejectStats()[RejectPeer]
	h.send(in0, a, vc.ID(), data(0), []byte("wrong"))
	waitRejected(t, a, RejectPeer, before+1)
	h.send(in1, a, vc.ID(), data(0), []byte("right"))
	m, err := vc.Recv(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer m.Release()
	if string(m.Data) != "right" {
		t.Fatalf("received %q, want only the message sent on the vconn's QP", m.Data)
	}
	if n := a.RejectStats()[RejectPeer]; n != before+1 {
		t.Fatalf("%d peer rejections, want %d", n, before+1)
	}
}

// TestStaleGenerationIgnored: a FIN or RESET that names a vconn's vQPN
// with another generation (its previous owner's) leaves the vconn alone:
// after each, a message still arrives each way, whole, a receive with
// nothing more sent waits rather than read the end, and the vconn has not
// failed; the right generation's RESET does reach it.
func TestStaleGenerationIgnored(t *testing.T) {
	fb := softwire.NewFabric(softwire.Faults{})
	t.Cleanup(func() { _ = fb.Close() })
	a, _ := testEnginesOn(t, fb, Config{})
	h := newHostile(t, fb, "10.9.0.67")
	hp := h.join(a)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	vc, err := a.NewVConn(ctx, hp, VConnOptions{})
	if err != nil {
		t.Fatal(err)
	}
	peer := vqpn.MakeID(9, 1)
	if err := vc.Connect(peer); err != nil {
		t.Fatal(err)
	}
	id := vc.ID()
	var seq uint32 // the next data message's number from the hostile node
	works := func(after string) {
		t.Helper()
		in := fmt.Sprintf("to the vconn, %d", seq)
		d := format.DataHeader(uint32(len(in)), seq, 0, false)
		d.Flags |= format.FlagFirst | format.FlagLast
		d.Arg = seq // one chunk a message: the chunk's number too (ChunkNo)
		h.send(h.in, a, id, d, []byte(in))
		seq++
		m, err := vc.Recv(ctx)
		if err != nil {
			t.Fatalf("after %s: receive: %v", after, err)
		}
		if string(m.Data) != in {
			t.Fatalf("after %s: received %q, want %q", after, m.Data, in)
		}
		m.Release()
		// Nothing more was sent: a receive waits, as on a vconn whose
		// peer has not closed (not io.EOF).
		quiet, stop := context.WithTimeout(ctx, 20*time.Millisecond)
		_, err = vc.Recv(quiet)
		stop()
		if !errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("after %s: a receive with nothing sent returned %v, want it to wait", after, err)
		}
		out := "from the vconn after " + after
		if err := vc.Send(ctx, []byte(out)); err != nil {
			t.Fatalf("after %s: send: %v", after, err)
		}
		if got := h.awaitData(peer); string(got) != out {
			t.Fatalf("after %s: the peer received %q, want %q", after, got, out)
		}
		if err := vc.Err(); err != nil {
			t.Fatalf("after %s: the vconn failed: %v", after, err)
		}
	}
	works("nothing")
	stale, sent := a.Stats().StaleDropped, 0
	for _, g := range []vqpn.Gen{id.Gen() - 1, id.Gen() + 1} {
		if g == 0 {
			continue
		}
		for _, typ := range []format.Type{format.Fin, format.Reset} {
			h.send(h.in, a, vqpn.MakeID(id.VQPN(), g), format.ControlHeader(typ), nil)
			stale, sent = stale+1, sent+1
			waitFor(t, func() bool { return a.Stats().StaleDropped == stale }, "the stale drop")
			works(fmt.Sprintf("a %s of generation %d (the vconn's is %d)", map[format.Type]string{format.Reset: "RESET", format.Fin: "FIN"}[typ], g, id.Gen()))
		}
	}
	if sent < 2 {
		t.Fatalf("%d stale messages sent, want a FIN and a RESET at least", sent)
	}
	// The right generation does reach it.
	h.send(h.in, a, id, format.ControlHeader(format.Reset), nil)
	waitFor(t, func() bool { return errors.Is(vc.Err(), ErrReset) }, "the reset")
}

// awaitData waits for a data message the engine sends the hostile node's
// vconn id and returns its payload.
func (h *hostile) awaitData(id vqpn.ID) []byte {
	h.t.Helper()
	wcs := make([]verbs.WC, 16)
	deadline := time.Now().Add(5 * time.Second)
	for time.Now().Before(deadline) {
		for _, wc := range wcs[:h.cq.Poll(wcs)] {
			if wc.Opcode&verbs.WCRecv == 0 || wc.Status != verbs.WCSuccess || wc.ImmData != vqpn.Imm(id) {
				continue
			}
			off := 1<<19 + int(wc.WRID)*2048
			b := h.mr.Bytes()[off : off+int(wc.ByteLen)]
			var hd format.Header
			if err := hd.Parse(b); err != nil || hd.Type != format.Data {
				continue
			}
			return append([]byte(nil), b[format.HeaderLen:]...)
		}
		time.Sleep(100 * time.Microsecond)
	}
	h.t.Fatal("no data message arrived")
	return nil
}
