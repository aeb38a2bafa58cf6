package soft

import (
	"encoding/binary"
	"fmt"
	"net/netip"
	"sync"
	"testing"

	"github.com/rdmavisor/rdmavisor/internal/verbs"
	"github.com/rdmavisor/rdmavisor/internal/verbs/soft/roce"
	"github.com/rdmavisor/rdmavisor/internal/verbs/soft/wire"
)

// What the kernel's rxe does on the wire where we first did otherwise,
// found by running against it (internal/verbs/interop, make test-rxe).

// tapWire records the opcode and AETH MSN of every RC response it sends,
// and the PSN of every request that asks for an ACK.
type tapWire struct {
	wire.Wire
	mu      sync.Mutex
	msns    []tapped // guarded by mu
	ackReqs []uint32 // guarded by mu
}

type tapped struct {
	op  roce.Opcode
	msn uint32
}

func (w *tapWire) Send(pkts []wire.Packet) (int, error) {
	w.mu.Lock()
	for _, p := range pkts {
		b := p.Buf[:p.N]
		if op := roce.Opcode(b[0]); op.IsResponse() && len(b) >= roce.BTHLen+roce.AETHLen && op != roce.RCReadResponseMiddle {
			w.msns = append(w.msns, tapped{op, binary.BigEndian.Uint32(b[roce.BTHLen:]) & roce.Mask24})
		} else if !op.IsResponse() && b[8]&0x80 != 0 {
			w.ackReqs = append(w.ackReqs, binary.BigEndian.Uint32(b[8:])&roce.Mask24)
		}
	}
	w.mu.Unlock()
	return w.Wire.Send(pkts)
}

// TestReadResponsesCountTheRead: a responder counts an RDMA READ in its
// MSN before it answers, so every response of the read carries the MSN
// that includes it (rxe: read responses of the n-th message say n).
func TestReadResponsesCountTheRead(t *testing.T) {
	p := newTapPair(t)
	cqa, qa, mra, cqb, qb, mrb, tb := p.cqa, p.qa, p.mra, p.cqb, p.qb, p.mrb, p.tb
	var wc [1]verbs.WC
	// Message 1, a SEND; 2, a 3-packet READ; 3, a WRITE.
	if _, err := qb.PostRecv([]verbs.RecvWR{{WRID: 1, NumSGE: 1, SG: sge(mrb, 0, 100)}}); err != nil {
		t.Fatal(err)
	}
	wrs := []verbs.SendWR{
		{WRID: 1, Opcode: verbs.WRSend, Flags: verbs.SendSignaled, NumSGE: 1, SG: sge(mra, 0, 100)},
		{WRID: 2, Opcode: verbs.WRRDMARead, Flags: verbs.SendSignaled, NumSGE: 1, SG: sge(mra, 0, 3000), RemoteAddr: mrb.Addr(), RKey: mrb.RKey()},
		{WRID: 3, Opcode: verbs.WRRDMAWrite, Flags: verbs.SendSignaled, NumSGE: 1, SG: sge(mra, 0, 10), RemoteAddr: mrb.Addr(), RKey: mrb.RKey()},
	}
	for _, w := range wrs {
		if _, err := qa.PostSend([]verbs.SendWR{w}); err != nil {
			t.Fatal(err)
		}
		pollOne(t, cqa, wc[:])
	}
	pollOne(t, cqb, wc[:])
	tb.mu.Lock()
	got := tb.msns
	tb.mu.Unlock()
	want := []tapped{{roce.RCAck, 1}, {roce.RCReadResponseFirst, 2}, {roce.RCReadResponseLast, 2}, {roce.RCAck, 3}}
	if len(got) != len(want) {
		t.Fatalf("responses %v, want %v", got, want)
	}
	for i := range want {
		if got[i] != want[i] {
			t.Errorf("response %d: %v MSN %d, want %v MSN %d", i, got[i].op, got[i].msn, want[i].op, want[i].msn)
		}
	}
}

// TestAckReqEvery66: a long message asks for an ACK as rxe's does, on the
// packet after more than 64 that did not (RXE_MAX_PKT_PER_ACK), and on its
// last packet.
func TestAckReqEvery66(t *testing.T) {
	p := newTapPair(t)
	var wc [1]verbs.WC
	w := verbs.SendWR{WRID: 1, Opcode: verbs.WRRDMAWrite, Flags: verbs.SendSignaled, NumSGE: 1, SG: sge(p.mra, 0, 200*1024),
		RemoteAddr: p.mrb.Addr(), RKey: p.mrb.RKey()}
	if _, err := p.qa.PostSend([]verbs.SendWR{w}); err != nil {
		t.Fatal(err)
	}
	pollOne(t, p.cqa, wc[:])
	p.ta.mu.Lock()
	got := p.ta.ackReqs
	p.ta.mu.Unlock()
	if want := []uint32{65, 131, 197, 199}; fmt.Sprint(got) != fmt.Sprint(want) {
		t.Errorf("PSNs asking for an ACK %v, want %v", got, want)
	}
}

type tapPair struct {
	cqa, cqb verbs.CQ
	qa, qb   verbs.QP
	mra, mrb verbs.MR
	ta, tb   *tapWire
}

// newTapPair connects two RC QPs at MTU 1024 from PSN 0 on tapped wires.
func newTapPair(t *testing.T) *tapPair {
	fb := wire.NewFabric(wire.Faults{})
	open := func(ip string) (*Device, *tapWire) {
		w, err := fb.Attach(verbs.GIDFromAddr(netip.MustParseAddr(ip)))
		if err != nil {
			t.Fatal(err)
		}
		tw := &tapWire{Wire: w}
		d, err := Open(Config{Wire: tw})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = d.Close() })
		return d, tw
	}
	da, ta := open("10.2.0.1")
	db, tb := open("10.2.0.2")
	side := func(d *Device) (verbs.CQ, verbs.QP, verbs.MR) {
		pd, _ := d.AllocPD()
		cq, _ := d.CreateCQ(64)
		qp, err := pd.CreateQP(&verbs.QPInitAttr{Type: verbs.QPTypeRC, SendCQ: cq, RecvCQ: cq, Cap: verbs.QPCap{MaxSendWR: 16, MaxRecvWR: 16, MaxSendSGE: 1, MaxRecvSGE: 1}})
		if err != nil {
			t.Fatal(err)
		}
		mr, err := pd.RegMR(1<<18, verbs.AccessLocalWrite|verbs.AccessRemoteWrite|verbs.AccessRemoteRead)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = qp.Close(); _ = mr.Close(); _ = cq.Close(); _ = pd.Close() })
		return cq, qp, mr
	}
	cqa, qa, mra := side(da)
	cqb, qb, mrb := side(db)
	connectRC(t, qa, qb.QPN(), db.gid, verbs.MTU1024)
	connectRC(t, qb, qa.QPN(), da.gid, verbs.MTU1024)
	return &tapPair{cqa: cqa, cqb: cqb, qa: qa, qb: qb, mra: mra, mrb: mrb, ta: ta, tb: tb}
}

// TestUDNetworkHeader: the GRH space of a UD receive holds the IP header
// the datagram came in, as rxe's build_rdma_network_hdr writes it: for
// IPv4, 20 zero bytes and then the IPv4 header (with a valid checksum);
// for IPv6, the IPv6 header.
func TestUDNetworkHeader(t *testing.T) {
	g := func(s string) verbs.GID { return verbs.GIDFromAddr(netip.MustParseAddr(s)) }
	var grh [verbs.GRHSize]byte
	putNetworkHeader(&grh, g("10.99.0.2"), g("10.99.0.1"), 1040)
	want := [verbs.GRHSize]byte{20: 0x45, 22: 0x04, 23: 0x2c, 26: 0x40, 28: 64, 29: 17,
		32: 10, 33: 99, 35: 2, 36: 10, 37: 99, 39: 1}
	var sum uint32
	for i := 20; i < 40; i += 2 {
		sum += uint32(binary.BigEndian.Uint16(grh[i:]))
	}
	sum = sum&0xffff + sum>>16
	if sum != 0xffff {
		t.Errorf("IPv4 header checksum does not check: sum %#x", sum)
	}
	grh[30], grh[31] = 0, 0
	if grh != want {
		t.Errorf("IPv4 GRH space % x\n\t\t\t\twant % x", grh, want)
	}
	putNetworkHeader(&grh, g("fd00::2"), g("fd00::1"), 1040)
	if grh[0] != 0x60 || binary.BigEndian.Uint16(grh[4:]) != 1048 || grh[6] != 17 ||
		verbs.GID(grh[8:24]) != g("fd00::2") || verbs.GID(grh[24:40]) != g("fd00::1") {
		t.Errorf("IPv6 GRH space % x", grh)
	}
}

// TestDuplicateAcked: a duplicate SEND or WRITE packet is acknowledged
// even when it does not ask (IBA C9-105; rxe ACKs every one), so a
// requester that lost our ACK and retransmits packets that do not ask still
// hears from us.
func TestDuplicateAcked(t *testing.T) {
	p := newTapPair(t)
	var wc [1]verbs.WC
	w := verbs.SendWR{WRID: 1, Opcode: verbs.WRRDMAWrite, Flags: verbs.SendSignaled, NumSGE: 1, SG: sge(p.mra, 0, 3*1024),
		RemoteAddr: p.mrb.Addr(), RKey: p.mrb.RKey()}
	if _, err := p.qa.PostSend([]verbs.SendWR{w}); err != nil {
		t.Fatal(err)
	}
	pollOne(t, p.cqa, wc[:])
	da, db := p.qa.(*qp).dev, p.qb.(*qp).dev
	h := roce.Header{Opcode: roce.RCWriteMiddle, PKey: 0xffff, DestQPN: p.qb.QPN(), PSN: 1} // no AckReq
	b := make([]byte, roce.MaxPacketLen(1024))
	n, err := roce.Encode(b, &h, make([]byte, 1024), da.self, db.self)
	if err != nil {
		t.Fatal(err)
	}
	p.tb.mu.Lock()
	before := len(p.tb.msns)
	p.tb.mu.Unlock()
	rx := &rxState{dev: db, tx: newTxq(db.w, roce.MaxPacketLen(4096), 8, &db.stats), reqTx: newTxq(db.w, roce.MaxPacketLen(4096), 8, &db.stats)}
	rx.handle(b[:n], da.gid, 0)
	rx.endBatch()
	p.tb.mu.Lock()
	got := p.tb.msns[before:]
	p.tb.mu.Unlock()
	if len(got) != 1 || got[0] != (tapped{roce.RCAck, 1}) {
		t.Errorf("responses to a duplicate WRITE middle packet: %v, want one ACK with MSN 1", got)
	}
}
