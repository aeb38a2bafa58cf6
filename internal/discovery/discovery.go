// Package discovery is how a node agent finds the other agents: the Peer
// a Source reports, and Static, the fixed list of standalone mode. Package
// rdmanode implements Source over RDMANode objects; package agent consumes
// it. It imports nothing of the data plane.
package discovery

import (
	"context"
	"slices"

	"github.com/rdmavisor/rdmavisor/internal/config"
)

// Peer is a peer agent as discovery reports it.
type Peer struct {
	NodeName string
	// Address is the peer's control plane, host:port.
	Address string
	// RailGIDs are the GIDs of the peer's rails 1.. (multi-rail), as IP
	// addresses, by rail; "" where not known. Its RDMANode says them,
	// which only its own agent may write: under mutual TLS they vouch
	// for a rail's GID that its certificate does not name (the signer
	// certifies only the Node's addresses).
	RailGIDs []string
}

// Equal says whether p and q are the same peer at the same addresses.
func (p Peer) Equal(q Peer) bool {
	return p.NodeName == q.NodeName && p.Address == q.Address && slices.Equal(p.RailGIDs, q.RailGIDs)
}

// Source finds the peer agents. Static serves standalone mode; package
// rdmanode reads RDMANode objects.
type Source interface {
	// Peers returns the peers known now.
	Peers() []Peer
	// Watch calls fn with the full peer list whenever it changes, until
	// ctx ends. It returns when ctx ends.
	Watch(ctx context.Context, fn func([]Peer))
}

// Static is a fixed peer list.
type Static []Peer

// StaticFromConfig reads the static peers of an agent configuration.
func StaticFromConfig(c *config.AgentConfig) Static {
	s := make(Static, 0, len(c.PeerDiscovery.Static))
	for _, p := range c.PeerDiscovery.Static {
		s = append(s, Peer{NodeName: p.NodeName, Address: p.Address, RailGIDs: slices.Clone(p.RailGIDs)})
	}
	return s
}

// Peers returns the list.
func (s Static) Peers() []Peer { return append([]Peer(nil), s...) }

// Watch reports the list once; it never changes.
func (s Static) Watch(ctx context.Context, fn func([]Peer)) {
	fn(s.Peers())
	<-ctx.Done()
}
