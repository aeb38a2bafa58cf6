package reliable

import "time"

// Path is what an engine knows of one peer path (a UC QP to a peer and the
// RC QP beside it), and which of the two Auto's small messages take: as
// engine-reliable UC datagrams, or over RC, whose NIC recovers losses
// without the engine.
//
// Loss is measured from Auto's own datagrams: losses per datagram first
// sent, over windows of Window datagrams, folded into a moving average. A
// loss is a datagram the peer reported missing (a gap), or a
// retransmission timeout counted once: a timeout resends every datagram in
// flight, and most of those arrived (what was late was the
// acknowledgement, on RC), so counting each resend measured RC's recovery,
// not the datagrams' loss; on the soft fabric at 0.1% packet loss, that
// moved paths to RC. RC's own retry counters are not in the verbs
// interface per QP (the soft device counts per device, a NIC per port), so
// while the path is on RC it keeps measuring with probes: one eligible
// message in ProbeEvery still goes as a datagram. The round trip is the
// vconns' RFC 6298 estimate (Sender.TakeSample), averaged per path.
//
// The switch has hysteresis (PathPolicy): to RC at a loss share of
// HighLoss, back at LowLoss, and only after the path held its choice for
// HoldWindows windows and HoldRTTs round trips, so a burst of loss cannot
// make it flap.
//
// The thresholds are where the engine's recovery costs more than RC's: a
// lost datagram costs a resend and a stall of its vconn while the gap is
// reported (a round trip) or, at a burst's tail, a timeout (LossyMinRTO
// and more on a path that reports gaps); a lost RC packet costs the NIC a go-back-N and, at a tail, its
// local ACK timeout (the engine's RC QPs: 4.096 µs × 2^16, 268 ms). Measured
// on the soft fabric (docs/architecture.md, E5's loss sweep), UC datagrams
// stayed ahead of RC up to 5% packet loss at every small size (where a
// bundle of four packets is lost one time in five); so the switch to RC is
// set above that, where every third datagram is lost.
//
// A path belongs to the poller of its QPs; it takes no lock.
type Path struct {
	Policy     PathPolicy    // zero: DefaultPathPolicy; set before use
	sent, lost uint32        // this window: datagrams first sent, losses
	loss       float64       // losses per datagram, averaged over windows
	measured   bool          // a window closed: loss is valid
	srtt       time.Duration // averaged over the vconns' samples
	onRC       bool
	held       int       // windows since the last switch
	since      time.Time // when the last switch was
	probe      uint32    // eligible messages since the last probe, on RC
	switches   uint64
}

// PathPolicy is when a Path switches. The zero value is
// DefaultPathPolicy.
type PathPolicy struct {
	Window      uint32  // datagrams per loss window
	HighLoss    float64 // loss share at which small messages move to RC
	LowLoss     float64 // and back to UC
	HoldWindows int     // windows a choice holds at least
	HoldRTTs    int     // round trips a choice holds at least
	ProbeEvery  uint32  // on RC, one eligible message in ProbeEvery goes as a datagram
}

// DefaultPathPolicy is what engines use (see Path for the thresholds).
var DefaultPathPolicy = PathPolicy{
	Window: 128, HighLoss: 0.33, LowLoss: 0.10, HoldWindows: 4, HoldRTTs: 32, ProbeEvery: 16,
}

// lossWeight is the weight of a new window in the loss average (1/4, as
// RFC 6298 gives a new deviation).
const lossWeight = 0.25

func (p *Path) policy() *PathPolicy {
	if p.Policy.Window == 0 {
		return &DefaultPathPolicy
	}
	return &p.Policy
}

// Sent counts a datagram sent for the first time, at now; it closes a
// window every PathWindow datagrams and may switch the path, which it
// reports.
func (p *Path) Sent(now time.Time) (switched bool) {
	p.sent++
	if p.sent < p.policy().Window {
		return false
	}
	was := p.onRC
	p.fold(now)
	return p.onRC != was
}

// Lost counts a loss: a datagram resent on the peer's gap report, or a
// retransmission timeout (once, however many datagrams it resent).
func (p *Path) Lost() { p.lost++ }

// RTT folds in a vconn's round-trip sample (RFC 6298's weight, 1/8).
func (p *Path) RTT(sample time.Duration) {
	if sample <= 0 {
		return
	}
	if p.srtt == 0 {
		p.srtt = sample
		return
	}
	p.srtt += (sample - p.srtt) / 8
}

// fold closes a window: it averages the window's loss share in and
// applies the policy.
func (p *Path) fold(now time.Time) {
	share := float64(p.lost) / float64(p.sent)
	if p.measured {
		p.loss += lossWeight * (share - p.loss)
	} else {
		// The first window sets the average, and the hold counts
		// from it.
		p.loss, p.measured, p.since = share, true, now
	}
	p.sent, p.lost = 0, 0
	p.held++
	pol := p.policy()
	if p.held < pol.HoldWindows || now.Sub(p.since) < time.Duration(pol.HoldRTTs)*p.srtt {
		return
	}
	if p.onRC && p.loss <= pol.LowLoss || !p.onRC && p.loss >= pol.HighLoss {
		p.onRC = !p.onRC
		p.held, p.since = 0, now
		p.switches++
	}
}

// Datagram reports whether an Auto message small enough to be a datagram
// goes as one: always while the path is on UC, one in ProbeEvery while it
// is on RC. Call it once per message.
func (p *Path) Datagram() bool {
	if !p.onRC {
		return true
	}
	p.probe++
	if p.probe < p.policy().ProbeEvery {
		return false
	}
	p.probe = 0
	return true
}

// OnRC reports whether small messages go over RC (but for probes).
func (p *Path) OnRC() bool { return p.onRC }

// PathState is a path's estimate, for statistics.
type PathState struct {
	Loss     float64       // losses per datagram, averaged
	SRTT     time.Duration // round trip
	OnRC     bool
	Switches uint64
}

// State is the path's estimate.
func (p *Path) State() PathState {
	return PathState{Loss: p.loss, SRTT: p.srtt, OnRC: p.onRC, Switches: p.switches}
}
