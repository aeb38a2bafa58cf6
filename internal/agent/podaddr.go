package agent

import (
	"context"
	"fmt"
	"net/netip"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/rdmavisor/rdmavisor/internal/discovery"
)

// PodAddresses says which node runs the pod that has an IP: in Kubernetes
// mode the API server's word (a Pod's status.podIPs and spec.nodeName,
// through an informer: package rdmanode's PodIPs), which no agent can
// change. With it, peers' announcements route nothing: a node holding a
// valid certificate could otherwise claim other nodes' pod IPs, and take
// their dials while their node's agent restarts. Without it (standalone
// mode, static peers), announcements do.
type PodAddresses interface {
	// NodeOf returns the node of the running pod that has ip; false when
	// none has it, as far as the API server said yet.
	NodeOf(ip netip.Addr) (node string, ok bool)
}

// podAddrWait is how long an IP the API server has not placed yet is
// looked up again: a pod that just started dials and is dialled before
// every agent's informer saw its IP (watch latency, tens of ms).
const podAddrWait = routeWait

// routeByAPI finds the node of pod IP ip from the API server: this one
// (the CNI registered the pod with this agent), or a peer of the
// service. A node without a peer agent is unreachable: its pods hold no
// vconns.
func (a *Agent) routeByAPI(ip netip.Addr) (target, error) {
	node, ok := a.opts.PodAddresses.NodeOf(ip)
	if !ok {
		return target{}, fmt.Errorf("%w: no pod has IP %s (as the API server says; a Service's ClusterIP is no pod's: a vconn server's Service must be headless)", errUnreachable, ip)
	}
	if node == a.cfg.NodeName {
		a.mu.Lock()
		local := a.podOfIPLocked(ip) != ""
		a.mu.Unlock()
		if !local {
			return target{}, fmt.Errorf("%w: pod IP %s is on this node, %s, and its pod holds no vconns here", errUnreachable, ip, node)
		}
		return target{peer: discovery.Peer{NodeName: a.cfg.NodeName, Address: a.ctlAddr}, ip: ip}, nil
	}
	for _, p := range a.disc.Peers() {
		if p.NodeName == node {
			return target{peer: p, ip: ip}, nil
		}
	}
	return target{}, fmt.Errorf("%w: pod IP %s is on node %s, which has no ready agent of this service", errUnreachable, ip, node)
}

// checkFromIP refuses a Dial whose caller's pod IP the API server does not
// place on the calling node: a listener sees the source IP, and a policy
// may decide by it, so a node must not name another node's pod (or one of
// this node's) as its caller. No IP (a host service's dial) and
// standalone mode pass.
func (a *Agent) checkFromIP(ctx context.Context, raw []byte, caller string) error {
	if a.opts.PodAddresses == nil || len(raw) == 0 {
		return nil
	}
	ip, ok := netip.AddrFromSlice(raw)
	if !ok {
		return status.Errorf(codes.InvalidArgument, "dial: caller's IP of %d bytes", len(raw))
	}
	ip = ip.Unmap()
	ctx, cancel := context.WithTimeout(ctx, podAddrWait)
	defer cancel()
	for {
		node, known := a.opts.PodAddresses.NodeOf(ip)
		if known && node == caller {
			return nil
		}
		if known {
			return status.Errorf(codes.PermissionDenied, "dial: the caller's pod IP %s is on node %s, not the calling node %s", ip, node, caller)
		}
		select {
		case <-ctx.Done():
			return status.Errorf(codes.PermissionDenied, "dial: no pod has the caller's IP %s (as the API server says)", ip)
		case <-time.After(50 * time.Millisecond):
		}
	}
}
