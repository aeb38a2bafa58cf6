package reliable

import (
	"testing"
	"time"
)

var epoch = time.Unix(1_000_000, 0)

// push sends datagrams of the given sizes (messages each), numbered on
// from seq, at sent.
func push(s *Sender, seq uint32, sent time.Time, sizes ...uint32) uint32 {
	for i, n := range sizes {
		s.Push(Datagram{Seq: seq, Last: seq + n - 1, Buf: uint32(100 + i), Sent: sent})
		seq += n
	}
	return seq
}

func TestSenderFreeAcked(t *testing.T) {
	for _, tc := range []struct {
		name  string
		start uint32
		ack   uint32
		sizes []uint32
		freed []uint32 // Bufs
		left  int
	}{
		{"nothing covered", 10, 10, []uint32{1, 1}, nil, 2},
		{"the first", 10, 11, []uint32{1, 1, 1}, []uint32{100}, 2},
		{"a bundle only whole", 10, 12, []uint32{3, 1}, nil, 2},
		{"a bundle and one", 10, 14, []uint32{3, 1}, []uint32{100, 101}, 0},
		{"across the wrap", ^uint32(0) - 1, 2, []uint32{2, 2}, []uint32{100, 101}, 0},
		{"an old ack", 10, 5, []uint32{1}, nil, 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var s Sender
			s.acked = tc.start
			s.peerAck.Store(tc.start)
			push(&s, tc.start, epoch, tc.sizes...)
			s.OnAck(tc.ack)
			s.AckTime(time.Millisecond)
			var freed []uint32
			s.FreeAcked(epoch, func(d *Datagram) { freed = append(freed, d.Buf) })
			if len(freed) != len(tc.freed) || len(s.Pending()) != tc.left || s.Waiting() != (tc.left > 0) {
				t.Fatalf("freed %v, %d pending; want %v, %d", freed, len(s.Pending()), tc.freed, tc.left)
			}
			for i := range freed {
				if freed[i] != tc.freed[i] {
					t.Fatalf("freed %v, want %v", freed, tc.freed)
				}
			}
			// Freeing again frees nothing more.
			s.FreeAcked(epoch, func(d *Datagram) { t.Fatalf("buffer %d freed twice", d.Buf) })
			var dropped int
			s.Drop(func(*Datagram) { dropped++ })
			if dropped != tc.left || s.Waiting() {
				t.Fatalf("Drop freed %d of %d", dropped, tc.left)
			}
		})
	}
}

// The round-trip estimate takes samples only from datagrams sent once
// (Karn's rule), and the timeout follows it within MinRTO..MaxRTO,
// doubling with each try.
func TestSenderRTT(t *testing.T) {
	var s Sender
	if got := s.timeout(0, epoch); got != InitRTO {
		t.Fatalf("timeout before a sample %v, want %v", got, InitRTO)
	}
	seq := push(&s, 0, epoch, 1)
	s.OnAck(seq)
	s.AckTime(10 * time.Millisecond)
	s.FreeAcked(epoch, func(*Datagram) {})
	if s.srtt != 10*time.Millisecond || s.rttvar != 5*time.Millisecond || s.timeout(0, epoch) != 30*time.Millisecond {
		t.Fatalf("after a 10 ms sample: srtt %v rttvar %v timeout %v", s.srtt, s.rttvar, s.timeout(0, epoch))
	}
	// A resent datagram's acknowledgement is no sample: the estimate stays.
	next := push(&s, seq, epoch.Add(3*time.Millisecond), 1)
	Resent(&s.Pending()[0], epoch.Add(4*time.Millisecond))
	s.OnAck(next)
	s.AckTime(100 * time.Millisecond)
	s.FreeAcked(epoch, func(*Datagram) {})
	if s.srtt != 10*time.Millisecond {
		t.Fatalf("a resent datagram's ack moved srtt to %v", s.srtt)
	}
	if s.timeout(1, epoch) != 60*time.Millisecond || s.timeout(10, epoch) != MaxRTO {
		t.Fatalf("backoff: %v, %v", s.timeout(1, epoch), s.timeout(10, epoch))
	}
	// A tiny round trip still waits MinRTO, or LossyMinRTO for LossyHold
	// after the peer reported a gap.
	s.observe(time.Microsecond)
	for range 50 {
		s.observe(time.Microsecond)
	}
	if got := s.timeout(0, epoch); got != MinRTO {
		t.Fatalf("timeout %v after µs samples, want %v", got, MinRTO)
	}
	s.OnGap(1)
	at := epoch.Add(time.Hour)
	if s.TakeResend(at) != 1 {
		t.Fatal("the gap was not taken")
	}
	if got := s.timeout(0, at.Add(LossyHold-time.Millisecond)); got != LossyMinRTO {
		t.Fatalf("timeout %v within LossyHold of a gap report, want %v", got, LossyMinRTO)
	}
	if got := s.timeout(0, at.Add(LossyHold+time.Millisecond)); got != MinRTO {
		t.Fatalf("timeout %v past LossyHold of a gap report, want %v again", got, MinRTO)
	}
}

func TestSenderDue(t *testing.T) {
	var s Sender
	s.observe(10 * time.Millisecond) // srtt 10 ms, timeout 30 ms
	for _, tc := range []struct {
		name       string
		d          Datagram
		age        time.Duration
		resendTo   uint32
		due, early bool
	}{
		{"young", Datagram{Seq: 5, Last: 5}, time.Millisecond, 0, false, true},
		{"timed out", Datagram{Seq: 5, Last: 5}, 31 * time.Millisecond, 0, true, false},
		{"in a gap", Datagram{Seq: 5, Last: 5}, time.Millisecond, 6, true, true},
		{"past the gap", Datagram{Seq: 6, Last: 6}, time.Millisecond, 6, false, true},
		{"in a gap, resent a moment ago", Datagram{Seq: 5, Last: 5, Tries: 1}, time.Millisecond, 6, false, true},
		{"in a gap, resent a round trip ago", Datagram{Seq: 5, Last: 5, Tries: 1}, 11 * time.Millisecond, 6, true, true},
		{"in a gap across the wrap", Datagram{Seq: ^uint32(0), Last: ^uint32(0)}, 0, 2, true, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tc.d.Sent = epoch
			due, early := s.Due(&tc.d, epoch.Add(tc.age), tc.resendTo)
			if due != tc.due || early != tc.early {
				t.Fatalf("due %v early %v, want %v %v", due, early, tc.due, tc.early)
			}
		})
	}
	d := Datagram{Sent: epoch}
	for range MaxTries {
		if Dead(&d) {
			t.Fatalf("dead after %d tries", d.Tries)
		}
		Resent(&d, epoch)
	}
	if !Dead(&d) {
		t.Fatalf("alive after %d tries", d.Tries)
	}
}

func TestSenderGap(t *testing.T) {
	var s Sender
	if s.TakeResend(epoch) != 0 {
		t.Fatal("a gap before any was reported")
	}
	s.OnGap(10)
	s.OnGap(8) // older news
	if got := s.TakeResend(epoch); got != 10 {
		t.Fatalf("resend to %d, want 10", got)
	}
	if s.TakeResend(epoch) != 0 {
		t.Fatal("a gap taken twice")
	}
	s.OnGap(5)
	s.OnGap(12)
	if got := s.TakeResend(epoch); got != 12 {
		t.Fatalf("resend to %d, want 12", got)
	}
}

// FuzzSender: datagrams pushed, acknowledged in any (serial) order, resent
// and dropped: each buffer is freed exactly once, in sequence order, and
// only once an acknowledgement covers it (or on Drop); the timeout stays
// within its bounds.
func FuzzSender(f *testing.F) {
	f.Add(uint32(0), []byte{0, 1, 0, 2, 3, 1, 4})
	f.Add(^uint32(0)-5, []byte{0, 0, 0, 0, 1, 1, 2, 3, 3})
	f.Fuzz(func(t *testing.T, start uint32, ops []byte) {
		var s Sender
		next := start
		s.acked = start
		s.peerAck.Store(start)
		now := epoch
		freed := map[uint32]bool{}
		var lastFreed uint32 = start - 1
		free := func(d *Datagram) {
			if freed[d.Buf] {
				t.Fatalf("buffer %d freed twice", d.Buf)
			}
			if int32(d.Seq-lastFreed) <= 0 {
				t.Fatalf("freed %d after %d", d.Seq, lastFreed)
			}
			freed[d.Buf], lastFreed = true, d.Last
		}
		pushed := uint32(0)
		for _, op := range ops {
			now = now.Add(time.Duration(op) * 100 * time.Microsecond)
			switch op % 5 {
			case 0, 1: // a datagram of 1 to 2 messages
				n := uint32(op%2 + 1)
				s.Push(Datagram{Seq: next, Last: next + n - 1, Buf: pushed, Sent: now})
				next += n
				pushed++
			case 2: // an acknowledgement of some of what was sent
				ack := s.acked + uint32(op)%(next-s.acked+1)
				if s.OnAck(ack) {
					s.AckTime(now.Sub(epoch))
				}
				s.FreeAcked(epoch, free)
				for _, d := range s.Pending() {
					if int32(ack-d.Last) > 0 {
						t.Fatalf("datagram %d..%d kept after ack %d", d.Seq, d.Last, ack)
					}
				}
			case 3: // a resend scan
				for i := range s.Pending() {
					if due, _ := s.Due(&s.Pending()[i], now, 0); due {
						Resent(&s.Pending()[i], now)
					}
				}
			case 4:
				s.OnGap(s.acked + 1)
			}
			if s.rto != 0 && (s.rto < LossyMinRTO || s.rto > MaxRTO) {
				t.Fatalf("rto %v", s.rto)
			}
		}
		s.Drop(free)
		if len(freed) != int(pushed) {
			t.Fatalf("%d of %d buffers freed", len(freed), pushed)
		}
	})
}

// A timeout that fires doubles the timeout of every datagram after it, up
// to MaxRTO, until a datagram sent once gives a new sample (RFC 6298 5.5,
// 5.7): a round trip that grew past the timeout stops every message from
// being sent twice.
func TestSenderBackoff(t *testing.T) {
	var s Sender
	s.observe(time.Millisecond)
	if got := s.timeout(0, epoch); got != MinRTO {
		t.Fatalf("timeout after a 1 ms sample %v, want %v", got, MinRTO)
	}
	s.Backoff(epoch)
	if got := s.timeout(0, epoch); got != 2*MinRTO {
		t.Fatalf("timeout after one backoff %v, want %v", got, 2*MinRTO)
	}
	for range 10 {
		s.Backoff(epoch)
	}
	if got := s.timeout(0, epoch); got != MaxRTO {
		t.Fatalf("timeout after eleven backoffs %v, want %v", got, MaxRTO)
	}
	// Resent datagrams give no sample: the backed-off timeout stays.
	seq := push(&s, 0, epoch, 1)
	Resent(&s.Pending()[0], epoch.Add(200*time.Millisecond))
	s.OnAck(seq)
	s.AckTime(201 * time.Millisecond)
	s.FreeAcked(epoch, func(*Datagram) {})
	if got := s.timeout(0, epoch); got != MaxRTO {
		t.Fatalf("timeout after a resent datagram's ack %v, want it still %v", got, MaxRTO)
	}
	// A datagram sent once gives a sample: the estimate takes over again.
	next := push(&s, seq, epoch.Add(300*time.Millisecond), 1)
	s.OnAck(next)
	s.AckTime(302 * time.Millisecond)
	s.FreeAcked(epoch, func(*Datagram) {})
	if got := s.timeout(0, epoch); got >= MaxRTO {
		t.Fatalf("timeout after a fresh 2 ms sample %v, want it back under %v", got, MaxRTO)
	}
	var fresh Sender
	fresh.Backoff(epoch)
	if got := fresh.timeout(0, epoch); got != 2*InitRTO {
		t.Fatalf("backoff before any sample: %v, want %v", got, 2*InitRTO)
	}
}
