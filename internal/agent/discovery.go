package agent

import (
	"context"
	"fmt"
	"net"

	"github.com/rdmavisor/rdmavisor/internal/config"
)

// PeerInfo is a peer agent as discovery reports it.
type PeerInfo struct {
	NodeName string
	// Address is the peer's control plane, host:port.
	Address string
}

// Discovery finds the peer agents. The static implementation serves
// standalone mode; a Kubernetes one will read RDMANode objects.
type Discovery interface {
	// Peers returns the peers known now.
	Peers() []PeerInfo
	// Watch calls fn with the full peer list whenever it changes, until
	// ctx ends. It returns when ctx ends.
	Watch(ctx context.Context, fn func([]PeerInfo))
}

// Static is a fixed peer list.
type Static []PeerInfo

// StaticFromConfig reads the static peers of an agent configuration.
func StaticFromConfig(c *config.AgentConfig) Static {
	s := make(Static, 0, len(c.PeerDiscovery.Static))
	for _, p := range c.PeerDiscovery.Static {
		s = append(s, PeerInfo{NodeName: p.NodeName, Address: p.Address})
	}
	return s
}

// Peers returns the list.
func (s Static) Peers() []PeerInfo { return append([]PeerInfo(nil), s...) }

// Watch reports the list once; it never changes.
func (s Static) Watch(ctx context.Context, fn func([]PeerInfo)) {
	fn(s.Peers())
	<-ctx.Done()
}

// resolve finds the peer a dial's host names: a node name, or the host of
// a peer's control address.
func resolve(d Discovery, host string) (PeerInfo, error) {
	for _, p := range d.Peers() {
		if p.NodeName == host {
			return p, nil
		}
		if h, _, err := net.SplitHostPort(p.Address); err == nil && h == host {
			return p, nil
		}
	}
	return PeerInfo{}, fmt.Errorf("agent: no peer node %q", host)
}
