package engine

import (
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/rdmavisor/rdmavisor/internal/transport"
	"github.com/rdmavisor/rdmavisor/internal/verbs"
)

// Stats is a snapshot of the engine's counters.
type Stats struct {
	VConns       int // open now
	Peers        int
	QPs          int    // RC QPs this engine created, to all peers
	UCQPs        int    // UC QPs this engine created, to all peers
	IngressQPs   int    // RC QPs peers created toward this engine
	MsgsSent     uint64 // messages handed to the device (once each: not their retransmissions)
	MsgsReceived uint64 // messages delivered to vconns
	Posts        uint64 // PostSend calls (doorbells)
	WRsPosted    uint64 // send WRs posted; WRsPosted/Posts is the batch size
	StaleDropped uint64 // completions for closed vconns, dropped
	Malformed    uint64 // messages with a bad header, dropped
	CreditStalls uint64 // times a vconn waited for credits
	Sleeps       uint64 // times a poller blocked on its completion channel
	Retransmits  uint64 // Auto datagrams sent again for want of an ACK
	GapResends   uint64 // of those, sent at once on the peer's gap report
	Bundled      uint64 // messages sent in bundles (auto.go)
	Gathered     uint64 // of those, sent from their own buffers, not copied
	SentInPlace  uint64 // messages sent from staging memory in place (SendStaged)
	AutoToRC     uint64 // peer paths whose Auto small messages moved to RC under loss (reliable.Path)
	AutoToUC     uint64 // and back
	BuffersInUse []int  // per pool class
	// RecvBuffersHeld and DgramBuffersHeld are the receive buffers of
	// the RC QPs' SRQ and of the datagram SRQ that received messages
	// hold, queued for the application or read and not yet released.
	// Each stays at or under half its SRQ (plus one per poller, for a
	// moment): past that, a message is copied out of its buffer, which
	// goes back to the SRQ at once (RecvCopied).
	RecvBuffersHeld  int
	DgramBuffersHeld int
	RecvCopied       uint64 // messages copied out of their receive buffers so (see above)
	// QPsReplaced counts the shared QPs that failed while their peer was
	// alive and whose vconns were carried to a new QP (repair.go);
	// ResentDropped the data chunks the peers sent again after such a
	// replacement that had arrived already, dropped.
	QPsReplaced   uint64
	ResentDropped uint64
	// RegisteredBytes is the memory of exported regions (and of vconns'
	// staging memory, VConn.Stage) registered now, whatever holds it:
	// exported, withdrawn and awaiting the peer's confirmation, or kept
	// for the grace after its vconn ended. The engine's buffer pool is
	// not counted (it is fixed).
	RegisteredBytes int64
}

type counters struct {
	msgsSent, msgsReceived, posts, wrsPosted, malformed, creditStalls, sleeps, retransmits, gapResends, toRC, toUC, bundled, gathered, inPlace, recvCopied, qpsReplaced, resentDropped atomic.Uint64
}

// Stats returns the engine's counters.
func (e *Engine) Stats() Stats {
	s := Stats{
		VConns:       e.vconns.Len(),
		MsgsSent:     e.stats.msgsSent.Load(),
		MsgsReceived: e.stats.msgsReceived.Load(),
		Posts:        e.stats.posts.Load(),
		WRsPosted:    e.stats.wrsPosted.Load(),
		StaleDropped: e.vconns.Stale(),
		Malformed:    e.stats.malformed.Load(),
		CreditStalls: e.stats.creditStalls.Load(),
		Sleeps:       e.stats.sleeps.Load(),
		Retransmits:  e.stats.retransmits.Load(),
		GapResends:   e.stats.gapResends.Load(),
		AutoToRC:     e.stats.toRC.Load(),
		AutoToUC:     e.stats.toUC.Load(),
		Bundled:      e.stats.bundled.Load(),
		Gathered:     e.stats.gathered.Load(),
		SentInPlace:  e.stats.inPlace.Load(),
		BuffersInUse: e.pool.inUse(),

		RecvBuffersHeld:  int(e.held[0].Load()),
		DgramBuffersHeld: int(e.held[1].Load()),
		RecvCopied:       e.stats.recvCopied.Load(),
		QPsReplaced:      e.stats.qpsReplaced.Load(),
		ResentDropped:    e.stats.resentDropped.Load(),
		RegisteredBytes:  e.registered.Load(),
	}
	e.peersMu.Lock()
	s.Peers = len(e.peers)
	for _, p := range e.peers {
		p.mu.Lock()
		rc, uc := p.countQPs()
		s.QPs += rc
		s.UCQPs += uc
		s.IngressQPs += len(p.ingress)
		p.mu.Unlock()
	}
	e.peersMu.Unlock()
	return s
}

// NumTransports is the number of Transport values, for arrays indexed by
// transport; a vconn's is never transport.Unknown, whose entry stays zero.
const NumTransports = transport.Count

// Traffic counts messages and their payload bytes (the application's
// bytes: headers, retransmissions and control messages excluded).
type Traffic struct {
	Msgs  uint64
	Bytes uint64
}

// PollerStats is one poller's share of the engine's work.
type PollerStats struct {
	// Busy is the time the poller spent in rounds that found work, since
	// the engine started; Busy over the wall time between two snapshots
	// is its busy ratio. It never decreases between snapshots. It is
	// measured on the poller's coarse clock (see poller.clock): a busy
	// period may count up to clockRounds empty rounds before it, a small
	// overestimate bought with no clock read per round.
	Busy time.Duration
	// Uptime is the wall time since the engine started.
	Uptime time.Duration
}

// StateCounts counts vconns by state. Closed vconns are released at once,
// so they have no count.
type StateCounts struct {
	Connecting, Open, Closing, Failed int
}

// PeerStats describes one peer: the QPs shared by its vconns and those
// vconns by state.
type PeerStats struct {
	GID        verbs.GID
	RCQPs      int // RC QPs this engine created toward the peer
	UCQPs      int // UC QPs this engine created toward the peer
	IngressQPs int // RC QPs the peer created toward this engine
	VConns     StateCounts
}

// pollerCounters are one poller's counters. Only the poller's goroutine
// writes them, so the atomic adds never contend (they cost about a plain
// increment on a line the poller owns); Stats reads them with atomic loads
// at any time. The padding keeps them off the lines of the poller fields
// other goroutines write (queued, sleeping, mu).
type pollerCounters struct {
	_    [64]byte
	sent [NumTransports]trafficCounters
	recv [NumTransports]trafficCounters
	// busyNs is the length of the busy periods that ended; busyFrom is
	// when the current one began, in ns since the epoch (0: idle). A
	// period is only counted once it ends: see busyTime.
	busyNs   atomic.Int64
	busyFrom atomic.Int64
	rejected [NumRejectReasons]atomic.Uint64
	_        [64]byte
}

// RejectReason says why the engine refused an inbound message that named
// a live vconn (messages for no live vconn are Stats.StaleDropped; those
// with a bad header Stats.Malformed).
type RejectReason uint8

const (
	// RejectPeer: the message came from a node other than the vconn's
	// peer, on a QP no peer made toward this engine, or on one of the
	// peer's QPs other than those the peer's vconn sends on.
	RejectPeer RejectReason = iota
	// RejectTransport: the message came on a QP its kind never travels
	// on: control, or an RC vconn's data, as a datagram (control always
	// travels over RC; only UD vconns' data on UD QPs, only UC and Auto
	// vconns' on UC QPs).
	RejectTransport
	// RejectCredit: data beyond the receive credits this engine granted.
	// The vconn fails (ErrCreditOverrun).
	RejectCredit
	// RejectGrant: a credit grant beyond what the peer could have granted
	// (more than MaxCredits past the last grant); it is cut to that.
	RejectGrant
	// RejectOverflow: a UC or UD datagram for a vconn whose receive queue
	// already holds MaxCredits messages; datagrams may be lost.
	RejectOverflow
	// RejectForged: a message without the secret of the QP pair it came
	// on (of the peer's datagrams, on UD), which the peer's engine was
	// given over the control plane: a host that spoofs the peer's
	// address, or a peer engine that lost its QPs' secrets (restarted).
	// Dropped unread (format.Authentic).
	RejectForged
	// NumRejectReasons is the number of reasons, for arrays indexed by
	// reason.
	NumRejectReasons
)

func (r RejectReason) String() string {
	switch r {
	case RejectPeer:
		return "peer"
	case RejectTransport:
		return "transport"
	case RejectCredit:
		return "credit"
	case RejectGrant:
		return "grant"
	case RejectOverflow:
		return "overflow"
	case RejectForged:
		return "forged"
	}
	return fmt.Sprintf("reject(%d)", uint8(r))
}

// reject counts a message refused for reason r.
func (p *poller) reject(r RejectReason) { p.st.rejected[r].Add(1) }

// RejectStats returns how many inbound messages the engine refused, by
// reason (indexed by RejectReason).
func (e *Engine) RejectStats() (n [NumRejectReasons]uint64) {
	for _, p := range e.pollers {
		for r := range n {
			n[r] += p.st.rejected[r].Load()
		}
	}
	return n
}

type trafficCounters struct{ msgs, bytes atomic.Uint64 }

func (c *trafficCounters) add(msgs, bytes int) {
	c.msgs.Add(uint64(msgs))
	c.bytes.Add(uint64(bytes))
}

func (c *trafficCounters) load() Traffic {
	return Traffic{Msgs: c.msgs.Load(), Bytes: c.bytes.Load()}
}

// beginBusy and endBusy bracket a run of rounds that found work. They use
// the poller's coarse clock, which a busy round resets, so a period costs
// one or two clock reads whatever its length.
func (p *poller) beginBusy() {
	p.loop.busy = true
	p.st.busyFrom.Store(int64(p.clock().Sub(p.e.epoch)) + 1) // never 0
}

func (p *poller) endBusy() {
	p.loop.busy = false
	from := p.st.busyFrom.Load() - 1
	// Cleared before the period is added, so a reader that sees busyFrom
	// unchanged on both sides of its busyNs load saw busyNs without it.
	p.st.busyFrom.Store(0)
	p.st.busyNs.Add(int64(p.clock().Sub(p.e.epoch)) - from)
}

// busyTime is the poller's busy time, the current period included as far
// as now.
func (c *pollerCounters) busyTime(now int64) int64 {
	from := c.busyFrom.Load()
	ns := c.busyNs.Load()
	if from != 0 && c.busyFrom.Load() == from {
		ns += max(0, now-(from-1))
	}
	return ns
}

// busyFloor keeps each poller's reported busy time from going backwards:
// a snapshot taken as a period ends may see neither it in busyNs nor its
// start in busyFrom, a little less than the snapshot before.
type busyFloor struct {
	mu   sync.Mutex
	last []int64 // by poller; guarded by mu
}

// TrafficStats returns the messages and bytes sent and received, by
// transport (indexed by Transport). Sent counts each message once, when
// it is handed to the device (retransmissions are in Stats.Retransmits);
// received counts each message delivered to its vconn.
func (e *Engine) TrafficStats() (sent, received [NumTransports]Traffic) {
	for _, p := range e.pollers {
		for t := range NumTransports {
			s, r := p.st.sent[t].load(), p.st.recv[t].load()
			sent[t].Msgs += s.Msgs
			sent[t].Bytes += s.Bytes
			received[t].Msgs += r.Msgs
			received[t].Bytes += r.Bytes
		}
	}
	return sent, received
}

// PollerStats returns each poller's busy time.
func (e *Engine) PollerStats() []PollerStats {
	now := int64(time.Since(e.epoch))
	out := make([]PollerStats, len(e.pollers))
	e.busyFloor.mu.Lock()
	defer e.busyFloor.mu.Unlock()
	if e.busyFloor.last == nil {
		e.busyFloor.last = make([]int64, len(e.pollers))
	}
	for i, p := range e.pollers {
		b := max(p.st.busyTime(now), e.busyFloor.last[i])
		e.busyFloor.last[i] = b
		out[i] = PollerStats{Busy: time.Duration(b), Uptime: time.Duration(now)}
	}
	return out
}

// PeerStats describes each live peer, and counts all vconns by state
// (those of failed peers' too). It walks every vconn: a scrape's cost,
// not a message's.
func (e *Engine) PeerStats() ([]PeerStats, StateCounts) {
	var all StateCounts
	e.peersMu.Lock()
	defer e.peersMu.Unlock()
	out := make([]PeerStats, 0, len(e.peers))
	for _, p := range e.peers {
		s := PeerStats{GID: p.gid}
		p.mu.Lock()
		s.RCQPs, s.UCQPs = p.countQPs()
		s.IngressQPs = len(p.ingress)
		s.VConns = p.countStates()
		p.mu.Unlock()
		all.add(s.VConns)
		out = append(out, s)
	}
	for _, p := range e.retired {
		p.mu.Lock()
		all.add(p.countStates())
		p.mu.Unlock()
	}
	return out, all
}

// countQPs counts the RC and UC QPs this engine has toward the peer; the
// caller holds p.mu.
func (p *Peer) countQPs() (rc, uc int) {
	for _, q := range p.qps {
		if q != nil {
			rc++
		}
	}
	for _, q := range p.ucs {
		if q != nil {
			uc++
		}
	}
	return rc, uc
}

// countStates counts the peer's vconns by state; the caller holds p.mu.
func (p *Peer) countStates() StateCounts {
	var c StateCounts
	for vc := p.list; vc != nil; vc = vc.next {
		switch vc.state.Load() {
		case stateConnecting:
			c.Connecting++
		case stateOpen:
			c.Open++
		case stateClosing:
			c.Closing++
		case stateFailed:
			c.Failed++
		}
	}
	return c
}

func (c *StateCounts) add(o StateCounts) {
	c.Connecting += o.Connecting
	c.Open += o.Open
	c.Closing += o.Closing
	c.Failed += o.Failed
}

// countSent counts msgs application messages of bytes payload bytes that
// the poller handed to the device on a vconn of transport tr.
func (p *poller) countSent(tr transport.Kind, msgs, bytes int) {
	p.st.sent[tr].add(msgs, bytes)
}
