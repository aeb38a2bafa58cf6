package interop

import (
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"net"
	"net/netip"
	"os"
	"testing"
	"time"

	"github.com/rdmavisor/rdmavisor/internal/verbs"
	"github.com/rdmavisor/rdmavisor/internal/verbs/soft"
	"github.com/rdmavisor/rdmavisor/internal/verbs/soft/roce"
	"github.com/rdmavisor/rdmavisor/internal/verbs/soft/wire"
	"github.com/rdmavisor/rdmavisor/internal/verbs/verbstest"
)

// The two sides: RDMAVISOR_INTEROP=host runs the soft provider on UDP
// RDMAVISOR_HOST_IP:4791 and listens for the control connection there;
// RDMAVISOR_INTEROP=guest opens the guest's rxe0 and dials it. With
// RDMAVISOR_INTEROP=tools the host side plays the peer of rdma-core's and
// perftest's tools in the guest (tools_test.go). Unset, the tests skip:
// only hack/rxe-vm/interop.sh has the network they need.
const ctlPort = 18600

// Timeouts are generous: the guest is a TCG-emulated VM.
const (
	cqWait  = 60 * time.Second
	ctlWait = 120 * time.Second
)

const (
	mrSize  = 1 << 20
	sendOff = 0         // what we send, write or read into
	recvOff = 256 << 10 // where receives land
	tgtOff  = 512 << 10 // what the peer writes to or reads from
	qkey    = 0x11111111
	access  = verbs.AccessLocalWrite | verbs.AccessRemoteWrite | verbs.AccessRemoteRead
)

type side struct {
	host bool
	dev  verbs.Device
	pd   verbs.PD
	ctl  net.Conn
	enc  *json.Encoder
	dec  *json.Decoder
	dw   *dropWire    // host only
	sd   *soft.Device // host only

	broken string // the test that put the sides out of step
}

var me *side

func TestMain(m *testing.M) {
	role := os.Getenv("RDMAVISOR_INTEROP")
	if role != "" {
		var err error
		if me, err = setup(role); err != nil {
			fmt.Fprintln(os.Stderr, "interop:", err)
			os.Exit(1)
		}
	}
	rc := m.Run()
	if me != nil {
		if me.ctl != nil {
			_ = me.ctl.Close()
		}
		if err := me.pd.Close(); err != nil {
			fmt.Fprintln(os.Stderr, "interop: close PD:", err)
		}
		if err := me.dev.Close(); err != nil {
			fmt.Fprintln(os.Stderr, "interop: close device:", err)
		}
	}
	os.Exit(rc)
}

func setup(role string) (*side, error) {
	hostIP, err := netip.ParseAddr(os.Getenv("RDMAVISOR_HOST_IP"))
	if err != nil {
		return nil, fmt.Errorf("RDMAVISOR_HOST_IP: %w", err)
	}
	s := &side{host: role != "guest"}
	ctlAddr := netip.AddrPortFrom(hostIP, ctlPort).String()
	switch role {
	case "host", "tools":
		if os.Getenv("RDMAVISOR_INTEROP_IBV_HOST") == "1" {
			// rxe on both sides, by hand, for reference captures of what
			// rxe does with rxe (no drop wire: TestRCRecovery refuses).
			if s.dev, err = openIBV(); err != nil {
				return nil, fmt.Errorf("open the host's device: %w", err)
			}
			if ln, err := net.Listen("tcp", ctlAddr); err != nil {
				return nil, fmt.Errorf("control listen: %w", err)
			} else if s.ctl, err = ln.Accept(); err != nil {
				return nil, fmt.Errorf("control accept: %w", err)
			}
			break
		}
		u, err := wire.ListenUDP(wire.UDPConfig{Addr: hostIP})
		if err != nil {
			return nil, fmt.Errorf("listen udp: %w", err)
		}
		s.dw = &dropWire{Wire: u}
		// The bridge has a 9000-byte MTU: rxe0's active MTU is 4096.
		if s.sd, err = soft.Open(soft.Config{Name: "soft-host", Wire: s.dw, Port: u.Port()}); err != nil {
			_ = u.Close()
			return nil, fmt.Errorf("open soft: %w", err)
		}
		s.dev = s.sd
		if role == "tools" {
			// The peers are rdma-core's and perftest's tools, with their own
			// exchanges: no control connection.
			break
		}
		ln, err := net.Listen("tcp", ctlAddr)
		if err != nil {
			return nil, fmt.Errorf("control listen: %w", err)
		}
		_ = ln.(*net.TCPListener).SetDeadline(time.Now().Add(5 * time.Minute))
		s.ctl, err = ln.Accept()
		_ = ln.Close()
		if err != nil {
			return nil, fmt.Errorf("control accept: %w", err)
		}
	case "guest":
		// RDMAVISOR_INTEROP_SOFT_GUEST=IP plays the guest on the soft
		// provider instead, to check the harness without a VM.
		if ip := os.Getenv("RDMAVISOR_INTEROP_SOFT_GUEST"); ip != "" {
			s.dev, err = soft.OpenUDP(ip, wire.RoCEv2Port)
		} else {
			s.dev, err = openIBV()
		}
		if err != nil {
			return nil, fmt.Errorf("open the guest's device: %w", err)
		}
		deadline := time.Now().Add(2 * time.Minute)
		for {
			s.ctl, err = net.DialTimeout("tcp", ctlAddr, 5*time.Second)
			if err == nil || time.Now().After(deadline) {
				break
			}
			time.Sleep(200 * time.Millisecond)
		}
		if err != nil {
			return nil, fmt.Errorf("control dial %s: %w", ctlAddr, err)
		}
	default:
		return nil, fmt.Errorf("RDMAVISOR_INTEROP=%q: want host or guest", role)
	}
	if s.ctl != nil {
		s.enc, s.dec = json.NewEncoder(s.ctl), json.NewDecoder(s.ctl)
	}
	if s.pd, err = s.dev.AllocPD(); err != nil {
		return nil, fmt.Errorf("alloc PD: %w", err)
	}
	return s, nil
}

// need returns the side of this process, skipping outside interop.sh.
func need(t *testing.T) *side {
	t.Helper()
	if me == nil || me.ctl == nil {
		t.Skip("RDMAVISOR_INTEROP unset or tools: hack/rxe-vm/interop.sh runs these, one side on the host, one in an rxe guest")
	}
	me.sync(t, "begin "+t.Name())
	return me
}

// swap sends mine to the peer and decodes its value into theirs.
// Once the sides are out of step (one failed in the middle of an
// operation), every later exchange fails at once: the first failure is the
// one to read.
func (s *side) swap(t testing.TB, mine, theirs any) {
	t.Helper()
	if s.broken != "" {
		t.Fatalf("control: out of step since %s", s.broken)
	}
	_ = s.ctl.SetDeadline(time.Now().Add(ctlWait))
	if err := s.enc.Encode(mine); err != nil {
		s.broken = t.Name()
		t.Fatalf("control: send: %v", err)
	}
	if err := s.dec.Decode(theirs); err != nil {
		s.broken = t.Name()
		t.Fatalf("control: receive: %v", err)
	}
}

// sync waits for the peer to reach the same point; both must name it alike.
func (s *side) sync(t testing.TB, tag string) {
	t.Helper()
	var peer string
	s.swap(t, tag, &peer)
	if peer != tag {
		s.broken = t.Name()
		t.Fatalf("control: out of step: we are at %q, the peer at %q", tag, peer)
	}
}

// check tells the peer whether this side's checks passed and fails if the
// peer's did not, so each side's log says which side failed.
func (s *side) check(t testing.TB, what string) {
	t.Helper()
	var peerOK bool
	s.swap(t, !t.Failed(), &peerOK)
	if !peerOK {
		t.Fatalf("%s: the peer's checks failed (its log says why)", what)
	}
	if t.Failed() {
		t.FailNow() // as the peer does on hearing of it
	}
}

func (s *side) name() string {
	if s.host {
		return "soft"
	}
	return "rxe"
}

// info is what one end of a QP pair tells the other.
type info struct {
	QPN, PSN uint32
	GID      verbs.GID
	Addr     uint64
	RKey     uint32
}

// conn is one QP and its peer, with a memory region laid out as the
// offsets above say.
type conn struct {
	s        *side
	typ      verbs.QPType
	qp       verbs.QP
	scq, rcq verbs.CQ
	mr       verbs.MR
	ah       verbs.AH // UD
	peer     info
	sqPSN    uint32 // the PSN of its first request
	mtu      int
}

func (s *side) connect(t *testing.T, typ verbs.QPType, mtu verbs.MTU) *conn {
	t.Helper()
	c := &conn{s: s, typ: typ, mtu: mtu.Bytes()}
	c.scq = verbstest.CreateCQ(t, s.dev, 256)
	c.rcq = verbstest.CreateCQ(t, s.dev, 256)
	c.qp = verbstest.CreateQP(t, s.pd, verbs.QPInitAttr{Type: typ, SendCQ: c.scq, RecvCQ: c.rcq,
		Cap: verbs.QPCap{MaxSendWR: 64, MaxRecvWR: 64, MaxSendSGE: 1, MaxRecvSGE: 1}})
	c.mr = verbstest.RegMR(t, s.pd, mrSize, access)
	psn := rand.Uint32() & 0xffffff
	c.sqPSN = psn
	mine := info{QPN: c.qp.QPN(), PSN: psn, GID: verbstest.GID(t, s.dev), Addr: c.mr.Addr(), RKey: c.mr.RKey()}
	s.swap(t, mine, &c.peer)
	t.Logf("%s: %v QP %#x PSN %#x GID %v; peer QP %#x PSN %#x GID %v", s.name(), typ, mine.QPN, psn, mine.GID, c.peer.QPN, c.peer.PSN, c.peer.GID)
	if typ == verbs.QPTypeUD {
		if err := verbs.ActivateUD(c.qp, qkey, psn); err != nil {
			t.Fatal(err)
		}
		ah, err := s.pd.CreateAH(&verbs.AHAttr{DGID: c.peer.GID, PortNum: 1, HopLimit: 64})
		if err != nil {
			t.Fatalf("CreateAH: %v", err)
		}
		t.Cleanup(func() { _ = ah.Close() })
		c.ah = ah
	} else {
		// Timeout 14 (67 ms) and 7 retries: recovery in the tests below
		// takes one timeout at most, and a TCG guest is slow.
		err := verbs.ConnectQP(c.qp, verbs.Remote{GID: c.peer.GID, QPN: c.peer.QPN, PSN: c.peer.PSN},
			verbs.PathOptions{MTU: mtu, Access: access, SQPSN: psn, Timeout: 14, RetryCnt: 7})
		if err != nil {
			t.Fatal(err)
		}
	}
	s.sync(t, "connected")
	if s.sd != nil {
		t.Cleanup(func() {
			if t.Failed() {
				t.Logf("soft: %+v", s.sd.Stats())
			}
		})
	}
	return c
}

// isSender says whether this side plays the sender when fromSoft says who
// sends.
func (c *conn) isSender(fromSoft bool) bool { return c.s.host == fromSoft }

// seed makes each message's data pattern unique and known to both sides.
func seed(name string, n int) uint64 {
	var h uint64 = 14695981039346656037
	for _, b := range []byte(name) {
		h = (h ^ uint64(b)) * 1099511628211
	}
	return h ^ uint64(n)
}

func one(t testing.TB, cq verbs.CQ) verbs.WC {
	t.Helper()
	return verbstest.WaitCQ(t, cq, 1, cqWait)[0]
}

// send moves a SEND (with immediate when imm != nil) of n bytes from one
// side to the other and checks both completions and the bytes.
func (c *conn) send(t *testing.T, fromSoft bool, n int, imm *uint32, tag string) {
	t.Helper()
	s := c.s
	sd := seed(tag, n)
	grh := 0
	if c.typ == verbs.QPTypeUD {
		grh = verbs.GRHSize
	}
	if !c.isSender(fromSoft) {
		clear(c.mr.Bytes()[recvOff : recvOff+grh+n])
		verbstest.MustPostRecv(t, c.qp, verbstest.RecvWR(7, verbstest.SGE(c.mr, recvOff, grh+n)))
	}
	s.sync(t, "posted "+tag)
	if c.isSender(fromSoft) {
		verbstest.Fill(c.mr.Bytes()[sendOff:sendOff+n], sd)
		op := verbs.WRSend
		if imm != nil {
			op = verbs.WRSendWithImm
		}
		w := verbstest.SendWR(5, op, verbstest.SGE(c.mr, sendOff, n))
		if imm != nil {
			w.ImmData = *imm
		}
		if c.typ == verbs.QPTypeUD {
			w.AH, w.RemoteQPN, w.RemoteQKey = c.ah.Handle(), c.peer.QPN, qkey
		}
		verbstest.MustPostSend(t, c.qp, w)
		wc := one(t, c.scq)
		verbstest.CheckWC(t, wc, verbs.WC{WRID: 5, Status: verbs.WCSuccess, Opcode: verbs.WCSend, QPN: c.qp.QPN(), ByteLen: wc.ByteLen})
	} else {
		wc := one(t, c.rcq)
		want := verbs.WC{WRID: 7, Status: verbs.WCSuccess, Opcode: verbs.WCRecv, QPN: c.qp.QPN(), ByteLen: uint32(grh + n)}
		if imm != nil {
			want.Flags, want.ImmData = verbs.WCWithImm, *imm
		}
		if c.typ == verbs.QPTypeUD {
			want.Flags |= verbs.WCWithGRH
			want.SrcQP = c.peer.QPN
		}
		// PKeyIndex and the reserved flags are the provider's; the rest is ours.
		wc.PKeyIndex = 0
		verbstest.CheckWC(t, wc, want)
		if err := verbstest.Check(c.mr.Bytes()[recvOff+grh:recvOff+grh+n], sd); err != nil {
			t.Errorf("%s received: %v", s.name(), err)
		}
		if grh > 0 {
			c.checkGRH(t, c.mr.Bytes()[recvOff:recvOff+grh], n, imm != nil)
		}
	}
	s.check(t, "send "+tag)
}

// checkGRH checks the GRH space of a UD receive from an IPv4 peer: rxe
// puts the received IPv4 header in its last 20 bytes (union
// rdma_network_hdr) and zeroes the first 20.
func (c *conn) checkGRH(t *testing.T, g []byte, n int, imm bool) {
	t.Helper()
	peer, self := c.peer.GID.Addr().As4(), verbstest.GID(t, c.s.dev).Addr().As4()
	ip := g[20:40]
	var zero [20]byte
	immLen := 0
	if imm {
		immLen = roce.ImmDtLen
	}
	if string(g[:20]) != string(zero[:]) || ip[0] != 0x45 || ip[9] != 17 ||
		int(ip[2])<<8|int(ip[3]) != 20+8+roce.BTHLen+roce.DETHLen+immLen+n+pad(n)+roce.ICRCLen ||
		string(ip[12:16]) != string(peer[:]) || string(ip[16:20]) != string(self[:]) {
		t.Errorf("%s: GRH space of a UD receive from %v: % x; want 20 zero bytes, then the IPv4 header from %v to %v", c.s.name(), c.peer.GID, g, c.peer.GID, verbstest.GID(t, c.s.dev))
	}
}

func pad(n int) int { return -n & 3 }

// write has one side RDMA WRITE (with immediate when imm != nil) n bytes
// into the other's target area, which checks them.
func (c *conn) write(t *testing.T, fromSoft bool, n int, imm *uint32, tag string) {
	t.Helper()
	s := c.s
	sd := seed(tag, n)
	tgt := c.mr.Bytes()[tgtOff : tgtOff+n]
	if !c.isSender(fromSoft) {
		clear(tgt)
		if imm != nil {
			verbstest.MustPostRecv(t, c.qp, verbs.RecvWR{WRID: 9})
		}
	}
	s.sync(t, "ready "+tag)
	if c.isSender(fromSoft) {
		verbstest.Fill(c.mr.Bytes()[sendOff:sendOff+n], sd)
		op := verbs.WRRDMAWrite
		if imm != nil {
			op = verbs.WRRDMAWriteWithImm
		}
		w := verbstest.RDMAWR(6, op, c.peer.Addr+tgtOff, c.peer.RKey, verbstest.SGE(c.mr, sendOff, n))
		if imm != nil {
			w.ImmData = *imm
		}
		verbstest.MustPostSend(t, c.qp, w)
		wc := one(t, c.scq)
		verbstest.CheckWC(t, wc, verbs.WC{WRID: 6, Status: verbs.WCSuccess, Opcode: verbs.WCRDMAWrite, QPN: c.qp.QPN(), ByteLen: wc.ByteLen})
	}
	s.sync(t, "written "+tag)
	if !c.isSender(fromSoft) {
		if imm != nil {
			wc := one(t, c.rcq)
			wc.PKeyIndex = 0
			verbstest.CheckWC(t, wc, verbs.WC{WRID: 9, Status: verbs.WCSuccess, Opcode: verbs.WCRecvRDMAWithImm,
				Flags: verbs.WCWithImm, ImmData: *imm, QPN: c.qp.QPN(), ByteLen: uint32(n)})
		}
		// RC: the writer's completion means the data is here. UC: it may
		// still be on its way (the immediate's completion, when there is
		// one, says it is not).
		deadline := time.Now().Add(cqWait)
		for verbstest.Check(tgt, sd) != nil && c.typ == verbs.QPTypeUC && time.Now().Before(deadline) {
			time.Sleep(time.Millisecond)
		}
		if err := verbstest.Check(tgt, sd); err != nil {
			t.Errorf("%s: written bytes: %v", s.name(), err)
		}
	}
	s.check(t, "write "+tag)
}

// read has one side RDMA READ n bytes from the other's target area.
func (c *conn) read(t *testing.T, fromSoft bool, n int, tag string) {
	t.Helper()
	s := c.s
	sd := seed(tag, n)
	if !c.isSender(fromSoft) {
		verbstest.Fill(c.mr.Bytes()[tgtOff:tgtOff+n], sd)
	}
	s.sync(t, "filled "+tag)
	if c.isSender(fromSoft) {
		dst := c.mr.Bytes()[sendOff : sendOff+n]
		clear(dst)
		verbstest.MustPostSend(t, c.qp, verbstest.RDMAWR(8, verbs.WRRDMARead, c.peer.Addr+tgtOff, c.peer.RKey, verbstest.SGE(c.mr, sendOff, n)))
		wc := one(t, c.scq)
		verbstest.CheckWC(t, wc, verbs.WC{WRID: 8, Status: verbs.WCSuccess, Opcode: verbs.WCRDMARead, QPN: c.qp.QPN(), ByteLen: uint32(n)})
		if err := verbstest.Check(dst, sd); err != nil {
			t.Errorf("%s: read bytes: %v", s.name(), err)
		}
	}
	s.check(t, "read "+tag)
}

// both runs f once with soft sending, once with rxe sending.
func both(t *testing.T, f func(t *testing.T, fromSoft bool)) {
	t.Helper()
	for _, fromSoft := range []bool{true, false} {
		name := "rxe-to-soft"
		if fromSoft {
			name = "soft-to-rxe"
		}
		t.Run(name, func(t *testing.T) { f(t, fromSoft) })
	}
}

func immOf(tag string) *uint32 {
	v := uint32(seed(tag, 0))
	return &v
}

// TestRC: RC SEND, SEND with immediate, RDMA WRITE (with immediate) and
// READ both ways, single- and multi-packet, at MTU 1024 and 4096.
func TestRC(t *testing.T) {
	s := need(t)
	for _, mtu := range []verbs.MTU{verbs.MTU1024, verbs.MTU4096} {
		t.Run(fmt.Sprintf("mtu%d", mtu.Bytes()), func(t *testing.T) {
			c := s.connect(t, verbs.QPTypeRC, mtu)
			for _, n := range []int{0, 1, 1000, 3*mtu.Bytes() + 5, 200 << 10} {
				t.Run(fmt.Sprint(n), func(t *testing.T) {
					both(t, func(t *testing.T, fromSoft bool) {
						c.send(t, fromSoft, n, nil, t.Name()+"/send")
						c.send(t, fromSoft, n, immOf(t.Name()), t.Name()+"/sendimm")
						c.write(t, fromSoft, n, nil, t.Name()+"/write")
						c.write(t, fromSoft, n, immOf(t.Name()+"w"), t.Name()+"/writeimm")
						c.read(t, fromSoft, n, t.Name()+"/read")
					})
				})
			}
		})
	}
}

// TestUC: UC SEND (with immediate) and RDMA WRITE (with immediate) both
// ways, multi-packet.
func TestUC(t *testing.T) {
	s := need(t)
	c := s.connect(t, verbs.QPTypeUC, verbs.MTU1024)
	for _, n := range []int{1, 3*1024 + 5} {
		t.Run(fmt.Sprint(n), func(t *testing.T) {
			both(t, func(t *testing.T, fromSoft bool) {
				c.send(t, fromSoft, n, nil, t.Name()+"/send")
				c.send(t, fromSoft, n, immOf(t.Name()), t.Name()+"/sendimm")
				c.write(t, fromSoft, n, nil, t.Name()+"/write")
				c.write(t, fromSoft, n, immOf(t.Name()+"w"), t.Name()+"/writeimm")
			})
		})
	}
}

// TestUD: UD SEND and SEND with immediate both ways, up to the path MTU,
// with the source QPN and the GRH space checked.
func TestUD(t *testing.T) {
	s := need(t)
	c := s.connect(t, verbs.QPTypeUD, verbs.MTU4096)
	for _, n := range []int{1, 1000, 4096} {
		t.Run(fmt.Sprint(n), func(t *testing.T) {
			both(t, func(t *testing.T, fromSoft bool) {
				c.send(t, fromSoft, n, nil, t.Name()+"/send")
				c.send(t, fromSoft, n, immOf(t.Name()), t.Name()+"/sendimm")
			})
		})
	}
}

// drop arms the host's drop wire for one operation and checks afterwards
// that exactly the packets asked for were dropped. On the guest it does
// nothing: the guest only sees the recovery.
func (c *conn) drop(t *testing.T, tx, rx *dropRule) (check func()) {
	t.Helper()
	if !c.s.host {
		return func() {}
	}
	if c.s.dw == nil {
		t.Fatal("RDMAVISOR_INTEROP_IBV_HOST: no drop wire on rxe")
	}
	before := c.s.sd.Stats()
	done := c.s.dw.arm(tx, rx)
	return func() {
		t.Helper()
		txd, rxd := done()
		after := c.s.sd.Stats()
		wantTx, wantRx := 0, 0
		if tx != nil {
			wantTx = 1
		}
		if rx != nil {
			wantRx = 1
		}
		if txd != wantTx || rxd != wantRx {
			t.Errorf("dropped %d sent and %d received packets, want %d and %d", txd, rxd, wantTx, wantRx)
		}
		t.Logf("soft: retransmits %+d, timeouts %+d, NAKs sent %+d, out of sequence %+d, duplicates %+d",
			after.Retransmits-before.Retransmits, after.Timeouts-before.Timeouts, after.NAKsSent-before.NAKsSent,
			after.RxOutOfSequence-before.RxOutOfSequence, after.RxDuplicate-before.RxDuplicate)
	}
}

// TestRCRecovery drops one packet at a time on the host and checks that
// the operation still completes with the right bytes: a sequence NAK from
// rxe (soft's middle SEND packet lost), one from soft (rxe's lost), a lost
// ACK (soft's retransmit timer, rxe's duplicate), lost read responses
// either way (the reader re-reads from the gap).
func TestRCRecovery(t *testing.T) {
	s := need(t)
	c := s.connect(t, verbs.QPTypeRC, verbs.MTU1024)
	const n = 3*1024 + 5 // first, middle, middle, last
	var peerQPN, myQPN uint32
	if s.host {
		peerQPN, myQPN = c.peer.QPN, c.qp.QPN()
	}
	cases := []struct {
		name     string
		fromSoft bool
		tx, rx   *dropRule
		op       func(t *testing.T, fromSoft bool, tag string)
	}{
		{"soft-send-middle-lost", true, &dropRule{op: roce.RCSendMiddle, qpn: peerQPN}, nil,
			func(t *testing.T, f bool, tag string) { c.send(t, f, n, nil, tag) }},
		{"rxe-send-middle-lost", false, nil, &dropRule{op: roce.RCSendMiddle, qpn: myQPN},
			func(t *testing.T, f bool, tag string) { c.send(t, f, n, nil, tag) }},
		{"rxe-ack-lost", true, nil, &dropRule{op: roce.RCAck, qpn: myQPN},
			func(t *testing.T, f bool, tag string) { c.write(t, f, n, nil, tag) }},
		{"soft-ack-lost", false, &dropRule{op: roce.RCAck, qpn: peerQPN}, nil,
			func(t *testing.T, f bool, tag string) { c.write(t, f, n, nil, tag) }},
		{"rxe-read-response-lost", true, nil, &dropRule{op: roce.RCReadResponseMiddle, qpn: myQPN},
			func(t *testing.T, f bool, tag string) { c.read(t, f, n, tag) }},
		{"soft-read-response-lost", false, &dropRule{op: roce.RCReadResponseMiddle, qpn: peerQPN}, nil,
			func(t *testing.T, f bool, tag string) { c.read(t, f, n, tag) }},
		{"soft-write-first-lost", true, &dropRule{op: roce.RCWriteFirst, qpn: peerQPN}, nil,
			func(t *testing.T, f bool, tag string) { c.write(t, f, n, immOf(tag), tag) }},
		{"rxe-write-last-lost", false, nil, &dropRule{op: roce.RCWriteLastImm, qpn: myQPN},
			func(t *testing.T, f bool, tag string) { c.write(t, f, n, immOf(tag), tag) }},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			check := c.drop(t, tc.tx, tc.rx)
			tc.op(t, tc.fromSoft, t.Name())
			check()
			s.check(t, tc.name)
		})
	}
}

// TestRCRemoteAccessNAK: an RDMA WRITE with a bad rkey gets a remote
// access error NAK; the writer completes with IBV_WC_REM_ACCESS_ERR and
// both QPs end in ERR (the responder's by IBA 9.9.2, the requester's by
// its error completion).
func TestRCRemoteAccessNAK(t *testing.T) {
	s := need(t)
	both(t, func(t *testing.T, fromSoft bool) {
		c := s.connect(t, verbs.QPTypeRC, verbs.MTU1024)
		if c.isSender(fromSoft) {
			verbstest.Fill(c.mr.Bytes()[:64], 1)
			verbstest.MustPostSend(t, c.qp, verbstest.RDMAWR(11, verbs.WRRDMAWrite, c.peer.Addr+tgtOff, c.peer.RKey^0x00ffff00, verbstest.SGE(c.mr, 0, 64)))
			wc := one(t, c.scq)
			verbstest.CheckWC(t, wc, verbs.WC{WRID: 11, Status: verbs.WCRemAccessErr, Opcode: wc.Opcode, QPN: c.qp.QPN(), ByteLen: wc.ByteLen, VendorErr: wc.VendorErr})
		}
		verbstest.WaitState(t, c.qp, verbs.QPStateErr, cqWait)
		s.check(t, "bad rkey")
		var zero [64]byte
		if !c.isSender(fromSoft) && string(c.mr.Bytes()[tgtOff:tgtOff+64]) != string(zero[:]) {
			t.Errorf("%s: a write with a bad rkey changed the target", s.name())
		}
	})
}
