package verbstest

import (
	"encoding/binary"
	"fmt"
	"testing"
	"time"

	"github.com/rdmavisor/rdmavisor/internal/verbs"
)

// faultSizes are the message sizes of the fault cases: at path MTU 1024,
// about half are single-packet, the rest two to four packets.
var faultSizes = [...]int{8, 64, 200, 1000, 1024, 1025, 2048, 3000, 4096}

func faultSize(seq int) int {
	h := uint64(seq) * 0x9E3779B97F4A7C15
	return faultSizes[(h>>32)%uint64(len(faultSizes))]
}

// faultMessage writes message seq into b[:faultSize(seq)]: its sequence
// number in the first 8 bytes, then the pattern of seq.
func faultMessage(b []byte, seq int) []byte {
	b = b[:faultSize(seq)]
	Fill(b, uint64(seq))
	binary.LittleEndian.PutUint64(b, uint64(seq))
	return b
}

// testRCExactlyOnceUnderFaults: 10,000 RC sends of mixed sizes over a
// network that loses 5%, reorders 5% and duplicates 1% of packets (both
// directions, seeded): every message is delivered exactly once, in order,
// byte-exact (its sequence number is in the payload), and every send
// completes successfully, in order. Receives are reposted as they complete
// and sends are windowed, so no queue overflows.
func testRCExactlyOnceUnderFaults(t *testing.T, f Factory) {
	devs := openDevices(t, f, 2, Options{Loss: 0.05, Reorder: 0.05, Duplicate: 0.01, Seed: 0x5EED})
	x := newRCFaults(t, devs)
	deadline := x.start.Add(faultDeadline)
	var bo backoff
	for x.sent < rcFaultsTotal || x.delivered < rcFaultsTotal {
		if time.Now().After(deadline) {
			t.Fatalf("not done: %s", x.progress())
		}
		moved := x.postSends()
		if x.reapSends() {
			moved = true
		}
		if x.reapReceives() {
			moved = true
		}
		if moved {
			bo.reset()
		} else {
			bo.wait()
		}
	}
	t.Logf("%d messages exactly once in %v", rcFaultsTotal, time.Since(x.start).Round(time.Millisecond))
	ExpectIdle(t, x.p.CQA, 2*waitIdle)
	ExpectIdle(t, x.p.CQB, 2*waitIdle)
}

const (
	rcFaultsTotal  = 10000
	rcFaultsWindow = 32 // sends outstanding
	rcFaultsRecvs  = 64 // receives kept posted
	rcFaultsSlot   = 4096
)

// rcFaults is testRCExactlyOnceUnderFaults' fixture: an RC pair, A's
// windowed sends from src and B's receives into dst, and how far each got.
type rcFaults struct {
	t                       *testing.T
	p                       *Pair
	src, dst                verbs.MR
	start                   time.Time
	posted, sent, delivered int
	batch                   []verbs.SendWR
	repost                  []verbs.RecvWR
	wcs                     []verbs.WC
	want                    []byte
}

func newRCFaults(t *testing.T, devs []verbs.Device) *rcFaults {
	// Timeout 13 (≈34 ms): losses are mostly repaired by sequence NAKs;
	// the timer only covers lost tails, and seven expiries in a row must
	// not happen just because a loaded CI machine (race detector on)
	// descheduled the responder for a few milliseconds.
	p := NewPair(t, devs[0], devs[1], PairConfig{
		Cap:     verbs.QPCap{MaxSendWR: rcFaultsWindow, MaxRecvWR: rcFaultsRecvs, MaxSendSGE: 1, MaxRecvSGE: 1},
		CQE:     256,
		Connect: ConnectOptions{MTU: verbs.MTU1024, Timeout: 13, RetryCnt: 7, RNRRetry: 7, MinRNRTimer: 1},
	})
	x := &rcFaults{t: t, p: p,
		src:    RegMR(t, p.PDA, rcFaultsWindow*rcFaultsSlot, local),
		dst:    RegMR(t, p.PDB, rcFaultsRecvs*rcFaultsSlot, local),
		batch:  make([]verbs.SendWR, 0, rcFaultsWindow),
		repost: make([]verbs.RecvWR, 0, rcFaultsRecvs),
		wcs:    make([]verbs.WC, 64),
		want:   make([]byte, rcFaultsSlot),
	}
	for i := range rcFaultsRecvs {
		x.repost = append(x.repost, RecvWR(uint64(i), SGE(x.dst, i*rcFaultsSlot, rcFaultsSlot)))
	}
	MustPostRecv(t, p.B, x.repost...)
	x.start = time.Now()
	return x
}

func (x *rcFaults) progress() string {
	return fmt.Sprintf("after %v: %d posted, %d send completions, %d delivered of %d; QP states %v / %v",
		time.Since(x.start).Round(time.Millisecond), x.posted, x.sent, x.delivered, rcFaultsTotal, x.p.A.State(), x.p.B.State())
}

// postSends posts the next messages up to the window; false if there was
// no room.
func (x *rcFaults) postSends() bool {
	x.batch = x.batch[:0]
	for x.posted < rcFaultsTotal && x.posted-x.sent < rcFaultsWindow {
		off := (x.posted % rcFaultsWindow) * rcFaultsSlot
		m := faultMessage(x.src.Bytes()[off:], x.posted)
		x.batch = append(x.batch, SendWR(uint64(x.posted), verbs.WRSend, SGE(x.src, off, len(m))))
		x.posted++
	}
	if len(x.batch) == 0 {
		return false
	}
	MustPostSend(x.t, x.p.A, x.batch...)
	return true
}

// reapSends checks A's send completions, which come in order; false if
// there was none.
func (x *rcFaults) reapSends() bool {
	k := x.p.CQA.Poll(x.wcs)
	for _, wc := range x.wcs[:k] {
		if !CheckWC(x.t, wc, verbs.WC{WRID: uint64(x.sent), Opcode: verbs.WCSend, QPN: x.p.A.QPN()}) {
			x.t.Fatalf("send completion %d: %s", x.sent, x.progress())
		}
		x.sent++
	}
	return k > 0
}

// reapReceives checks B's receive completions, each the message due next,
// byte-exact, and reposts their receives; false if there was none.
func (x *rcFaults) reapReceives() bool {
	t := x.t
	k := x.p.CQB.Poll(x.wcs)
	x.repost = x.repost[:0]
	for _, wc := range x.wcs[:k] {
		if wc.Status != verbs.WCSuccess || wc.Opcode != verbs.WCRecv || wc.QPN != x.p.B.QPN() ||
			wc.WRID >= rcFaultsRecvs || wc.ByteLen < 8 || wc.ByteLen > rcFaultsSlot {
			t.Fatalf("receive completion %s: %s", FormatWC(wc), x.progress())
		}
		i := int(wc.WRID)
		got := x.dst.Bytes()[i*rcFaultsSlot : i*rcFaultsSlot+int(wc.ByteLen)]
		if seq := int(binary.LittleEndian.Uint64(got)); seq != x.delivered {
			t.Fatalf("message %d delivered where %d was due (duplicated, reordered or lost): %s", seq, x.delivered, x.progress())
		}
		if int(wc.ByteLen) != faultSize(x.delivered) {
			t.Fatalf("message %d delivered with %d bytes, want %d", x.delivered, wc.ByteLen, faultSize(x.delivered))
		}
		if err := diff(got, faultMessage(x.want, x.delivered)); err != nil {
			t.Fatalf("message %d: %v", x.delivered, err)
		}
		x.delivered++
		x.repost = append(x.repost, RecvWR(wc.WRID, SGE(x.dst, i*rcFaultsSlot, rcFaultsSlot)))
	}
	if len(x.repost) == 0 {
		return false
	}
	MustPostRecv(t, x.p.B, x.repost...)
	return true
}

// testUCLosesWholeMessages: UC over a network that loses 10% of packets,
// with messages of three to four packets: the receiver gets only whole
// messages — each with its exact length and content, in order, never part
// of one — and fewer than were sent, consuming its receives in posting order
// (a broken message leaves its receive for the next message, IBTA class D1).
// Every send completes successfully, in order: UC has no ACKs.
func testUCLosesWholeMessages(t *testing.T, f Factory) {
	devs := openDevices(t, f, 2, Options{Loss: 0.10, Seed: 0x0C})
	p := NewPair(t, devs[0], devs[1], PairConfig{
		Type:    verbs.QPTypeUC,
		Cap:     verbs.QPCap{MaxSendWR: ucLossWindow, MaxRecvWR: ucLossTotal, MaxSendSGE: 1, MaxRecvSGE: 1},
		Connect: ConnectOptions{MTU: verbs.MTU1024},
	})
	src := RegMR(t, p.PDA, ucLossWindow*ucLossSlot, local)
	dst := RegMR(t, p.PDB, ucLossTotal*ucLossSlot, local)
	var recvs []verbs.RecvWR
	for i := range ucLossTotal {
		recvs = append(recvs, RecvWR(uint64(i), SGE(dst, i*ucLossSlot, ucLossSlot)))
	}
	MustPostRecv(t, p.B, recvs...)

	got := sendUCLossy(t, p, src)
	// Collect what is still in flight: until the receive CQ stays idle.
	for {
		more := drainCQ(p.CQB, 4*waitIdle)
		if len(more) == 0 {
			break
		}
		got = append(got, more...)
	}
	checkUCWhole(t, p, dst, got)
	t.Logf("UC: %d of %d messages delivered whole at 10%% packet loss", len(got), ucLossTotal)
	if len(got) == 0 || len(got) >= ucLossTotal {
		t.Errorf("UC delivered %d of %d messages at 10%% packet loss; want some but not all", len(got), ucLossTotal)
	}
}

const (
	ucLossTotal  = 200
	ucLossWindow = 16
	ucLossSlot   = 4096
)

// ucLossSize is the size of the UC case's message seq: 2049..4095 bytes.
func ucLossSize(seq int) int { return 2049 + (seq*977)%2047 }

// ucLossMessage is the UC case's message seq, written into b: its sequence
// number in the first 8 bytes, then the pattern of seq.
func ucLossMessage(b []byte, seq int) {
	Fill(b, uint64(seq))
	binary.LittleEndian.PutUint64(b, uint64(seq))
}

// sendUCLossy sends the UC case's messages from A, out of src, windowed, checking that
// every send completes successfully and in order; it returns B's receive
// completions meanwhile.
func sendUCLossy(t *testing.T, p *Pair, src verbs.MR) []verbs.WC {
	start := time.Now()
	deadline := start.Add(faultDeadline)
	var posted, sent int
	var got []verbs.WC
	wcs := make([]verbs.WC, 64)
	var bo backoff
	for sent < ucLossTotal {
		if time.Now().After(deadline) {
			t.Fatalf("after %v: %d posted, %d send completions of %d", time.Since(start), posted, sent, ucLossTotal)
		}
		var batch []verbs.SendWR
		for posted < ucLossTotal && posted-sent < ucLossWindow {
			off := (posted % ucLossWindow) * ucLossSlot
			b := src.Bytes()[off : off+ucLossSize(posted)]
			ucLossMessage(b, posted)
			batch = append(batch, SendWR(uint64(posted), verbs.WRSend, SGE(src, off, len(b))))
			posted++
		}
		if len(batch) > 0 {
			MustPostSend(t, p.A, batch...)
		}
		k := p.CQA.Poll(wcs)
		for _, wc := range wcs[:k] {
			if !CheckWC(t, wc, verbs.WC{WRID: uint64(sent), Opcode: verbs.WCSend, QPN: p.A.QPN()}) {
				t.Fatalf("UC send completion %d of %d", sent, ucLossTotal)
			}
			sent++
		}
		k2 := p.CQB.Poll(wcs)
		got = append(got, wcs[:k2]...)
		if len(batch) > 0 || k > 0 || k2 > 0 {
			bo.reset()
		} else {
			bo.wait()
		}
	}
	return got
}

// checkUCWhole checks B's receive completions got: each consumed the next
// receive posted, into dst, and holds a whole message sent after the one
// before it.
func checkUCWhole(t *testing.T, p *Pair, dst verbs.MR, got []verbs.WC) {
	last := -1
	for i, wc := range got {
		if wc.Status != verbs.WCSuccess || wc.Opcode != verbs.WCRecv || wc.QPN != p.B.QPN() || wc.WRID != uint64(i) {
			t.Errorf("UC receive completion %d: %s; want a successful WCRecv of wr_id %d", i, FormatWC(wc), i)
			continue
		}
		if wc.ByteLen < 8 || wc.ByteLen > ucLossSlot {
			t.Errorf("UC receive completion %d: %s: not a message that was sent", i, FormatWC(wc))
			continue
		}
		b := dst.Bytes()[i*ucLossSlot : i*ucLossSlot+int(wc.ByteLen)]
		seq := int(binary.LittleEndian.Uint64(b))
		if seq <= last || seq >= ucLossTotal {
			t.Errorf("UC receive %d holds message %d after message %d", i, seq, last)
			continue
		}
		last = seq
		if int(wc.ByteLen) != ucLossSize(seq) {
			t.Errorf("UC message %d delivered with %d bytes, want %d: part of a message", seq, wc.ByteLen, ucLossSize(seq))
			continue
		}
		want := make([]byte, ucLossSize(seq))
		ucLossMessage(want, seq)
		expectBytes(t, fmt.Sprintf("UC message %d", seq), b, want)
	}
}
