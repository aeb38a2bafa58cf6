package agent

import (
	"errors"
	"fmt"
	"net"

	"github.com/rdmavisor/rdmavisor/internal/discovery"
)

// resolve finds the peer a dial's host names: a node name, or the host of
// a peer's control address.
func resolve(d discovery.Source, host string) (discovery.Peer, error) {
	for _, p := range d.Peers() {
		if p.NodeName == host {
			return p, nil
		}
		if h, _, err := net.SplitHostPort(p.Address); err == nil && h == host {
			return p, nil
		}
	}
	return discovery.Peer{}, fmt.Errorf("agent: no peer node %q", host)
}

// peersChanged connects to discovered peers so heartbeats watch them, and
// forgets the ones that left once no vconn uses them: their control
// connection, heartbeat and engine peer (with its QPs) go.
func (a *Agent) peersChanged(peers []discovery.Peer) {
	known := make(map[string]bool, len(peers))
	for _, p := range peers {
		known[p.NodeName] = true
		if _, err := a.remoteFor(p.NodeName, p.Address, true); err != nil {
			a.log.Error(err, "Cannot reach peer agent", "peer", p.NodeName)
		}
	}
	var gone []*remote
	a.mu.Lock()
	for node, r := range a.remotes {
		if !known[node] && r.forget() {
			delete(a.remotes, node)
			gone = append(gone, r)
		}
	}
	for gid, node := range a.gids {
		if a.remotes[node] == nil {
			delete(a.gids, gid)
		}
	}
	for node := range a.announced {
		if a.remotes[node] == nil {
			delete(a.announced, node)
		}
	}
	a.mu.Unlock()
	for _, r := range gone {
		r.close()
		a.log.Info("Forgot a peer agent that left", "peer", r.node, "address", r.addr)
	}
}

// forget drops the remote's engine peer unless a vconn uses it, and
// reports whether the remote may go.
func (r *remote) forget() bool {
	r.mu.Lock()
	peers := r.peersLocked()
	r.mu.Unlock()
	gone := true
	for rail, p := range peers {
		if p != nil && !r.a.engines[rail].Forget(p.GID(), errors.New("its node left the cluster")) {
			gone = false
		}
	}
	return gone
}
