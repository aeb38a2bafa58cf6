package reliable

import (
	"sync/atomic"
	"time"

	"github.com/rdmavisor/rdmavisor/internal/engine/format"
)

// The retransmission timeout is for the tail of a burst only: a loss with
// anything after it is reported as a gap and resent at once (Receiver).
// So it can afford to wait out the stalls a busy host imposes on pollers
// and the soft device's goroutines: a thread waits a scheduler slice or
// several for a core (Linux's CFS stretches its 12 ms period on 2 CPUs
// with more runnable threads). With four CPU-bound processes beside two
// agents on 2 CPUs, a 5 ms floor resent up to 6 of 2,000 echoes on a
// lossless link (4 runs of 5; 25 ms: none in 5), and each spurious timeout
// also counts as a loss against Auto's path (TestSpuriousTimeouts). Only a path whose peer
// has reported a gap lately, the sign of real loss, waits the shorter
// LossyMinRTO, as eRPC's 5 ms: there a tail loss is likely, and waiting
// 25 ms for each cut E5's rate at 5% loss to a quarter.
const (
	MinRTO      = 25 * time.Millisecond // the floor on a path that lost nothing lately
	LossyMinRTO = 5 * time.Millisecond  // the floor within LossyHold of a gap report
	LossyHold   = time.Second
	InitRTO     = 50 * time.Millisecond // before the first round-trip sample
	MaxRTO      = 160 * time.Millisecond
	// MaxTries: about 3 to 4 s of silence before the vconn fails. The
	// peer's agent is declared gone by its heartbeat after 2 s; this is
	// for a path that fails while the control plane still answers, and
	// must outlast the stalls of a host whose pollers share few cores.
	MaxTries = 24
	// AckDelay bounds how long an acknowledgement waits for company:
	// well under MinRTO, so it never makes the sender time out.
	AckDelay = 100 * time.Microsecond
)

// Datagram is a datagram awaiting acknowledgement: one message, or a
// bundle of the messages Seq..Last.
type Datagram struct {
	Seq, Last uint32
	Buf       uint32 // the engine's name for its buffer (a pool slot)
	Len       uint32 // bytes of Buf posted
	Tries     int32  // times resent
	Gather    bool   // Buf is a gathered bundle's header buffer (the engine's serve.go)
	Sent      time.Time
}

// Sender is the send side of an Auto vconn.
type Sender struct {
	// unacked[head:] are the datagrams not yet acknowledged, in sequence
	// order; owner only.
	unacked []Datagram
	head    int
	acked   uint32 // the acknowledgement unacked reflects; owner only
	// Round-trip estimate and retransmission timeout, as TCP's (RFC
	// 6298): a fixed timeout short enough for an idle path fires
	// spuriously on a busy one, where acknowledgements are delayed and
	// pollers share cores. Owner only.
	srtt, rttvar, rto time.Duration
	sample            time.Duration // the newest sample, until taken (TakeSample)
	// Written by the receiving pollers: the newest acknowledgement, when
	// it came (since the engine's epoch), and the end of a gap the peer
	// reported, 0 once taken.
	peerAck   atomic.Uint32
	peerAckAt atomic.Int64
	resendTo  atomic.Uint32
	// lossyUntil: the peer reported a gap within LossyHold before it, so
	// the floor is LossyMinRTO until then. Owner only.
	lossyUntil time.Time
}

// Push keeps d until it is acknowledged. Owner only.
func (s *Sender) Push(d Datagram) { s.unacked = append(s.unacked, d) }

// OnAck records an acknowledgement the peer sent and reports whether it is
// news; the caller then says when it came (AckTime) and has the owner free
// what it covers (FreeAcked). Any poller.
func (s *Sender) OnAck(ack uint32) bool { return format.Advance(&s.peerAck, ack) }

// AckTime records when the newest acknowledgement came, since the engine's
// epoch. Any poller, after OnAck reported news.
func (s *Sender) AckTime(sinceEpoch time.Duration) { s.peerAckAt.Store(int64(sinceEpoch)) }

// OnGap records a gap the peer reported: the datagrams from its
// acknowledgement up to end are missing. Any poller; the owner resends
// them (TakeResend) at its next scan.
func (s *Sender) OnGap(end uint32) {
	for {
		old := s.resendTo.Load()
		if old != 0 && int32(end-old) <= 0 {
			return
		}
		if s.resendTo.CompareAndSwap(old, end) {
			return
		}
	}
}

// TakeResend returns the end of the gap last reported and forgets it (0:
// none); a gap makes the path lossy until LossyHold after now. Owner only.
func (s *Sender) TakeResend(now time.Time) uint32 {
	end := s.resendTo.Swap(0)
	if end != 0 {
		s.lossyUntil = now.Add(LossyHold)
	}
	return end
}

// FreeAcked hands free the datagrams the peer acknowledged, oldest first,
// and updates the round-trip estimate from the newest one sent only once
// (Karn's rule); epoch is what AckTime counted from. Owner only; free may
// not call back into s.
func (s *Sender) FreeAcked(epoch time.Time, free func(*Datagram)) {
	ack := s.peerAck.Load()
	if ack == s.acked {
		return
	}
	s.acked = ack
	at := epoch.Add(time.Duration(s.peerAckAt.Load()))
	var sample time.Duration
	for s.head < len(s.unacked) && int32(ack-s.unacked[s.head].Last) > 0 {
		d := &s.unacked[s.head]
		if d.Tries == 0 {
			sample = at.Sub(d.Sent)
		}
		free(d)
		*d = Datagram{}
		s.head++
	}
	switch {
	case s.head == len(s.unacked):
		s.unacked, s.head = s.unacked[:0], 0
	case s.head > len(s.unacked)/2:
		n := copy(s.unacked, s.unacked[s.head:])
		clear(s.unacked[n:])
		s.unacked, s.head = s.unacked[:n], 0
	}
	if sample > 0 {
		s.observe(sample)
	}
}

// TakeSample returns the round-trip sample FreeAcked took since the last
// call, or 0: the engine folds it into its path's estimate (Path.RTT).
// Owner only.
func (s *Sender) TakeSample() time.Duration {
	d := s.sample
	s.sample = 0
	return d
}

// Drop hands free every datagram still unacknowledged: the vconn will send
// no more. Owner only.
func (s *Sender) Drop(free func(*Datagram)) {
	for i := s.head; i < len(s.unacked); i++ {
		free(&s.unacked[i])
	}
	s.unacked, s.head = nil, 0
}

// Pending is the datagrams not yet acknowledged, oldest first. The owner
// scans them to resend (Due, Resent); the slice is valid until its next
// Push, FreeAcked or Drop.
func (s *Sender) Pending() []Datagram { return s.unacked[s.head:] }

// Waiting reports whether any datagram awaits acknowledgement. Owner only.
func (s *Sender) Waiting() bool { return s.head < len(s.unacked) }

// Due reports whether d goes again at now: its timeout passed, or it is in
// the gap the peer reported (up to resendTo, from TakeResend) and was not
// resent less than a round trip ago (the report may have crossed it).
// early says it goes before its timeout, on the gap report. Owner only.
func (s *Sender) Due(d *Datagram, now time.Time, resendTo uint32) (due, early bool) {
	age := now.Sub(d.Sent)
	gap := resendTo != 0 && int32(d.Seq-resendTo) < 0 && (d.Tries == 0 || age >= s.srtt)
	early = age < s.timeout(d.Tries, now)
	return gap || !early, early
}

// Dead reports whether d was resent as often as it may be: the peer is
// gone.
func Dead(d *Datagram) bool { return d.Tries >= MaxTries }

// Resent records that d went again at now.
func Resent(d *Datagram, now time.Time) { d.Sent, d.Tries = now, d.Tries+1 }

// Backoff doubles the retransmission timeout after a timeout fired (RFC
// 6298 5.5), up to MaxRTO, until a datagram sent once is acknowledged and
// gives a new sample (Karn's rule). Without it, on a path whose round trip
// grew past the timeout (pollers starved of CPU), every datagram times out,
// none gives a sample, and the timeout never grows: every message is sent
// twice or more, on the path that could least afford it. Owner only.
func (s *Sender) Backoff(now time.Time) {
	s.rto = min(2*s.timeout(0, now), MaxRTO)
}

// observe folds a round-trip sample into the estimate (RFC 6298 2.2-2.3).
func (s *Sender) observe(sample time.Duration) {
	s.sample = sample
	if s.srtt == 0 {
		s.srtt, s.rttvar = sample, sample/2
	} else {
		d := s.srtt - sample
		if d < 0 {
			d = -d
		}
		s.rttvar = (3*s.rttvar + d) / 4
		s.srtt = (7*s.srtt + sample) / 8
	}
	s.rto = min(max(s.srtt+4*s.rttvar, LossyMinRTO), MaxRTO)
}

// timeout is the retransmission timeout at now of a datagram sent tries+1
// times: the estimate, at least the floor the path's recent losses allow.
func (s *Sender) timeout(tries int32, now time.Time) time.Duration {
	rto := s.rto
	if rto == 0 {
		rto = InitRTO
	}
	if now.After(s.lossyUntil) {
		rto = max(rto, MinRTO)
	}
	return min(rto<<tries, MaxRTO)
}
