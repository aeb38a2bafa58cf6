package interop

import (
	"encoding/hex"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/rdmavisor/rdmavisor/internal/verbs"
	"github.com/rdmavisor/rdmavisor/internal/verbs/verbstest"
)

// Peers of the real tools in the guest (hack/rxe-vm/interop-tools.sh starts
// them): the soft provider speaks their TCP exchanges and their traffic.

// needTools returns the host side when it plays the tools' peer.
func needTools(t *testing.T) *side {
	t.Helper()
	if me == nil || os.Getenv("RDMAVISOR_INTEROP") != "tools" {
		t.Skip("RDMAVISOR_INTEROP is not tools: hack/rxe-vm/interop.sh runs these against the tools in an rxe guest")
	}
	return me
}

func guestIP(t *testing.T) string {
	t.Helper()
	ips := strings.Fields(os.Getenv("RDMAVISOR_GUEST_IPS"))
	if len(ips) == 0 {
		t.Fatal("RDMAVISOR_GUEST_IPS is empty: run.sh -H sets it")
	}
	return ips[0]
}

// pingpong's exchange (rdma-core libibverbs/examples/pingpong.c): each side
// writes "%04x:%06x:%06x:%s" (LID, QPN, PSN, GID as 32 hex digits in
// network order) and a NUL, 52 bytes; the client then writes "done\0".
const ppMsgLen = len("0000:000000:000000:00000000000000000000000000000000") + 1

type ppDest struct {
	QPN, PSN uint32
	GID      verbs.GID
}

func (d ppDest) wire() []byte {
	return append([]byte(fmt.Sprintf("%04x:%06x:%06x:%s", 0, d.QPN, d.PSN, hex.EncodeToString(d.GID[:]))), 0)
}

func parsePPDest(b []byte) (ppDest, error) {
	f := strings.Split(strings.TrimRight(string(b), "\x00"), ":")
	if len(f) != 4 {
		return ppDest{}, fmt.Errorf("pingpong message %q: want LID:QPN:PSN:GID", b)
	}
	qpn, err1 := strconv.ParseUint(f[1], 16, 24)
	psn, err2 := strconv.ParseUint(f[2], 16, 24)
	g, err3 := hex.DecodeString(f[3])
	if err1 != nil || err2 != nil || err3 != nil || len(g) != 16 {
		return ppDest{}, fmt.Errorf("pingpong message %q: bad QPN, PSN or GID", b)
	}
	d := ppDest{QPN: uint32(qpn), PSN: uint32(psn)}
	copy(d.GID[:], g)
	return d, nil
}

// TestPingpong: the soft provider as ibv_rc_pingpong's client (the guest
// runs `ibv_rc_pingpong -g IDX -n 500 -s 4096`) and then as its server
// (the guest runs the client against us). pingpong echoes what it receives
// from the buffer it received it in, so every byte of every round trip is
// checked here; the guest script checks the tool's exit status.
func TestPingpong(t *testing.T) {
	s := needTools(t)
	const iters, size = 500, 4096
	for _, client := range []bool{true, false} {
		name := "soft-server"
		if client {
			name = "soft-client"
		}
		t.Run(name, func(t *testing.T) {
			c := s.ppConn(t)
			var ctl net.Conn
			var err error
			if client {
				deadline := time.Now().Add(3 * time.Minute)
				for {
					ctl, err = net.DialTimeout("tcp", net.JoinHostPort(guestIP(t), "18515"), 5*time.Second)
					if err == nil || time.Now().After(deadline) {
						break
					}
					time.Sleep(200 * time.Millisecond)
				}
			} else {
				var ln net.Listener
				if ln, err = net.Listen("tcp", net.JoinHostPort(os.Getenv("RDMAVISOR_HOST_IP"), "18515")); err == nil {
					_ = ln.(*net.TCPListener).SetDeadline(time.Now().Add(3 * time.Minute))
					ctl, err = ln.Accept()
					_ = ln.Close()
				}
			}
			if err != nil {
				t.Fatalf("pingpong exchange: %v", err)
			}
			defer ctl.Close()
			_ = ctl.SetDeadline(time.Now().Add(3 * time.Minute))
			mine := ppDest{QPN: c.qp.QPN(), PSN: rand.Uint32() & 0xffffff, GID: verbstest.GID(t, s.dev)}
			buf := make([]byte, ppMsgLen)
			var peer ppDest
			read := func() {
				if _, err := io.ReadFull(ctl, buf); err != nil {
					t.Fatalf("pingpong exchange: read: %v", err)
				}
				if peer, err = parsePPDest(buf); err != nil {
					t.Fatal(err)
				}
			}
			connect := func() {
				// pingpong's own attributes: MTU 1024, timeout 14, 7 retries.
				if err := verbs.ConnectQP(c.qp, verbs.Remote{GID: peer.GID, QPN: peer.QPN, PSN: peer.PSN},
					verbs.PathOptions{MTU: verbs.MTU1024, SQPSN: mine.PSN, Timeout: 14, RetryCnt: 7, MaxRdAtomic: 1}); err != nil {
					t.Fatal(err)
				}
			}
			if client {
				// pp_client_exch_dest: ours, theirs, "done".
				if _, err := ctl.Write(mine.wire()); err != nil {
					t.Fatal(err)
				}
				read()
				connect()
				if _, err := ctl.Write([]byte("done\x00")); err != nil {
					t.Fatal(err)
				}
			} else {
				// pp_server_exch_dest: theirs, connect, ours, "done".
				read()
				connect()
				if _, err := ctl.Write(mine.wire()); err != nil {
					t.Fatal(err)
				}
				done := make([]byte, len("done\x00"))
				if _, err := io.ReadFull(ctl, done); err != nil || string(done) != "done\x00" {
					t.Fatalf("pingpong exchange: %q, %v; want done", done, err)
				}
			}
			t.Logf("soft QPN %#x PSN %#x; pingpong QPN %#x PSN %#x GID %v", mine.QPN, mine.PSN, peer.QPN, peer.PSN, peer.GID)
			start := time.Now()
			verbstest.MustPostRecv(t, c.qp, verbstest.RecvWR(0, verbstest.SGE(c.mr, recvOff, size)))
			recvd := func(i int) {
				t.Helper()
				wc := one(t, c.rcq)
				verbstest.CheckWC(t, wc, verbs.WC{WRID: uint64(i), Status: verbs.WCSuccess, Opcode: verbs.WCRecv, QPN: c.qp.QPN(), ByteLen: size})
			}
			for i := range iters {
				sd := seed(name, i)
				if client {
					verbstest.Fill(c.mr.Bytes()[sendOff:sendOff+size], sd)
				} else {
					// The server echoes the client's message, which is
					// pingpong's buffer: 0x7b bytes (pp_init_ctx), then our echo.
					recvd(i)
					for j, v := range c.mr.Bytes()[recvOff : recvOff+size] {
						if v != 0x7b {
							t.Fatalf("round trip %d: byte %d from ibv_rc_pingpong is %#x, want 0x7b", i, j, v)
						}
					}
					copy(c.mr.Bytes()[sendOff:sendOff+size], c.mr.Bytes()[recvOff:recvOff+size])
					verbstest.MustPostRecv(t, c.qp, verbstest.RecvWR(uint64(i+1), verbstest.SGE(c.mr, recvOff, size)))
				}
				verbstest.MustPostSend(t, c.qp, verbstest.SendWR(uint64(i), verbs.WRSend, verbstest.SGE(c.mr, sendOff, size)))
				wc := one(t, c.scq)
				verbstest.CheckWC(t, wc, verbs.WC{WRID: uint64(i), Status: verbs.WCSuccess, Opcode: verbs.WCSend, QPN: c.qp.QPN()})
				if client {
					recvd(i)
					if err := verbstest.Check(c.mr.Bytes()[recvOff:recvOff+size], sd); err != nil {
						t.Errorf("round trip %d: pingpong's echo: %v", i, err)
					}
					verbstest.MustPostRecv(t, c.qp, verbstest.RecvWR(uint64(i+1), verbstest.SGE(c.mr, recvOff, size)))
				}
				if t.Failed() {
					t.FailNow()
				}
			}
			t.Logf("%d round trips of %d bytes with ibv_rc_pingpong in %v", iters, size, time.Since(start))
		})
	}
}

// TestPerftest (after TestPingpong: the guest runs the tools in this order):
// the soft provider as the peer of perftest's ib_send_bw and ib_write_bw in
// the guest, over RC (perftest_test.go): for each tool, its client (the
// guest runs the server, `TOOL -d rxe0 -x IDX -n 1000 -s SIZE`) and then
// its server (the guest runs the client against us), each with SIZE 4096
// and 65536. The soft side posts what the perftest peer would and checks
// every completion; the guest script checks each tool's exit status and
// that its report says SIZE bytes × 1000 iterations. Where the data lands
// on our side (we are the server), every byte is checked: perftest fills
// its buffer with glibc's rand() after srand(time(NULL)), so the seed is
// found from the first bytes and the rest must follow.
func TestPerftest(t *testing.T) {
	s := needTools(t)
	// One listener for the tools' clients, open before the first of them
	// can run: the guest starts them only after its servers, which we
	// connect to first, so none finds the port closed.
	ln, err := net.Listen("tcp", net.JoinHostPort(os.Getenv("RDMAVISOR_HOST_IP"), fmt.Sprint(ptPort)))
	if err != nil {
		t.Fatalf("perftest listen: %v", err)
	}
	defer ln.Close()
	var broken string
	for _, tool := range []string{"ib_send_bw", "ib_write_bw"} {
		for _, client := range []bool{true, false} {
			for _, size := range ptSizes {
				role := "soft-server"
				if client {
					role = "soft-client"
				}
				t.Run(fmt.Sprintf("%s/%s/%d", tool, role, size), func(t *testing.T) {
					if broken != "" {
						t.Fatalf("the guest is out of step since %s failed", broken)
					}
					defer func() {
						if t.Failed() {
							broken = t.Name()
						}
					}()
					pt := &ptRun{s: s, write: tool == "ib_write_bw", client: client, size: size}
					pt.run(t, ln)
				})
			}
		}
	}
}

// ppConn makes an RC QP for a tool: its own CQs and memory region, in
// RESET until the exchange says where to connect.
func (s *side) ppConn(t *testing.T) *conn {
	t.Helper()
	c := &conn{s: s, typ: verbs.QPTypeRC}
	c.scq = verbstest.CreateCQ(t, s.dev, 1024)
	c.rcq = verbstest.CreateCQ(t, s.dev, 1024)
	c.qp = verbstest.CreateQP(t, s.pd, verbs.QPInitAttr{Type: verbs.QPTypeRC, SendCQ: c.scq, RecvCQ: c.rcq,
		Cap: verbs.QPCap{MaxSendWR: 512, MaxRecvWR: 1024, MaxSendSGE: 1, MaxRecvSGE: 1}})
	c.mr = verbstest.RegMR(t, s.pd, mrSize, access)
	return c
}
