package interop

import (
	"fmt"
	"testing"
	"time"

	"github.com/rdmavisor/rdmavisor/internal/verbs"
	"github.com/rdmavisor/rdmavisor/internal/verbs/soft/roce"
	"github.com/rdmavisor/rdmavisor/internal/verbs/verbstest"
)

// The data paths both ways: Send, RDMA WRITE and READ, on RC, UC and UD.

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
