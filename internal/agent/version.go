package agent

import (
	"fmt"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/rdmavisor/rdmavisor/internal/agent/controlpb"
)

// The control-plane protocol versions this agent speaks. Every call's
// caller (a Node) and every Identity answer carry the sender's range; two
// agents use the highest version both speak. The skew policy
// (docs/upgrades.md): an agent speaks its release's version and the
// previous release's, so agents one release apart interoperate during a
// rolling upgrade. A version that changes what a call means bumps
// ProtocolMax; dropping the previous release's raises ProtocolMin.
const (
	ProtocolMin = 1
	ProtocolMax = 1
)

// protocolRange is n's versions; an agent from before versions were
// carried sends neither and speaks version 1.
func protocolRange(n *controlpb.Node) (lo, hi uint32) {
	lo, hi = n.GetMinProtocol(), n.GetMaxProtocol()
	if hi == 0 {
		return 1, 1
	}
	if lo == 0 {
		lo = 1
	}
	return lo, hi
}

// negotiate is the version this agent and n speak: the highest both do.
// None is FailedPrecondition, naming both ranges.
func negotiate(n *controlpb.Node) (uint32, error) {
	lo, hi := protocolRange(n)
	v := min(hi, ProtocolMax)
	if lo > hi || v < max(lo, ProtocolMin) {
		return 0, status.Errorf(codes.FailedPrecondition,
			"agent %s speaks control protocol versions %d..%d, this agent %d..%d: agents more than one release apart do not interoperate (docs/upgrades.md)",
			n.GetName(), lo, hi, ProtocolMin, ProtocolMax)
	}
	return v, nil
}

// withProtocol stamps this agent's versions on n, one of its own Nodes.
func withProtocol(n *controlpb.Node) *controlpb.Node {
	n.MinProtocol, n.MaxProtocol = ProtocolMin, ProtocolMax
	return n
}

// errProtocol wraps negotiate's refusal of a peer's answer for the caller.
func errProtocol(err error) error {
	return fmt.Errorf("agent: %w", err)
}
