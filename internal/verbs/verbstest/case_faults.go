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
	const (
		total  = 10000
		window = 32 // sends outstanding
		recvs  = 64 // receives kept posted
		slot   = 4096
	)
	// Timeout 13 (≈34 ms): losses are mostly repaired by sequence NAKs;
	// the timer only covers lost tails, and seven expiries in a row must
	// not happen just because a loaded CI machine (race detector on)
	// descheduled the responder for a few milliseconds.
	p := NewPair(t, devs[0], devs[1], PairConfig{
		Cap:     verbs.QPCap{MaxSendWR: window, MaxRecvWR: recvs, MaxSendSGE: 1, MaxRecvSGE: 1},
		CQE:     256,
		Connect: ConnectOptions{MTU: verbs.MTU1024, Timeout: 13, RetryCnt: 7, RNRRetry: 7, MinRNRTimer: 1},
	})
	src := RegMR(t, p.PDA, window*slot, local)
	dst := RegMR(t, p.PDB, recvs*slot, local)
	repost := make([]verbs.RecvWR, 0, recvs)
	for i := range recvs {
		repost = append(repost, RecvWR(uint64(i), SGE(dst, i*slot, slot)))
	}
	MustPostRecv(t, p.B, repost...)

	start := time.Now()
	deadline := start.Add(faultDeadline)
	var posted, sent, delivered int
	progress := func() string {
		return fmt.Sprintf("after %v: %d posted, %d send completions, %d delivered of %d; QP states %v / %v",
			time.Since(start).Round(time.Millisecond), posted, sent, delivered, total, p.A.State(), p.B.State())
	}
	batch := make([]verbs.SendWR, 0, window)
	wcs := make([]verbs.WC, 64)
	want := make([]byte, slot)
	var bo backoff
	for sent < total || delivered < total {
		if time.Now().After(deadline) {
			t.Fatalf("not done: %s", progress())
		}
		moved := false
		batch = batch[:0]
		for posted < total && posted-sent < window {
			off := (posted % window) * slot
			m := faultMessage(src.Bytes()[off:], posted)
			batch = append(batch, SendWR(uint64(posted), verbs.WRSend, SGE(src, off, len(m))))
			posted++
		}
		if len(batch) > 0 {
			MustPostSend(t, p.A, batch...)
			moved = true
		}
		k := p.CQA.Poll(wcs)
		for _, wc := range wcs[:k] {
			if !CheckWC(t, wc, verbs.WC{WRID: uint64(sent), Opcode: verbs.WCSend, QPN: p.A.QPN()}) {
				t.Fatalf("send completion %d: %s", sent, progress())
			}
			sent++
		}
		moved = moved || k > 0
		k = p.CQB.Poll(wcs)
		repost = repost[:0]
		for _, wc := range wcs[:k] {
			if wc.Status != verbs.WCSuccess || wc.Opcode != verbs.WCRecv || wc.QPN != p.B.QPN() ||
				wc.WRID >= recvs || wc.ByteLen < 8 || wc.ByteLen > slot {
				t.Fatalf("receive completion %s: %s", FormatWC(wc), progress())
			}
			i := int(wc.WRID)
			got := dst.Bytes()[i*slot : i*slot+int(wc.ByteLen)]
			if seq := int(binary.LittleEndian.Uint64(got)); seq != delivered {
				t.Fatalf("message %d delivered where %d was due (duplicated, reordered or lost): %s", seq, delivered, progress())
			}
			if int(wc.ByteLen) != faultSize(delivered) {
				t.Fatalf("message %d delivered with %d bytes, want %d", delivered, wc.ByteLen, faultSize(delivered))
			}
			if err := diff(got, faultMessage(want, delivered)); err != nil {
				t.Fatalf("message %d: %v", delivered, err)
			}
			delivered++
			repost = append(repost, RecvWR(wc.WRID, SGE(dst, i*slot, slot)))
		}
		if len(repost) > 0 {
			MustPostRecv(t, p.B, repost...)
			moved = true
		}
		if moved {
			bo.reset()
		} else {
			bo.wait()
		}
	}
	t.Logf("%d messages exactly once in %v", total, time.Since(start).Round(time.Millisecond))
	ExpectIdle(t, p.CQA, 2*waitIdle)
	ExpectIdle(t, p.CQB, 2*waitIdle)
}

// testUCLosesWholeMessages: UC over a network that loses 10% of packets,
// with messages of three to four packets: the receiver gets only whole
// messages — each with its exact length and content, in order, never part
// of one — and fewer than were sent, consuming its receives in posting order
// (a broken message leaves its receive for the next message, IBTA class D1).
// Every send completes successfully, in order: UC has no ACKs.
func testUCLosesWholeMessages(t *testing.T, f Factory) {
	devs := openDevices(t, f, 2, Options{Loss: 0.10, Seed: 0x0C})
	const (
		total  = 200
		window = 16
		slot   = 4096
	)
	size := func(seq int) int { return 2049 + (seq*977)%2047 } // 2049..4095 bytes
	p := NewPair(t, devs[0], devs[1], PairConfig{
		Type:    verbs.QPTypeUC,
		Cap:     verbs.QPCap{MaxSendWR: window, MaxRecvWR: total, MaxSendSGE: 1, MaxRecvSGE: 1},
		Connect: ConnectOptions{MTU: verbs.MTU1024},
	})
	src := RegMR(t, p.PDA, window*slot, local)
	dst := RegMR(t, p.PDB, total*slot, local)
	var recvs []verbs.RecvWR
	for i := range total {
		recvs = append(recvs, RecvWR(uint64(i), SGE(dst, i*slot, slot)))
	}
	MustPostRecv(t, p.B, recvs...)

	start := time.Now()
	deadline := start.Add(faultDeadline)
	var posted, sent int
	var got []verbs.WC
	wcs := make([]verbs.WC, 64)
	var bo backoff
	for sent < total {
		if time.Now().After(deadline) {
			t.Fatalf("after %v: %d posted, %d send completions of %d", time.Since(start), posted, sent, total)
		}
		var batch []verbs.SendWR
		for posted < total && posted-sent < window {
			off := (posted % window) * slot
			b := src.Bytes()[off : off+size(posted)]
			Fill(b, uint64(posted))
			binary.LittleEndian.PutUint64(b, uint64(posted))
			batch = append(batch, SendWR(uint64(posted), verbs.WRSend, SGE(src, off, len(b))))
			posted++
		}
		if len(batch) > 0 {
			MustPostSend(t, p.A, batch...)
		}
		k := p.CQA.Poll(wcs)
		for _, wc := range wcs[:k] {
			if !CheckWC(t, wc, verbs.WC{WRID: uint64(sent), Opcode: verbs.WCSend, QPN: p.A.QPN()}) {
				t.Fatalf("UC send completion %d of %d", sent, total)
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
	// Collect what is still in flight: until the receive CQ stays idle.
	for {
		more := drainCQ(p.CQB, 4*waitIdle)
		if len(more) == 0 {
			break
		}
		got = append(got, more...)
	}

	last := -1
	for i, wc := range got {
		if wc.Status != verbs.WCSuccess || wc.Opcode != verbs.WCRecv || wc.QPN != p.B.QPN() || wc.WRID != uint64(i) {
			t.Errorf("UC receive completion %d: %s; want a successful WCRecv of wr_id %d", i, FormatWC(wc), i)
			continue
		}
		if wc.ByteLen < 8 || wc.ByteLen > slot {
			t.Errorf("UC receive completion %d: %s: not a message that was sent", i, FormatWC(wc))
			continue
		}
		b := dst.Bytes()[i*slot : i*slot+int(wc.ByteLen)]
		seq := int(binary.LittleEndian.Uint64(b))
		if seq <= last || seq >= total {
			t.Errorf("UC receive %d holds message %d after message %d", i, seq, last)
			continue
		}
		last = seq
		if int(wc.ByteLen) != size(seq) {
			t.Errorf("UC message %d delivered with %d bytes, want %d: part of a message", seq, wc.ByteLen, size(seq))
			continue
		}
		want := Pattern(size(seq), uint64(seq))
		binary.LittleEndian.PutUint64(want, uint64(seq))
		expectBytes(t, fmt.Sprintf("UC message %d", seq), b, want)
	}
	t.Logf("UC: %d of %d messages delivered whole at 10%% packet loss", len(got), total)
	if len(got) == 0 || len(got) >= total {
		t.Errorf("UC delivered %d of %d messages at 10%% packet loss; want some but not all", len(got), total)
	}
}
