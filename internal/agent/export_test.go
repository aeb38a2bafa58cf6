package agent

import "github.com/rdmavisor/rdmavisor/internal/discovery"

// PeersChanged is what discovery calls with the current peers.
func (a *Agent) PeersChanged(peers []discovery.Peer) { a.peersChanged(peers) }

// Remotes counts the peer agents a keeps.
func (a *Agent) Remotes() int {
	a.mu.Lock()
	defer a.mu.Unlock()
	return len(a.remotes)
}
