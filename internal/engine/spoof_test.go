package engine

import (
	"bytes"
	"context"
	"fmt"
	"math/rand/v2"
	"net/netip"
	"sync/atomic"
	"testing"
	"time"

	"github.com/rdmavisor/rdmavisor/internal/engine/format"
	"github.com/rdmavisor/rdmavisor/internal/transport"
	"github.com/rdmavisor/rdmavisor/internal/verbs"
	"github.com/rdmavisor/rdmavisor/internal/verbs/soft"
	"github.com/rdmavisor/rdmavisor/internal/verbs/soft/roce"
	softwire "github.com/rdmavisor/rdmavisor/internal/verbs/soft/wire"
	"github.com/rdmavisor/rdmavisor/internal/vqpn"
)

// Spoofed packets: a host on the RoCE network that is no node of ours
// sends RoCE v2 packets with a node's source address, to the QPN that node
// sends on, naming a vconn's vQPN and generation: the worst case of an
// off-path attacker, who guesses or knows all of those. A UC responder
// takes a message's first packet whatever its PSN (IBA 9.7.5.1.1; rxe and
// the soft provider alike), so nothing below the engine stops it. The
// engine does: every message must carry the secret of its QP pair
// (format.Authentic), which the attacker does not know.

// spoofWire is the wire of an engine under attack: packets from the
// spoofing host arrive as from the address it spoofs (what the fabric
// cannot tell apart), and, while blackholed, packets to one QPN are lost
// (a network that drops them).
type spoofWire struct {
	softwire.Wire
	spoofer, as verbs.GID
	hole        atomic.Uint32 // a QPN whose packets are dropped; 0: none
	holed       atomic.Int64  // packets dropped there
	ackHole     atomic.Uint32 // a QPN whose acknowledgements alone are dropped; 0: none
	readBytes   atomic.Int64  // bytes of RDMA READ responses received
}

func (w *spoofWire) Recv(pkts []softwire.Packet) (int, error) {
	for {
		n, err := w.Wire.Recv(pkts)
		if err != nil {
			return n, err
		}
		k := 0
		for i := range pkts[:n] {
			p := pkts[i]
			if p.N > 0 && roce.Opcode(p.Buf[0]).IsReadResponse() {
				w.readBytes.Add(int64(p.N))
			}
			if p.Addr == w.spoofer {
				p.Addr = w.as
			}
			if q := w.hole.Load(); q != 0 && p.N >= roce.BTHLen && uint32(p.Buf[5])<<16|uint32(p.Buf[6])<<8|uint32(p.Buf[7]) == q {
				w.holed.Add(1)
				continue
			}
			if q := w.ackHole.Load(); q != 0 && p.N >= roce.BTHLen && roce.Opcode(p.Buf[0]).IsAck() && uint32(p.Buf[5])<<16|uint32(p.Buf[6])<<8|uint32(p.Buf[7]) == q {
				continue
			}
			pkts[i], pkts[k] = pkts[k], p
			k++
		}
		if k > 0 {
			return k, nil
		}
	}
}

// spoofNet is two engines, each on a spoofWire, and the spoofing host.
type spoofNet struct {
	a, b    *Engine
	wa, wb  *spoofWire
	spoofer softwire.Wire
}

func newSpoofNet(t *testing.T, wrapA ...func(verbs.Device) verbs.Device) *spoofNet {
	t.Helper()
	fb := softwire.NewFabric(softwire.Faults{})
	t.Cleanup(func() { _ = fb.Close() })
	gid := func(ip string) verbs.GID { return verbs.GIDFromAddr(netip.MustParseAddr(ip)) }
	ga, gb, gs := gid("10.9.0.1"), gid("10.9.0.2"), gid("10.9.0.99")
	n := &spoofNet{}
	open := func(g, other verbs.GID, wrap ...func(verbs.Device) verbs.Device) (*Engine, *spoofWire) {
		inner, err := fb.Attach(g)
		if err != nil {
			t.Fatal(err)
		}
		w := &spoofWire{Wire: inner, spoofer: gs, as: other}
		dev, err := soft.Open(soft.Config{Name: g.String(), Wire: w})
		if err != nil {
			t.Fatal(err)
		}
		return testEngine(t, dev, Config{QPsPerPeer: 1}, wrap...), w
	}
	n.a, n.wa = open(ga, gb, wrapA...)
	n.b, n.wb = open(gb, ga)
	var err error
	if n.spoofer, err = fb.Attach(gs); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = n.spoofer.Close() })
	return n
}

// ingressQPN is the QPN of the UC QP on which to receives from from's
// vconn remote: the QP the spoofer aims at.
func ingressQPN(t *testing.T, to, from *Engine, remote vqpn.ID) uint32 {
	t.Helper()
	to.peersMu.Lock()
	p := to.peers[from.GID()]
	to.peersMu.Unlock()
	qp := p.ingressQP(verbs.QPTypeUC, remote)
	if qp == nil {
		t.Fatal("no UC QP from the peer")
	}
	return qp.QPN()
}

// forge sends, from the spoofing host as from the other engine, one
// engine message (hd, its auth a guess, and payload) to QP qpn of to,
// naming vconn id: a UC SEND ONLY with immediate, or a UD one (with the
// Q_Key, which is no secret) when ud.
func (n *spoofNet) forge(t *testing.T, to *Engine, qpn uint32, ud bool, id vqpn.ID, hd format.Header, payload []byte) {
	t.Helper()
	msg := make([]byte, format.HeaderLen+len(payload))
	hd.Put(msg)
	copy(msg[format.HeaderLen:], payload)
	h := roce.Header{Opcode: roce.UCSendOnlyImm, PKey: 0xffff, DestQPN: qpn, PSN: rand.Uint32() & roce.Mask24, Imm: vqpn.Imm(id)}
	if ud {
		h.Opcode, h.QKey, h.SrcQPN = roce.UDSendOnlyImm, to.cfg.QKey, 0x77
	}
	n.inject(t, to, &h, msg)
}

// inject sends, from the spoofing host as from the other engine, the
// packet h with payload to engine to.
func (n *spoofNet) inject(t *testing.T, to *Engine, h *roce.Header, payload []byte) {
	t.Helper()
	from := n.a
	if to == n.a {
		from = n.b
	}
	buf := make([]byte, roce.MaxPacketLen(len(payload)))
	k, err := roce.Encode(buf, h, payload, roce.Endpoint{GID: from.GID(), Port: roce.DefaultPort}, roce.Endpoint{GID: to.GID(), Port: roce.DefaultPort})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := n.spoofer.Send([]softwire.Packet{{Buf: buf[:k], N: k, Addr: to.GID()}}); err != nil {
		t.Fatal(err)
	}
}

// forged counts what e dropped as forged.
func forged(e *Engine) uint64 { return e.RejectStats()[RejectForged] }

// guesses are the secrets a spoofer tries: none, and random ones.
func guesses() []uint64 { return []uint64{0, rand.Uint64(), rand.Uint64() | 1} }

// TestSpoofedData: a spoofer sends a's vconn the message it expects next
// (an Auto datagram with the next sequence number, a bundle of the next
// two, a UD datagram), as from its peer, on the QP its peer sends on. None
// is delivered (forged bytes delivered: 0), each is counted, and the
// peer's own messages of those sequence numbers all arrive, byte for byte
// (before, the forged message took the place of the real one, which was
// then dropped as a duplicate).
func TestSpoofedData(t *testing.T) {
	for _, tr := range []transport.Kind{transport.Auto, transport.UD} {
		t.Run(tr.String(), func(t *testing.T) {
			n := newSpoofNet(t)
			ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
			defer cancel()
			va, vb, err := Pair(ctx, n.a, n.b, VConnOptions{Transport: tr}, VConnOptions{Transport: tr})
			if err != nil {
				t.Fatal(err)
			}
			exchange(ctx, t, vb, va, 1, func(int) []byte { return []byte("hello") })
			var qpn uint32
			ud := tr == transport.UD
			if ud {
				qpns := n.a.UDQPNs()
				qpn = qpns[int(vb.ID().VQPN())%len(qpns)] // where vb's datagrams go
			} else {
				qpn = ingressQPN(t, n.a, n.b, vb.ID())
			}
			next := va.auto.load().rx.Next()
			const fake = "FORGED!"
			sent := uint64(0)
			before := forged(n.a)
			for _, g := range guesses() {
				d := format.DataHeader(uint32(len(fake)), next, 0, false)
				d.SetChunk(true, true)
				d.Credit, d.Auth = va.limit.Load(), g
				n.forge(t, n.a, qpn, ud, va.ID(), d, []byte(fake))
				sent++
				if ud {
					continue
				}
				// A bundle of the next two.
				var body []byte
				for i := range uint32(2) {
					var rh [format.HeaderLen]byte
					(&format.Header{Type: format.Data, Flags: format.FlagFirst | format.FlagLast, Length: uint32(len(fake)), Seq: next + i}).Put(rh[:])
					body = append(append(body, rh[:]...), fake...)
				}
				bh := format.BundleHeader(next, 2, uint32(len(body)))
				bh.Credit, bh.Auth = va.limit.Load(), g
				n.forge(t, n.a, qpn, false, va.ID(), bh, body)
				sent++
			}
			// The peer's own messages, after the forged ones on the
			// same QP: the engine reads them in that order.
			const real = 3
			for i := range real {
				if err := vb.Send(ctx, fmt.Appendf(nil, "real %d", i)); err != nil {
					t.Fatal(err)
				}
			}
			forgedBytes := 0
			for i := range real {
				m, err := va.Recv(ctx)
				if err != nil {
					t.Fatalf("real message %d: %v (forged bytes delivered: %d)", i, err, forgedBytes)
				}
				if bytes.Contains(m.Data, []byte(fake)) {
					forgedBytes += len(m.Data)
				} else if want := fmt.Sprintf("real %d", i); string(m.Data) != want {
					t.Errorf("message %d: %q, want %q", i, m.Data, want)
				}
				m.Release()
			}
			if forgedBytes != 0 {
				t.Fatalf("forged bytes delivered: %d, want 0", forgedBytes)
			}
			waitFor(t, func() bool { return forged(n.a) >= before+sent }, "the forged messages counted")
			if got := forged(n.a) - before; got != sent {
				t.Fatalf("%d messages counted forged, want the %d sent", got, sent)
			}
			if err := va.Err(); err != nil {
				t.Fatalf("the attacked vconn: %v", err)
			}
			exchange(ctx, t, va, vb, 2, func(i int) []byte { return fmt.Appendf(nil, "after %d", i) })
		})
	}
}

// TestSpoofedAck: while the network loses what b's Auto vconn sends, a
// spoofer acknowledges all of it as from a. b must not believe it: the
// datagrams are resent once the network recovers, and every message
// arrives (messages lost: 0; before, b freed them on the forged
// acknowledgement and they never came).
func TestSpoofedAck(t *testing.T) {
	n := newSpoofNet(t)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	va, vb, err := Pair(ctx, n.a, n.b, VConnOptions{Transport: transport.Auto}, VConnOptions{Transport: transport.Auto})
	if err != nil {
		t.Fatal(err)
	}
	exchange(ctx, t, va, vb, 1, func(int) []byte { return []byte("hello") })
	exchange(ctx, t, vb, va, 1, func(int) []byte { return []byte("hello back") })
	toA := ingressQPN(t, n.a, n.b, vb.ID())
	toB := ingressQPN(t, n.b, n.a, va.ID())

	// b's datagrams to a are lost, one by one.
	n.wa.hole.Store(toA)
	const lost = 4
	first := vb.snd.seq
	for i := range lost {
		if err := vb.Send(ctx, fmt.Appendf(nil, "lost %d", i)); err != nil {
			t.Fatal(err)
		}
		waitFor(t, func() bool { return n.wa.holed.Load() >= int64(i+1) }, "the datagram lost")
	}
	// The forged acknowledgement of all of them rides on a message b has
	// had already (a duplicate, which acts only by its header).
	before := forged(n.b)
	for _, g := range guesses() {
		d := format.DataHeader(5, vb.auto.load().rx.Next()-1, 0, false)
		d.SetChunk(true, true)
		d.Credit, d.Arg, d.Auth = vb.limit.Load(), first+lost, g
		n.forge(t, n.b, toB, false, vb.ID(), d, []byte("dupe!"))
	}
	waitFor(t, func() bool { return forged(n.b) >= before+3 }, "the forged acknowledgements counted")
	n.wa.hole.Store(0)
	for i := range lost {
		m, err := va.Recv(ctx)
		if err != nil {
			t.Fatalf("message %d of %d lost: %v", i, lost, err)
		}
		if want := fmt.Sprintf("lost %d", i); string(m.Data) != want {
			t.Fatalf("message %d: %q, want %q", i, m.Data, want)
		}
		m.Release()
	}
	if got := forged(n.b) - before; got != 3 {
		t.Fatalf("%d messages counted forged, want 3", got)
	}
}

// TestSpoofedCredit: a spoofer grants b's Auto vconn all the credits a
// grant may add, as from a, on a message b has had already. b's limit
// stays what a granted (the window moves by 0).
func TestSpoofedCredit(t *testing.T) {
	n := newSpoofNet(t)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	va, vb, err := Pair(ctx, n.a, n.b, VConnOptions{Transport: transport.Auto}, VConnOptions{Transport: transport.Auto})
	if err != nil {
		t.Fatal(err)
	}
	exchange(ctx, t, va, vb, 1, func(int) []byte { return []byte("hello") })
	toB := ingressQPN(t, n.b, n.a, va.ID())
	limit := vb.limit.Load()
	before := forged(n.b)
	for _, g := range guesses() {
		d := format.DataHeader(5, vb.auto.load().rx.Next()-1, 0, false)
		d.SetChunk(true, true)
		d.Credit, d.Arg, d.Auth = limit+uint32(n.b.cfg.MaxCredits), vb.snd.seq, g // it acknowledges nothing new
		n.forge(t, n.b, toB, false, vb.ID(), d, []byte("dupe!"))
	}
	// a's own datagram after them, on the same QP, carries a's grant.
	exchange(ctx, t, va, vb, 1, func(int) []byte { return []byte("marker") })
	if got, granted := vb.limit.Load(), va.window.Advertised(); format.After(got, granted) {
		t.Fatalf("b's limit %d (was %d), past the %d a granted: forged credits took effect", got, limit, granted)
	}
	waitFor(t, func() bool { return forged(n.b) >= before+3 }, "the forged grants counted")
	if got := forged(n.b) - before; got != 3 {
		t.Fatalf("%d messages counted forged, want 3", got)
	}
}

// noMWDevice is a device without type 2 memory windows (max_mw 0): the
// engine exports regions with their MR's key, valid on any of its QPs.
type noMWDevice struct{ verbs.Device }

func (d noMWDevice) Attr() verbs.DeviceAttr {
	a := d.Device.Attr()
	a.MaxMW = 0
	return a
}

// TestSpoofedWriteOnUC: on a device without memory windows, a spoofer
// writes, as from the peer, to a region exported with its MR's key,
// through the UC QP the peer sends on: no PSN is needed there, and a
// wrong key is dropped silently, so the key could be found by trying.
// The engine's UC QPs allow no remote access: bytes written 0.
func TestSpoofedWriteOnUC(t *testing.T) {
	n := newSpoofNet(t, func(d verbs.Device) verbs.Device { return noMWDevice{d} })
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	if n.a.windows {
		t.Fatal("the engine uses memory windows on a device without them")
	}
	va, vb, err := Pair(ctx, n.a, n.b, VConnOptions{Transport: transport.Auto}, VConnOptions{Transport: transport.Auto})
	if err != nil {
		t.Fatal(err)
	}
	r, err := va.Export(ctx, 4096, AccessRead|AccessWrite, nil)
	if err != nil {
		t.Fatal(err)
	}
	exchange(ctx, t, vb, va, 1, func(int) []byte { return []byte("hello") })
	qpn := ingressQPN(t, n.a, n.b, vb.ID())
	payload := bytes.Repeat([]byte{0xee}, 64)
	h := roce.Header{Opcode: roce.UCWriteOnly, PKey: 0xffff, DestQPN: qpn, PSN: rand.Uint32() & roce.Mask24,
		VA: r.mr.Addr(), RKey: r.mr.RKey(), DMALen: uint32(len(payload))}
	n.inject(t, n.a, &h, payload)
	// b's own datagram after it, on the same QP: the write was handled.
	exchange(ctx, t, vb, va, 1, func(int) []byte { return []byte("marker") })
	if written := len(payload) - bytes.Count(r.Bytes()[:len(payload)], []byte{0}); written != 0 {
		t.Fatalf("bytes written by the spoofer: %d, want 0", written)
	}
}

// TestSpoofedRead: a spoofer sends, as from the peer, RDMA READ requests
// for the whole of a region the peer may read, with its window's valid
// key, on the RC QP the window is bound to, at eight PSNs spread over the
// PSN space (so half of them fall behind the one the responder expects,
// where a READ is a duplicate that may be answered again). The node sends
// the peer no response to any (bytes sent: 0; before, 1 MiB for each
// 32-byte request behind the expected PSN): a duplicate READ is answered
// only within a READ the responder executed, as rxe does. The peer's own
// reads and messages go on.
func TestSpoofedRead(t *testing.T) {
	n := newSpoofNet(t)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	va, vb, err := Pair(ctx, n.a, n.b, VConnOptions{Transport: transport.RC}, VConnOptions{Transport: transport.RC})
	if err != nil {
		t.Fatal(err)
	}
	const size = 1 << 20
	r, err := va.Export(ctx, size, AccessRead, nil)
	if err != nil {
		t.Fatal(err)
	}
	if r.mw == nil {
		t.Fatal("no window on the soft provider")
	}
	exchange(ctx, t, vb, va, 1, func(int) []byte { return []byte("hello") })
	exported(t, vb, r.ID())
	got := make([]byte, 4096)
	start := n.wb.readBytes.Load()
	if err := vb.Read(ctx, r.ID(), 0, got); err != nil {
		t.Fatal(err)
	}
	one := n.wb.readBytes.Load() - start // a read's responses, headers included
	n.a.peersMu.Lock()
	qp := n.a.peers[n.b.GID()].ingressQP(verbs.QPTypeRC, vb.ID())
	n.a.peersMu.Unlock()
	if qp == nil {
		t.Fatal("no RC QP from the peer")
	}
	before := n.wb.readBytes.Load()
	for k := range uint32(8) {
		h := roce.Header{Opcode: roce.RCReadRequest, PKey: 0xffff, DestQPN: qp.QPN(), PSN: k << 21, AckReq: true,
			VA: 0, RKey: r.mw.RKey(), DMALen: size}
		n.inject(t, n.a, &h, nil)
	}
	// The peer's own read and message after them, on the same QP: the
	// forged requests were handled before.
	if err := vb.Read(ctx, r.ID(), 0, got); err != nil {
		t.Fatal(err)
	}
	exchange(ctx, t, vb, va, 1, func(int) []byte { return []byte("marker") })
	// The peer's second read, and at most one replay of it: a forged
	// request ahead of the expected PSN draws a sequence NAK, which may
	// have the peer ask for its read again.
	sent := n.wb.readBytes.Load() - before
	if sent > 2*one {
		t.Fatalf("READ response bytes sent to the peer: %d, want at most %d (its own read, twice)", sent, 2*one)
	}
	t.Logf("READ response bytes for 8 forged reads of 1 MiB and a real one of 4096 bytes (%d with headers): %d", one, sent)
}
