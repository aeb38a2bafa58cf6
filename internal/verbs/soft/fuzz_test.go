package soft

import (
	"encoding/binary"
	"testing"

	"github.com/rdmavisor/rdmavisor/internal/verbs"
	"github.com/rdmavisor/rdmavisor/internal/verbs/soft/roce"
)

// fuzzRig is a device B with connected RC, UC and UD QPs whose peer is
// device A; packets are injected into B's receive path directly.
type fuzzRig struct {
	a, b   *Device
	qps    []*qp
	close  func()
	srcGID verbs.GID
}

func newFuzzRig(t testing.TB) *fuzzRig {
	var n chanNet
	wa, wb := n.attach("10.0.0.1"), n.attach("10.0.0.2")
	a, err := Open(Config{Wire: wa})
	if err != nil {
		t.Fatal(err)
	}
	b, err := Open(Config{Wire: wb})
	if err != nil {
		t.Fatal(err)
	}
	r := &fuzzRig{a: a, b: b, srcGID: wa.LocalGID()}
	pdB, _ := b.AllocPD()
	cqB, _ := b.CreateCQ(256)
	mrB, _ := pdB.RegMR(1<<16, verbs.AccessLocalWrite|verbs.AccessRemoteWrite|verbs.AccessRemoteRead)
	for _, typ := range []verbs.QPType{verbs.QPTypeRC, verbs.QPTypeUC, verbs.QPTypeUD} {
		q, err := pdB.CreateQP(&verbs.QPInitAttr{Type: typ, SendCQ: cqB, RecvCQ: cqB, Cap: verbs.QPCap{MaxSendWR: 8, MaxRecvWR: 8, MaxSendSGE: 1, MaxRecvSGE: 1}})
		if err != nil {
			t.Fatal(err)
		}
		mustRTS(t, q, typ, wa.LocalGID(), 0x11)
		var wrs [4]verbs.RecvWR
		for i := range wrs {
			wrs[i] = verbs.RecvWR{WRID: uint64(i), NumSGE: 1, SG: [verbs.MaxSGE]verbs.SGE{{Addr: mrB.Addr() + uint64(i)*8192, Length: 8192, LKey: mrB.LKey()}}}
		}
		if _, err := q.PostRecv(wrs[:]); err != nil {
			t.Fatal(err)
		}
		r.qps = append(r.qps, q.(*qp))
	}
	r.close = func() {
		for _, q := range r.qps {
			_ = q.Close()
		}
		_ = mrB.Close()
		_ = cqB.Close()
		_ = pdB.Close()
		_ = a.Close()
		_ = b.Close()
	}
	return r
}

func mustRTS(t testing.TB, q verbs.QP, typ verbs.QPType, dgid verbs.GID, dqpn uint32) {
	t.Helper()
	steps := []struct {
		a verbs.QPAttr
		m verbs.QPAttrMask
	}{}
	switch typ {
	case verbs.QPTypeUD:
		steps = append(steps,
			struct {
				a verbs.QPAttr
				m verbs.QPAttrMask
			}{verbs.QPAttr{State: verbs.QPStateInit, Port: 1, QKey: 0x1111}, verbs.QPAttrState | verbs.QPAttrPKeyIndex | verbs.QPAttrPort | verbs.QPAttrQKey},
			struct {
				a verbs.QPAttr
				m verbs.QPAttrMask
			}{verbs.QPAttr{State: verbs.QPStateRTR}, verbs.QPAttrState},
			struct {
				a verbs.QPAttr
				m verbs.QPAttrMask
			}{verbs.QPAttr{State: verbs.QPStateRTS}, verbs.QPAttrState | verbs.QPAttrSQPSN})
	default:
		rtr := verbs.QPAttrState | verbs.QPAttrAV | verbs.QPAttrPathMTU | verbs.QPAttrDestQPN | verbs.QPAttrRQPSN
		rts := verbs.QPAttrState | verbs.QPAttrSQPSN
		if typ == verbs.QPTypeRC {
			rtr |= verbs.QPAttrMaxDestRdAtomic | verbs.QPAttrMinRNRTimer
			rts |= verbs.QPAttrTimeout | verbs.QPAttrRetryCnt | verbs.QPAttrRNRRetry | verbs.QPAttrMaxQPRdAtomic
		}
		steps = append(steps,
			struct {
				a verbs.QPAttr
				m verbs.QPAttrMask
			}{verbs.QPAttr{State: verbs.QPStateInit, Port: 1, AccessFlags: verbs.AccessRemoteWrite | verbs.AccessRemoteRead}, verbs.QPAttrState | verbs.QPAttrPKeyIndex | verbs.QPAttrPort | verbs.QPAttrAccessFlags},
			struct {
				a verbs.QPAttr
				m verbs.QPAttrMask
			}{verbs.QPAttr{State: verbs.QPStateRTR, PathMTU: verbs.MTU1024, DestQPN: dqpn, AH: verbs.AHAttr{DGID: dgid}, MinRNRTimer: 1}, rtr},
			struct {
				a verbs.QPAttr
				m verbs.QPAttrMask
			}{verbs.QPAttr{State: verbs.QPStateRTS, Timeout: 10, RetryCnt: 3, RNRRetry: 3}, rts})
	}
	for _, s := range steps {
		if err := q.Modify(&s.a, s.m); err != nil {
			t.Fatal(err)
		}
	}
}

// checkInvariants fails if a QP's queues are inconsistent.
func (r *fuzzRig) checkInvariants(t testing.TB) {
	for _, q := range r.qps {
		q.mu.Lock()
		rq := q.req
		st := q.state
		q.mu.Unlock()
		if !(rq.head <= rq.cur && rq.cur <= rq.tail && rq.tail-rq.head <= uint64(len(rq.sq))) {
			t.Fatalf("%v QP in %v: send queue head %d cur %d tail %d", q.typ, st, rq.head, rq.cur, rq.tail)
		}
		if st != verbs.QPStateRTS && st != verbs.QPStateErr {
			t.Fatalf("%v QP in state %v", q.typ, st)
		}
	}
}

func fuzzSeeds(f *testing.F) {
	src := roce.Endpoint{GID: verbs.GIDFromAddr(mustAddr("10.0.0.1")), Port: roce.DefaultPort}
	dst := roce.Endpoint{GID: verbs.GIDFromAddr(mustAddr("10.0.0.2")), Port: roce.DefaultPort}
	payload := make([]byte, 1024)
	for _, h := range []roce.Header{
		{Opcode: roce.RCSendOnly, DestQPN: firstQPN, AckReq: true},
		{Opcode: roce.RCSendFirst, DestQPN: firstQPN},
		{Opcode: roce.RCWriteOnlyImm, DestQPN: firstQPN, RKey: 0x101, DMALen: 16, Imm: 9},
		{Opcode: roce.RCReadRequest, DestQPN: firstQPN, RKey: 0x101, DMALen: 4096},
		{Opcode: roce.RCAck, DestQPN: firstQPN, Syndrome: roce.NakSyndrome(roce.NakRemoteAccess)},
		{Opcode: roce.RCReadResponseOnly, DestQPN: firstQPN},
		{Opcode: roce.UCSendOnlyImm, DestQPN: firstQPN + 1},
		{Opcode: roce.UCWriteFirst, DestQPN: firstQPN + 1, DMALen: 3000},
		{Opcode: roce.UDSendOnly, DestQPN: firstQPN + 2, QKey: 0x1111, SrcQPN: 5},
	} {
		b := make([]byte, roce.MaxPacketLen(1024))
		pl := payload
		if !h.Opcode.HasPayload() {
			pl = nil
		} else if h.DMALen == 16 {
			pl = payload[:16]
		}
		n, err := roce.Encode(b, &h, pl, src, dst)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(b[:n])
	}
}

// FuzzRx feeds arbitrary bytes to a device's receive path: they must be
// dropped and counted, never panic or break a QP's invariants.
func FuzzRx(f *testing.F) {
	fuzzSeeds(f)
	f.Fuzz(func(t *testing.T, b []byte) {
		r := newFuzzRig(t)
		defer r.close()
		rx := &rxState{dev: r.b, tx: newTxq(r.b.w, roce.MaxPacketLen(4096), 8, &r.b.stats), reqTx: newTxq(r.b.w, roce.MaxPacketLen(4096), 8, &r.b.stats)}
		rx.handle(b, r.srcGID, 0)
		rx.endBatch()
		r.checkInvariants(t)
	})
}

// FuzzRxSealed is FuzzRx for packets that pass the ICRC: the mutated bytes
// are re-sealed and aimed at a live QP, so the fuzzer reaches the
// transport state machines rather than the checksum.
func FuzzRxSealed(f *testing.F) {
	fuzzSeeds(f)
	src := roce.Endpoint{GID: verbs.GIDFromAddr(mustAddr("10.0.0.1")), Port: roce.DefaultPort}
	dst := roce.Endpoint{GID: verbs.GIDFromAddr(mustAddr("10.0.0.2")), Port: roce.DefaultPort}
	f.Fuzz(func(t *testing.T, b []byte) {
		if len(b) < roce.BTHLen+roce.ICRCLen {
			return
		}
		op := roce.Opcode(b[0])
		hl := roce.HeaderLen(op)
		if !op.Valid() || hl+roce.ICRCLen > len(b) {
			return
		}
		r := newFuzzRig(t)
		defer r.close()
		pkt := make([]byte, len(b)+8)
		copy(pkt, b)
		binary.BigEndian.PutUint32(pkt[4:], uint32(pkt[4])<<24|r.qps[int(b[len(b)-1])%len(r.qps)].qpn)
		pl := len(b) - hl - roce.ICRCLen
		if !op.HasPayload() {
			pl = 0
		}
		n, err := roce.Seal(pkt, hl, pl, src, dst)
		if err != nil {
			return
		}
		rx := &rxState{dev: r.b, tx: newTxq(r.b.w, roce.MaxPacketLen(4096), 8, &r.b.stats), reqTx: newTxq(r.b.w, roce.MaxPacketLen(4096), 8, &r.b.stats)}
		rx.handle(pkt[:n], r.srcGID, 0)
		rx.handle(pkt[:n], r.srcGID, 0) // and its duplicate
		rx.endBatch()
		r.checkInvariants(t)
	})
}
