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
