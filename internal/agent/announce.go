package agent

import (
	"context"
	"fmt"
	"net/netip"
	"slices"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/status"

	"github.com/rdmavisor/rdmavisor/internal/agent/controlpb"
	"github.com/rdmavisor/rdmavisor/internal/discovery"
)

// Peers learn which node serves a pod IP from that node's agent: each
// agent announces the IPs of the pods the CNI plugin registered with it
// to every peer agent, whole, whenever they change and whenever the peer
// restarted (its incarnation changed). An announcement replaces the
// node's last one. Announcing takes what the CNI plugin reported, so it
// holds with any IPAM, unlike a pod CIDR per node, which many CNIs do not
// use.

// maxAnnounced bounds the pod IPs one node may announce.
const maxAnnounced = 1 << 16

// announceInterval is how often an announcer checks, besides when kicked,
// whether its peer needs the list again (it restarted, or a call failed).
const announceInterval = time.Second

// announceSoon has every announcer send the pods' IPs now.
func (a *Agent) announceSoon() {
	a.mu.Lock()
	defer a.mu.Unlock()
	for _, r := range a.remotes {
		select {
		case r.kick <- struct{}{}:
		default:
		}
	}
}

// announcer keeps the remote's agent told this node's pod IPs.
func (r *remote) announcer(ctx context.Context) {
	defer close(r.annDone)
	t := time.NewTicker(announceInterval)
	defer t.Stop()
	for {
		r.a.mu.Lock()
		ips, ver := r.a.podIPsLocked()
		r.a.mu.Unlock()
		r.mu.Lock()
		need := !r.annOK || r.annVer != ver || r.incarnation != 0 && r.incarnation != r.annInc
		r.mu.Unlock()
		if need {
			if err := r.announce(ctx, ips, ver); err != nil && ctx.Err() == nil {
				r.a.log.V(1).Info("Cannot announce pod IPs to a peer agent; will retry", "peer", r.node, "error", err.Error())
			}
		}
		select {
		case <-ctx.Done():
			return
		case <-r.kick:
		case <-t.C:
		}
	}
}

func (r *remote) announce(ctx context.Context, ips []netip.Addr, ver uint64) error {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	req := &controlpb.Announcement{Caller: r.a.self(), PodIps: make([][]byte, 0, len(ips))}
	for _, ip := range ips {
		req.PodIps = append(req.PodIps, ip.AsSlice())
	}
	var from peer.Peer
	rep, err := r.cl.Announce(ctx, req, grpc.Peer(&from))
	if err != nil {
		return fmt.Errorf("announce: %w", err)
	}
	id, err := r.a.answerer(&from)
	if err == nil {
		err = nodeIs(id, r.node)
	}
	if err == nil && rep.GetIncarnation() == 0 {
		err = fmt.Errorf("%w: no incarnation", errBadReply)
	}
	if err != nil {
		return fmt.Errorf("announce: %w", err)
	}
	r.mu.Lock()
	r.annOK, r.annVer, r.annInc = true, ver, rep.GetIncarnation()
	r.mu.Unlock()
	return nil
}

// Announce records the pod IPs the caller's node serves.
func (s *controlServer) Announce(ctx context.Context, req *controlpb.Announcement) (*controlpb.AnnounceReply, error) {
	a := s.a
	c := req.GetCaller()
	if c == nil || c.Name == "" {
		return nil, status.Error(codes.InvalidArgument, "announce: caller is required")
	}
	cl, err := claimOf(c)
	if err != nil {
		return nil, err
	}
	if err := a.authorize(ctx, cl); err != nil {
		return nil, err
	}
	// Only the service's nodes announce: a certified node outside it
	// would otherwise become a peer here, and its silence later a
	// service NotReady (and its word a route, in standalone mode).
	if !a.member(c.Name) {
		return nil, status.Errorf(codes.PermissionDenied, "announce: node %s is not a node of this service (%s)", c.Name, a.membership())
	}
	ips, err := announcedIPs(req.GetPodIps())
	if err != nil {
		return nil, status.Errorf(codes.InvalidArgument, "announce: %v", err)
	}
	// A node announces through the remote it has here, as Dial, so the
	// peer table's bound holds announcers too.
	r, err := a.remoteFor(c.Name, c.ControlAddress, false)
	if err != nil {
		return nil, status.Error(codes.Unavailable, err.Error())
	}
	r.observe(c.Incarnation)
	a.mu.Lock()
	if a.remotes[r.node] == r {
		a.announced[r.node] = ips
	}
	a.mu.Unlock()
	return &controlpb.AnnounceReply{Incarnation: a.incarnation}, nil
}

// member: node is one of the service's nodes, as discovery lists them
// (the service's RDMANodes in Kubernetes mode, the configured peers
// otherwise).
func (a *Agent) member(node string) bool {
	return slices.ContainsFunc(a.disc.Peers(), func(p discovery.Peer) bool { return p.NodeName == node })
}

// membership names where the service's nodes come from, for errors.
func (a *Agent) membership() string {
	if a.opts.PodAddresses != nil {
		return "no RDMANode of the service lists it"
	}
	return "the agent's configured peers do not list it"
}

// announcedIPs parses an announcement's IPs: 4 or 16 bytes each, unicast,
// at most maxAnnounced.
func announcedIPs(raw [][]byte) (map[netip.Addr]struct{}, error) {
	if len(raw) > maxAnnounced {
		return nil, fmt.Errorf("%d pod IPs: at most %d", len(raw), maxAnnounced)
	}
	out := make(map[netip.Addr]struct{}, len(raw))
	for _, b := range raw {
		ip, ok := netip.AddrFromSlice(b)
		if !ok {
			return nil, fmt.Errorf("pod IP of %d bytes: want 4 or 16", len(b))
		}
		ip = ip.Unmap()
		if ip.IsUnspecified() || ip.IsMulticast() || ip.IsLoopback() {
			return nil, fmt.Errorf("pod IP %s: not a unicast address", ip)
		}
		out[ip] = struct{}{}
	}
	return out, nil
}

// portOf is the listener a Dial request names: a port of the pod with ip
// on this node, or of the node's host services when ip is empty or the
// node's own address.
func (a *Agent) portOf(raw []byte, port uint32) (portKey, error) {
	if len(raw) == 0 {
		return portKey{port: port}, nil
	}
	ip, ok := netip.AddrFromSlice(raw)
	if !ok {
		return portKey{}, status.Errorf(codes.InvalidArgument, "dial: IP of %d bytes", len(raw))
	}
	ip = ip.Unmap()
	if a.isNodeAddr(ip) {
		return portKey{port: port}, nil
	}
	a.mu.Lock()
	uid := a.podOfIPLocked(ip)
	a.mu.Unlock()
	if uid == "" {
		return portKey{}, status.Errorf(codes.NotFound, "no pod %s on %s", ip, a.cfg.NodeName)
	}
	return portKey{scope: uid, port: port}, nil
}

// placeOf names where a Dial went, for its error: the pod IP, or the node.
func placeOf(raw []byte, node string) string {
	if ip, ok := netip.AddrFromSlice(raw); ok {
		return ip.Unmap().String()
	}
	return node
}

// remoteOf is the address an accepted vconn's listener sees: the dialing
// pod's IP, or the dialing node's name for a host service, with port 0
// (a vconn has no source port).
func remoteOf(fromIP []byte, node string) string {
	if ip, ok := netip.AddrFromSlice(fromIP); ok {
		return netip.AddrPortFrom(ip.Unmap(), 0).String()
	}
	return node + ":0"
}
