package agent

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"time"

	"github.com/rdmavisor/rdmavisor/internal/discovery"
	"github.com/rdmavisor/rdmavisor/internal/frame"
	"github.com/rdmavisor/rdmavisor/internal/verbs"
)

// A vconn address names a port space and a port, as a TCP address does:
// each pod has its own port space, named by its pod IP; the node's host
// services (allocations made for no pod: standalone agents, tests, the
// demo) share the node's, named by the node's name or address.

// portKey is a listener's place: the port space (a pod's UID; "" for the
// node's host services) and the port.
type portKey struct {
	scope string
	port  uint32
}

// Errors of addressing; codeOf maps them to the protocol's codes.
var (
	errNoAddress   = errors.New("the allocation's pod has no address")
	errUnknownHost = errors.New("unknown host")
)

// podWait bounds how long a Listen or Dial of a pod's allocation waits for
// the agent to learn the pod (CNI ADD, the device plugin's binding): at a
// pod's start, its container may run before either is known. routeWait
// bounds how long a Dial waits for a peer to announce the pod IP dialed
// (a pod that just started; announcements go out at once).
const (
	podWait   = 5 * time.Second
	routeWait = 2 * time.Second
)

// scope is the port space the allocation listens and dials in, and the
// IPs that name it (none for host services). A pod's allocation waits up
// to podWait for its pod to be bound and registered.
func (al *allocation) scope(ctx context.Context) (string, []netip.Addr, error) {
	if !al.podScoped {
		return "", nil, nil
	}
	ctx, cancel := context.WithTimeout(ctx, podWait)
	defer cancel()
	for {
		al.mu.Lock()
		pod := al.pod
		al.mu.Unlock()
		if pod != "" {
			if uid, ips := al.a.podNamed(pod); uid != "" && len(ips) > 0 {
				return uid, ips, nil
			}
		}
		select {
		case <-ctx.Done():
			if pod == "" {
				return "", nil, fmt.Errorf("allocation %s: %w: the device plugin has not named its pod", al.id, errNoAddress)
			}
			return "", nil, fmt.Errorf("allocation %s of pod %s: %w: the CNI plugin has not registered the pod's IPs (a hostNetwork pod has none)", al.id, pod, errNoAddress)
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// podNamed returns the UID and IPs of the registered pod "namespace/name"
// that registered last (a pod re-created under its name registers before
// the old one's DEL may come).
func (a *Agent) podNamed(name string) (string, []netip.Addr) {
	a.mu.Lock()
	defer a.mu.Unlock()
	var uid string
	var seq uint64
	for u, p := range a.pods {
		if p.Namespace+"/"+p.Name == name && a.podSeq[u] >= seq {
			uid, seq = u, a.podSeq[u]
		}
	}
	if uid == "" {
		return "", nil
	}
	return uid, ipsOf(a.pods[uid].IPs)
}

// ipsOf parses registered IPs (RegisterPod checked them).
func ipsOf(ss []string) []netip.Addr {
	out := make([]netip.Addr, 0, len(ss))
	for _, s := range ss {
		if ip, err := netip.ParseAddr(s); err == nil {
			out = append(out, ip.Unmap().WithZone(""))
		}
	}
	return out
}

// podOfIPLocked returns the UID of the registered pod with ip; "" if none.
// Of two that have it, the later registered: an IP is one pod's at a
// time, so the other is gone and its DEL was missed (the agent was down;
// the CNI plugin's GC drops it later). a.mu is held.
func (a *Agent) podOfIPLocked(ip netip.Addr) string {
	var uid string
	var seq uint64
	for u, p := range a.pods {
		for _, q := range ipsOf(p.IPs) {
			if q == ip && a.podSeq[u] >= seq {
				uid, seq = u, a.podSeq[u]
			}
		}
	}
	return uid
}

// podIPsLocked returns every registered pod's IPs and the version of that
// set. a.mu is held.
func (a *Agent) podIPsLocked() ([]netip.Addr, uint64) {
	var out []netip.Addr
	for _, p := range a.pods {
		out = append(out, ipsOf(p.IPs)...)
	}
	return out, a.podsVer
}

// isNodeAddr reports whether ip is this node's own: its bind address or
// its control address's host.
func (a *Agent) isNodeAddr(ip netip.Addr) bool {
	if b, err := a.bindAddr(); err == nil && b.Unmap() == ip {
		return true
	}
	if ap, err := netip.ParseAddrPort(a.ctlAddr); err == nil && ap.Addr().Unmap() == ip {
		return true
	}
	return false
}

// target is where a Dial goes: the peer (this agent itself for its own
// node) and, for a pod, the pod IP (invalid for host services).
type target struct {
	peer discovery.Peer
	ip   netip.Addr
}

// parseDialAddr splits a Dial's "host:port". The host is an IP, a node
// name or another name (for the client to resolve); the port 1..65535.
func parseDialAddr(addr string) (host string, port uint32, err error) {
	h, n, err := frame.SplitAddr(addr)
	if err != nil {
		return "", 0, err
	}
	if h == "" {
		return "", 0, fmt.Errorf("address %q: no host", addr)
	}
	return h, uint32(n), nil
}

// route finds where a dial's host is served: an IP of one of this node's
// pods or of a pod a peer announced (waiting up to routeWait for the
// announcement), a node's address, or a node's name. A name that is no
// node's is errUnknownHost: the client resolves it and dials the IPs.
func (a *Agent) route(ctx context.Context, host string) (target, error) {
	self := discovery.Peer{NodeName: a.cfg.NodeName, Address: a.ctlAddr}
	ip, err := netip.ParseAddr(host)
	if err != nil {
		// Within the node, the agent is its own peer: its QPs loop back
		// on the device, as they would on a NIC, and the dial takes the
		// same control-plane path as any other.
		if host == a.cfg.NodeName {
			return target{peer: self}, nil
		}
		for _, p := range a.disc.Peers() {
			if p.NodeName == host {
				return target{peer: p}, nil
			}
		}
		return target{}, fmt.Errorf("%w %q: no IP, and no node of that name", errUnknownHost, host)
	}
	if ip.Zone() != "" {
		return target{}, fmt.Errorf("host %q: a vconn address has no zone: %w", host, verbs.ErrInvalid)
	}
	ip = ip.Unmap()
	if a.isNodeAddr(ip) {
		return target{peer: self}, nil
	}
	for _, p := range a.disc.Peers() {
		if ap, err := netip.ParseAddrPort(p.Address); err == nil && ap.Addr().Unmap() == ip {
			return target{peer: p}, nil
		}
	}
	ctx, cancel := context.WithTimeout(ctx, routeWait)
	defer cancel()
	for {
		t, err := a.routePod(ip)
		if err == nil || ctx.Err() != nil {
			return t, err
		}
		select {
		case <-ctx.Done():
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// routePod finds the node that serves pod IP ip: the API server's
// (routeByAPI) where the agent has it; else this one, or the one peer
// that announced it. Two nodes announcing one IP route it nowhere: a node
// cannot take another's pod IP by announcing it too.
func (a *Agent) routePod(ip netip.Addr) (target, error) {
	if a.opts.PodAddresses != nil {
		return a.routeByAPI(ip)
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.podOfIPLocked(ip) != "" {
		return target{peer: discovery.Peer{NodeName: a.cfg.NodeName, Address: a.ctlAddr}, ip: ip}, nil
	}
	var nodes []string
	for node, ips := range a.announced {
		if _, ok := ips[ip]; ok {
			nodes = append(nodes, node)
		}
	}
	switch len(nodes) {
	case 0:
		return target{}, fmt.Errorf("%w: no node serves pod IP %s (a Service's ClusterIP is no pod's: a vconn server's Service must be headless)", errUnreachable, ip)
	case 1:
		r := a.remotes[nodes[0]]
		if r == nil {
			return target{}, fmt.Errorf("%w: pod IP %s: its node %s left", errUnreachable, ip, nodes[0])
		}
		return target{peer: discovery.Peer{NodeName: r.node, Address: r.addr}, ip: ip}, nil
	}
	return target{}, fmt.Errorf("%w: pod IP %s is claimed by nodes %v", errUnreachable, ip, nodes)
}
