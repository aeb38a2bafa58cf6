package agent

import (
	"testing"

	"github.com/rdmavisor/rdmavisor/internal/discovery"
)

// PeersChanged is what discovery calls with the current peers.
func (a *Agent) PeersChanged(peers []discovery.Peer) { a.peersChanged(peers) }

// Remotes counts the peer agents a keeps.
func (a *Agent) Remotes() int {
	a.mu.Lock()
	defer a.mu.Unlock()
	return len(a.remotes)
}

// QueuedBytes reports allocation id's queued bytes (limits.queuedBytes),
// received and sent; ok is false if there is no such allocation.
func (a *Agent) QueuedBytes(id string) (rx, tx int64, ok bool) {
	a.mu.Lock()
	al := a.allocs[id]
	a.mu.Unlock()
	if al == nil {
		return 0, 0, false
	}
	rx, tx = al.queued()
	return rx, tx, true
}

// RegionsHeld reports what allocation id holds against limits.regions and
// limits.regionBytes; ok is false if there is no such allocation.
func (a *Agent) RegionsHeld(id string) (regions int, bytes int64, ok bool) {
	a.mu.Lock()
	al := a.allocs[id]
	a.mu.Unlock()
	if al == nil {
		return 0, 0, false
	}
	al.mu.Lock()
	defer al.mu.Unlock()
	return al.held.regions, al.held.regionBytes, true
}

// BeforeRestartFail has f run before a restarted peer's engine peers fail
// (beforeRestartFail), until the test ends.
func BeforeRestartFail(t testing.TB, f func()) {
	beforeRestartFail.Store(&f)
	t.Cleanup(func() { beforeRestartFail.Store(nil) })
}

// SetPeerLimits sets peerStreamLimit and peerCallLimit (and no Dials per
// vconn besides) until the test
// ends; call it before starting the agents.
func SetPeerLimits(t testing.TB, streams, calls int) {
	s, c, d := peerStreamLimit, peerCallLimit, peerDialsPerVConn
	peerStreamLimit, peerCallLimit, peerDialsPerVConn = streams, calls, 0
	t.Cleanup(func() { peerStreamLimit, peerCallLimit, peerDialsPerVConn = s, c, d })
}

// PeerStreamLimit is peerStreamLimit.
func PeerStreamLimit() int { return peerStreamLimit }

// FailedTellDelay is how long a pod's failing vconns are gathered into one
// Event.
const FailedTellDelay = failedTellDelay
