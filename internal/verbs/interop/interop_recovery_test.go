package interop

import (
	"testing"

	"github.com/rdmavisor/rdmavisor/internal/verbs"
	"github.com/rdmavisor/rdmavisor/internal/verbs/soft/roce"
	"github.com/rdmavisor/rdmavisor/internal/verbs/verbstest"
)

// RC recovery from packets dropped, and a NAK for a refused remote access.

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
