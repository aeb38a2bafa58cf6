package soft

import (
	"bytes"
	"net"
	"net/netip"
	"sync"
	"testing"
	"time"

	"github.com/rdmavisor/rdmavisor/internal/verbs"
	"github.com/rdmavisor/rdmavisor/internal/verbs/soft/roce"
	"github.com/rdmavisor/rdmavisor/internal/verbs/soft/wire"
)

// chanNet is a minimal lossless wire for the provider's own unit tests.
type chanNet struct {
	mu  sync.Mutex
	eps map[verbs.GID]*chanWire
}

type chanWire struct {
	n    *chanNet
	gid  verbs.GID
	ch   chan []byte
	from chan verbs.GID
	done chan struct{}
	once sync.Once
}

func (n *chanNet) attach(ip string) *chanWire {
	g := verbs.GIDFromAddr(netip.MustParseAddr(ip))
	w := &chanWire{n: n, gid: g, ch: make(chan []byte, 8192), from: make(chan verbs.GID, 8192), done: make(chan struct{})}
	n.mu.Lock()
	if n.eps == nil {
		n.eps = map[verbs.GID]*chanWire{}
	}
	n.eps[g] = w
	n.mu.Unlock()
	return w
}

func (w *chanWire) LocalGID() verbs.GID { return w.gid }
func (w *chanWire) Stats() wire.Stats   { return wire.Stats{} }
func (w *chanWire) Close() error {
	w.once.Do(func() { close(w.done) })
	return nil
}
func (w *chanWire) Send(pkts []wire.Packet) (int, error) {
	for i := range pkts {
		w.n.mu.Lock()
		dst := w.n.eps[pkts[i].Addr]
		w.n.mu.Unlock()
		if dst == nil {
			continue
		}
		b := append([]byte(nil), pkts[i].Buf[:pkts[i].N]...)
		dst.ch <- b
		dst.from <- w.gid
	}
	return len(pkts), nil
}
func (w *chanWire) Recv(pkts []wire.Packet) (int, error) {
	select {
	case b := <-w.ch:
		pkts[0].N = copy(pkts[0].Buf, b)
		pkts[0].Addr = <-w.from
		return 1, nil
	case <-w.done:
		return 0, net.ErrClosed
	}
}

func TestSmokeRCSend(t *testing.T) {
	var n chanNet
	da, err := Open(Config{Wire: n.attach("10.0.0.1")})
	if err != nil {
		t.Fatal(err)
	}
	db, err := Open(Config{Wire: n.attach("10.0.0.2")})
	if err != nil {
		t.Fatal(err)
	}
	mk := func(d *Device) (verbs.PD, verbs.CQ, verbs.QP, verbs.MR) {
		pd, _ := d.AllocPD()
		cq, _ := d.CreateCQ(64)
		qp, err := pd.CreateQP(&verbs.QPInitAttr{Type: verbs.QPTypeRC, SendCQ: cq, RecvCQ: cq, Cap: verbs.QPCap{MaxSendWR: 16, MaxRecvWR: 16, MaxSendSGE: 1, MaxRecvSGE: 1}})
		if err != nil {
			t.Fatal(err)
		}
		mr, err := pd.RegMR(1<<20, verbs.AccessLocalWrite|verbs.AccessRemoteWrite|verbs.AccessRemoteRead)
		if err != nil {
			t.Fatal(err)
		}
		return pd, cq, qp, mr
	}
	_, cqa, qa, mra := mk(da)
	_, cqb, qb, mrb := mk(db)
	connect := func(q verbs.QP, peer verbs.QP, peerDev *Device) {
		g, _ := peerDev.GID(0)
		if err := q.Modify(&verbs.QPAttr{State: verbs.QPStateInit, Port: 1, AccessFlags: verbs.AccessRemoteWrite | verbs.AccessRemoteRead}, verbs.QPAttrState|verbs.QPAttrPKeyIndex|verbs.QPAttrPort|verbs.QPAttrAccessFlags); err != nil {
			t.Fatal(err)
		}
		if err := q.Modify(&verbs.QPAttr{State: verbs.QPStateRTR, PathMTU: verbs.MTU1024, DestQPN: peer.QPN(), RQPSN: 100, AH: verbs.AHAttr{DGID: g}, MaxDestRdAtomic: 1, MinRNRTimer: 1},
			verbs.QPAttrState|verbs.QPAttrAV|verbs.QPAttrPathMTU|verbs.QPAttrDestQPN|verbs.QPAttrRQPSN|verbs.QPAttrMaxDestRdAtomic|verbs.QPAttrMinRNRTimer); err != nil {
			t.Fatal(err)
		}
		if err := q.Modify(&verbs.QPAttr{State: verbs.QPStateRTS, SQPSN: 100, Timeout: 10, RetryCnt: 7, RNRRetry: 7, MaxRdAtomic: 1},
			verbs.QPAttrState|verbs.QPAttrSQPSN|verbs.QPAttrTimeout|verbs.QPAttrRetryCnt|verbs.QPAttrRNRRetry|verbs.QPAttrMaxQPRdAtomic); err != nil {
			t.Fatal(err)
		}
	}
	connect(qa, qb, db)
	connect(qb, qa, da)

	msg := bytes.Repeat([]byte("rdmavisor"), 500) // 4500 bytes: 5 packets
	copy(mra.Bytes(), msg)
	if _, err := qb.PostRecv([]verbs.RecvWR{{WRID: 7, NumSGE: 1, SG: [verbs.MaxSGE]verbs.SGE{{Addr: mrb.Addr(), Length: 8192, LKey: mrb.LKey()}}}}); err != nil {
		t.Fatal(err)
	}
	if _, err := qa.PostSend([]verbs.SendWR{{WRID: 1, Opcode: verbs.WRSendWithImm, ImmData: 42, Flags: verbs.SendSignaled, NumSGE: 1, SG: [verbs.MaxSGE]verbs.SGE{{Addr: mra.Addr(), Length: uint32(len(msg)), LKey: mra.LKey()}}}}); err != nil {
		t.Fatal(err)
	}
	wait := func(cq verbs.CQ) verbs.WC {
		var wc [1]verbs.WC
		deadline := time.Now().Add(5 * time.Second)
		for time.Now().Before(deadline) {
			if cq.Poll(wc[:]) == 1 {
				return wc[0]
			}
			time.Sleep(time.Millisecond)
		}
		t.Fatal("timeout")
		return verbs.WC{}
	}
	rwc := wait(cqb)
	if rwc.Status != verbs.WCSuccess || rwc.ByteLen != uint32(len(msg)) || rwc.ImmData != 42 || !bytes.Equal(mrb.Bytes()[:len(msg)], msg) {
		t.Fatalf("recv wc %+v", rwc)
	}
	swc := wait(cqa)
	if swc.Status != verbs.WCSuccess || swc.WRID != 1 {
		t.Fatalf("send wc %+v", swc)
	}
	// RDMA read back what b holds into a at offset 64K.
	if _, err := qa.PostSend([]verbs.SendWR{{WRID: 2, Opcode: verbs.WRRDMARead, Flags: verbs.SendSignaled, RemoteAddr: mrb.Addr(), RKey: mrb.RKey(), NumSGE: 1, SG: [verbs.MaxSGE]verbs.SGE{{Addr: mra.Addr() + 65536, Length: uint32(len(msg)), LKey: mra.LKey()}}}}); err != nil {
		t.Fatal(err)
	}
	if wc := wait(cqa); wc.Status != verbs.WCSuccess || wc.Opcode != verbs.WCRDMARead || !bytes.Equal(mra.Bytes()[65536:65536+len(msg)], msg) {
		t.Fatalf("read wc %+v", wc)
	}
	t.Logf("a %+v", da.Stats())
	t.Logf("b %+v", db.Stats())
}

func mustAddr(s string) netip.Addr { return netip.MustParseAddr(s) }

// The wire must carry the largest packet the provider builds.
func TestPacketFitsWire(t *testing.T) {
	if n := roce.MaxPacketLen(4096); n > wire.MaxPacketLen {
		t.Fatalf("a 4096-MTU packet is up to %d bytes; the wire carries %d", n, wire.MaxPacketLen)
	}
}
