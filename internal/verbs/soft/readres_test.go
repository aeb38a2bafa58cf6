package soft

import (
	"encoding/binary"
	"net/netip"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/rdmavisor/rdmavisor/internal/verbs"
	"github.com/rdmavisor/rdmavisor/internal/verbs/soft/roce"
	"github.com/rdmavisor/rdmavisor/internal/verbs/soft/wire"
)

// TestReadResources: which duplicate READs the responder answers again.
// The wire-level check, against rxe, is interop's TestRCDuplicateRead; the
// engine's, with a spoofer, TestSpoofedRead.
func TestReadResources(t *testing.T) {
	var r readResources
	r.reset(3) // rounded up to 4, as rxe does
	if len(r.res) != 4 {
		t.Fatalf("%d resources for max_dest_rd_atomic 3, want 4", len(r.res))
	}
	const key = 0x1234
	r.record(psnMask-1, 4, key, 0x1000, 4096) // PSNs 0xfffffe..0x000001
	cases := []struct {
		what string
		psn  uint32
		rkey uint32
		va   uint64
		n    uint32
		want bool
	}{
		{"the read again", psnMask - 1, key, 0x1000, 4096, true},
		{"its tail from its last PSN, past the PSN wrap", 1, key, 0x1000 + 3072, 1024, true},
		{"a zero-length part", 0, key, 0x2000, 0, true},
		{"more than it read", psnMask - 1, key, 0x1000, 4097, false},
		{"bytes before it", psnMask - 1, key, 0xfff, 16, false},
		{"bytes after it", 1, key, 0x1c01, 1024, false},
		{"another key", psnMask - 1, key + 1, 0x1000, 16, false},
		{"a PSN before it", psnMask - 2, key, 0x1000, 16, false},
		{"a PSN after it", 2, key, 0x1000, 16, false},
	}
	for _, c := range cases {
		if got := r.replay(c.psn, c.rkey, c.va, c.n); got != c.want {
			t.Errorf("%s: replay %v, want %v", c.what, got, c.want)
		}
	}
	// Four more reads take the place of the first.
	for i := range uint32(4) {
		r.record(100+i, 1, key, 0x1000, 16)
	}
	if r.replay(psnMask-1, key, 0x1000, 4096) {
		t.Error("a read four reads old is still answered with 4 resources")
	}
	if !r.replay(103, key, 0x1000, 16) {
		t.Error("the latest read is not answered again")
	}
	r.reset(0)
	r.record(5, 1, key, 0, 16)
	if r.replay(5, key, 0, 16) {
		t.Error("a responder without read resources answers a read again")
	}
}

// TestReadWithoutRdAtomic: a responder whose max_dest_rd_atomic is 0
// takes no READ: the reader's completion is a remote invalid request
// error, as rxe answers (RESPST_ERR_TOO_MANY_RDMA_ATM_REQ), and its QP
// fails.
func TestReadWithoutRdAtomic(t *testing.T) {
	fb := wire.NewFabric(wire.Faults{})
	t.Cleanup(func() { _ = fb.Close() })
	p := newRCPair(t, fb, verbs.MTU1024)
	// A second pair of QPs on the same devices, b's taking no reads.
	pda, err := p.da.AllocPD()
	if err != nil {
		t.Fatal(err)
	}
	pdb, err := p.db.AllocPD()
	if err != nil {
		t.Fatal(err)
	}
	qa, err := pda.CreateQP(&verbs.QPInitAttr{Type: verbs.QPTypeRC, SendCQ: p.cqa, RecvCQ: p.cqa, Cap: verbs.QPCap{MaxSendWR: 4, MaxRecvWR: 4, MaxSendSGE: 1, MaxRecvSGE: 1}})
	if err != nil {
		t.Fatal(err)
	}
	qb, err := pdb.CreateQP(&verbs.QPInitAttr{Type: verbs.QPTypeRC, SendCQ: p.cqb, RecvCQ: p.cqb, Cap: verbs.QPCap{MaxSendWR: 4, MaxRecvWR: 4, MaxSendSGE: 1, MaxRecvSGE: 1}})
	if err != nil {
		t.Fatal(err)
	}
	mra, err := pda.RegMR(4096, verbs.AccessLocalWrite)
	if err != nil {
		t.Fatal(err)
	}
	mrb, err := pdb.RegMR(4096, verbs.AccessLocalWrite|verbs.AccessRemoteRead)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _, _, _, _ = qa.Close(), qb.Close(), mra.Close(), mrb.Close(); _, _ = pda.Close(), pdb.Close() })
	gid := func(ip string) verbs.GID { return verbs.GIDFromAddr(netip.MustParseAddr(ip)) }
	connectRC(t, qa, qb.QPN(), gid("10.1.0.2"), verbs.MTU1024)
	connectRCRdAtomic(t, qb, qa.QPN(), gid("10.1.0.1"), verbs.MTU1024, 0)
	wr := verbs.SendWR{WRID: 9, Opcode: verbs.WRRDMARead, NumSGE: 1, SG: sge(mra, 0, 64), RemoteAddr: mrb.Addr(), RKey: mrb.RKey(), Flags: verbs.SendSignaled}
	if _, err := qa.PostSend([]verbs.SendWR{wr}); err != nil {
		t.Fatal(err)
	}
	var wc [1]verbs.WC
	deadline := time.Now().Add(10 * time.Second)
	for p.cqa.Poll(wc[:]) == 0 {
		if time.Now().After(deadline) {
			t.Fatal("no completion for the read in 10 s")
		}
		runtime.Gosched()
	}
	if wc[0].WRID != 9 || wc[0].Status != verbs.WCRemInvReqErr {
		t.Fatalf("read's completion %+v, want a remote invalid request error", wc[0])
	}
}

// readHoldWire is a reader's wire that loses every READ response while
// hold is set, and counts the READ requests the reader sends by PSN.
type readHoldWire struct {
	wire.Wire
	hold atomic.Bool
	mu   sync.Mutex
	psns map[uint32]bool // guarded by mu
}

func (w *readHoldWire) Send(pkts []wire.Packet) (int, error) {
	w.mu.Lock()
	for _, p := range pkts {
		if p.N >= roce.BTHLen && roce.Opcode(p.Buf[0]) == roce.RCReadRequest {
			w.psns[binary.BigEndian.Uint32(p.Buf[8:])&roce.Mask24] = true
		}
	}
	w.mu.Unlock()
	return w.Wire.Send(pkts)
}

func (w *readHoldWire) Recv(pkts []wire.Packet) (int, error) {
	for {
		n, err := w.Wire.Recv(pkts)
		if err != nil || !w.hold.Load() {
			return n, err
		}
		k := 0
		for i := range pkts[:n] {
			if pkts[i].N > 0 && roce.Opcode(pkts[i].Buf[0]).IsReadResponse() {
				continue
			}
			pkts[i], pkts[k] = pkts[k], pkts[i]
			k++
		}
		if k > 0 {
			return k, nil
		}
	}
}

// TestReadsInFlightBounded: a reader with max_rd_atomic 2 whose responses
// are lost has two of its five READs on the wire, never more, however
// often it retransmits (rxe's requester waits alike), so that its peer,
// which answers a READ again only among the last max_dest_rd_atomic it
// executed, still holds each; once the responses pass, all five complete.
func TestReadsInFlightBounded(t *testing.T) {
	fb := wire.NewFabric(wire.Faults{})
	t.Cleanup(func() { _ = fb.Close() })
	gid := func(ip string) verbs.GID { return verbs.GIDFromAddr(netip.MustParseAddr(ip)) }
	wa, err := fb.Attach(gid("10.1.0.1"))
	if err != nil {
		t.Fatal(err)
	}
	hw := &readHoldWire{Wire: wa, psns: map[uint32]bool{}}
	hw.hold.Store(true)
	wb, err := fb.Attach(gid("10.1.0.2"))
	if err != nil {
		t.Fatal(err)
	}
	type end struct {
		cq verbs.CQ
		qp verbs.QP
		mr verbs.MR
	}
	open := func(w wire.Wire) end {
		d, err := Open(Config{Wire: w})
		if err != nil {
			t.Fatal(err)
		}
		pd, err := d.AllocPD()
		if err != nil {
			t.Fatal(err)
		}
		cq, err := d.CreateCQ(64)
		if err != nil {
			t.Fatal(err)
		}
		qp, err := pd.CreateQP(&verbs.QPInitAttr{Type: verbs.QPTypeRC, SendCQ: cq, RecvCQ: cq, Cap: verbs.QPCap{MaxSendWR: 16, MaxRecvWR: 4, MaxSendSGE: 1, MaxRecvSGE: 1}})
		if err != nil {
			t.Fatal(err)
		}
		mr, err := pd.RegMR(1<<16, verbs.AccessLocalWrite|verbs.AccessRemoteRead)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _, _, _, _, _ = qp.Close(), mr.Close(), cq.Close(), pd.Close(), d.Close() })
		return end{cq, qp, mr}
	}
	a, b := open(hw), open(wb)
	connectRCRdAtomic(t, a.qp, b.qp.QPN(), gid("10.1.0.2"), verbs.MTU1024, 2)
	connectRCRdAtomic(t, b.qp, a.qp.QPN(), gid("10.1.0.1"), verbs.MTU1024, 2)
	var wrs []verbs.SendWR
	for i := range 5 {
		wrs = append(wrs, verbs.SendWR{WRID: uint64(i), Opcode: verbs.WRRDMARead, NumSGE: 1, SG: sge(a.mr, uint64(i)*4096, 4096),
			RemoteAddr: b.mr.Addr() + uint64(i)*4096, RKey: b.mr.RKey(), Flags: verbs.SendSignaled})
	}
	if _, err := a.qp.PostSend(wrs); err != nil {
		t.Fatal(err)
	}
	time.Sleep(300 * time.Millisecond) // a few retransmissions (14: 67 ms)
	hw.mu.Lock()
	sent := len(hw.psns)
	hw.mu.Unlock()
	if sent != 2 {
		t.Errorf("READs on the wire with their responses lost: %d, want 2 (max_rd_atomic)", sent)
	}
	hw.hold.Store(false)
	var wc [1]verbs.WC
	deadline := time.Now().Add(10 * time.Second)
	for got := 0; got < 5; {
		if a.cq.Poll(wc[:]) == 0 {
			if time.Now().After(deadline) {
				t.Fatalf("%d of 5 reads completed in 10 s", got)
			}
			runtime.Gosched()
			continue
		}
		if wc[0].Status != verbs.WCSuccess || wc[0].WRID != uint64(got) {
			t.Fatalf("completion %d: %+v", got, wc[0])
		}
		got++
	}
}
