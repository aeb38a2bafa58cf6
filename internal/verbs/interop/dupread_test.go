package interop

import (
	"encoding/binary"
	"sync/atomic"
	"testing"
	"time"

	"github.com/rdmavisor/rdmavisor/internal/verbs"
	"github.com/rdmavisor/rdmavisor/internal/verbs/soft/roce"
	"github.com/rdmavisor/rdmavisor/internal/verbs/soft/wire"
	"github.com/rdmavisor/rdmavisor/internal/verbs/verbstest"
)

// TestRCDuplicateRead: what rxe's responder does with READ requests
// behind the PSN it expects, sent as from its peer (the host's own
// address and QP, the PSN of a read it answered or one it never saw): a
// READ it executed is answered again, in whole or in part, and nothing
// else is (rxe's duplicate_request: class D, dropped). The soft provider
// answers the same (soft.TestDuplicateReads); before, it executed any
// such READ with a valid key, so a forged 32-byte request had it send its
// peer a whole region.
func TestRCDuplicateRead(t *testing.T) {
	s := need(t)
	c := s.connect(t, verbs.QPTypeRC, verbs.MTU1024)
	const n = 2048 // two response packets
	if !s.host {
		verbstest.Fill(c.mr.Bytes()[tgtOff:tgtOff+mrSize-tgtOff], 7)
	}
	s.sync(t, "filled")
	if s.host {
		hostDuplicateReads(t, s, c, n)
	}
	s.check(t, "duplicate reads")
}

// hostDuplicateReads reads n bytes once, then sends rxe READ requests
// behind its expected PSN and counts the responses each draws.
func hostDuplicateReads(t *testing.T, s *side, c *conn, n int) {
	var responses atomic.Int64
	s.dw.mu.Lock()
	s.dw.watch = func(b []byte) {
		if len(b) >= roce.BTHLen && roce.Opcode(b[0]).IsReadResponse() && binary.BigEndian.Uint32(b[4:])&roce.Mask24 == c.qp.QPN() {
			responses.Add(1)
		}
	}
	s.dw.mu.Unlock()
	defer func() { s.dw.mu.Lock(); s.dw.watch = nil; s.dw.mu.Unlock() }()

	// The first request on this QP: its PSN is the QP's initial send PSN.
	psn := c.sqPSN
	read := func(wrid uint64) {
		verbstest.MustPostSend(t, c.qp, verbstest.RDMAWR(wrid, verbs.WRRDMARead, c.peer.Addr+tgtOff, c.peer.RKey, verbstest.SGE(c.mr, sendOff, n)))
		verbstest.CheckWC(t, one(t, c.scq), verbs.WC{WRID: wrid, Status: verbs.WCSuccess, Opcode: verbs.WCRDMARead, QPN: c.qp.QPN(), ByteLen: uint32(n)})
	}
	read(1)
	u := s.dw.Wire.(*wire.UDP)
	src := roce.Endpoint{GID: verbstest.GID(t, s.dev), Port: u.Port()}
	dst := roce.Endpoint{GID: c.peer.GID, Port: u.Port()}
	forge := func(what string, psn uint32, va uint64, length uint32, want int64) {
		t.Helper()
		before := responses.Load()
		h := roce.Header{Opcode: roce.RCReadRequest, PKey: 0xffff, DestQPN: c.peer.QPN, PSN: psn & roce.Mask24,
			AckReq: true, VA: va, RKey: c.peer.RKey, DMALen: length}
		buf := make([]byte, roce.MaxPacketLen(0))
		k, err := roce.Encode(buf, &h, nil, src, dst)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := u.Send([]wire.Packet{{Buf: buf[:k], N: k, Addr: c.peer.GID}}); err != nil {
			t.Fatal(err)
		}
		time.Sleep(500 * time.Millisecond) // a TCG guest answers within this
		if got := responses.Load() - before; got != want {
			t.Errorf("%s: %d read responses, want %d", what, got, want)
		}
	}
	base := c.peer.Addr + tgtOff
	forge("a READ of 64 KiB at a PSN never used", psn-100, base, 64<<10, 0)
	forge("the answered READ's PSN, asking for more", psn, base, 2*uint32(n), 0)
	forge("the answered READ's PSN, outside its range", psn, base+uint64(n), uint32(n), 0)
	forge("the answered READ again", psn, base, uint32(n), 2)
	forge("its second half, from its second PSN", psn+1, base+uint64(n/2), uint32(n/2), 1)
	// The QP is intact: the next read is answered.
	read(2)
}
