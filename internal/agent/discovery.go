package agent

import (
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
