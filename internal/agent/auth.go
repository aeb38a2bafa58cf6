package agent

import (
	"context"
	"errors"
	"fmt"
	"net"
	"slices"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/status"

	"github.com/rdmavisor/rdmavisor/internal/agent/controlpb"
	"github.com/rdmavisor/rdmavisor/internal/discovery"
	"github.com/rdmavisor/rdmavisor/internal/pki"
	"github.com/rdmavisor/rdmavisor/internal/verbs"
)

// controlCreds are the control plane's transport credentials: mutual TLS
// from the configured node certificate, or none.
func (a *Agent) controlCreds() (credentials.TransportCredentials, error) {
	t := a.cfg.TLS
	if !t.Enabled() {
		a.log.Info("Control plane without TLS: any host that reaches the control port can pose as a peer agent",
			"port", a.cfg.ControlPort)
		return insecure.NewCredentials(), nil
	}
	src, err := pki.NewSource(pki.Files{Cert: t.CertFile, Key: t.KeyFile, CA: t.CAFile})
	if err != nil {
		return nil, fmt.Errorf("agent: control plane TLS: %w", err)
	}
	if id := src.Identity(); id.Node != a.cfg.NodeName {
		return nil, fmt.Errorf("agent: control plane TLS: certificate %s is node %q's, this is %q", t.CertFile, id.Node, a.cfg.NodeName)
	}
	a.tls = src
	return src.Credentials(), nil
}

// claim is what a caller says about itself in a control RPC. Each field
// in of is claimed: it must be present and its certificate's.
type claim struct {
	node    string    // node name
	address string    // control address, host:port
	gid     verbs.GID // the device's GID
	rail    int       // the rail of gid (0: the node's first device)
	of      claimed
}

// claimed says which of a claim's fields an RPC relies on.
type claimed uint8

const (
	claimsNode claimed = 1 << iota
	claimsAddress
	claimsGID
	claimsAll = claimsNode | claimsAddress | claimsGID
)

// authorize checks a caller's claims against its certificate: a peer may
// speak only for its own node, addresses and GIDs (RoCE v2 GIDs are IP
// addresses). A claimed field left empty (a zero GID) is refused, not
// skipped: no agent has it, and an RPC that went on without it would act
// on what the caller says next (an Identity reply it chooses). Without TLS
// only that is checked.
func (a *Agent) authorize(ctx context.Context, c claim) error {
	switch {
	case c.of&claimsNode != 0 && c.node == "":
		return status.Error(codes.InvalidArgument, "caller names no node")
	case c.of&claimsAddress != 0 && c.address == "":
		return status.Error(codes.InvalidArgument, "caller names no control address")
	case c.of&claimsGID != 0 && c.gid == (verbs.GID{}):
		return status.Error(codes.InvalidArgument, "caller claims the zero GID")
	}
	id, err := a.caller(ctx)
	if err != nil || id == nil {
		return err
	}
	if c.of&claimsNode != 0 && c.node != id.Node {
		return status.Errorf(codes.PermissionDenied, "caller %s claims to be node %q", id.Node, c.node)
	}
	if c.of&claimsAddress != 0 {
		host, _, err := net.SplitHostPort(c.address)
		ip := net.ParseIP(host)
		if err != nil || ip == nil || !id.HasIP(ip) {
			return status.Errorf(codes.PermissionDenied, "caller %s claims control address %q, not one of its certificate's", id.Node, c.address)
		}
	}
	if c.of&claimsGID != 0 && !vouched(id, c.gid, c.rail, a.railGIDListed) {
		return status.Errorf(codes.PermissionDenied, "caller %s claims GID %s on rail %d, not one of its certificate's addresses nor its RDMANode's for that rail", id.Node, net.IP(c.gid[:]), c.rail)
	}
	return nil
}

// caller is the identity in a call's verified client certificate, nil
// without TLS.
func (a *Agent) caller(ctx context.Context) (*pki.Identity, error) {
	if a.tls == nil {
		return nil, nil
	}
	p, ok := peer.FromContext(ctx)
	if !ok {
		return nil, status.Error(codes.Unauthenticated, "no peer")
	}
	id, isTLS, err := pki.PeerIdentity(p.AuthInfo)
	if err == nil && !isTLS {
		err = errors.New("call without TLS")
	}
	if err != nil {
		return nil, status.Error(codes.Unauthenticated, err.Error())
	}
	return &id, nil
}

// errBadReply: a peer agent's answer is not one its node may give (a
// name, GID or certificate not its own) or not one an agent gives (out of
// range). The dial that met it fails as unreachable: the node it was
// for did not answer.
var errBadReply = errors.New("peer agent: bad reply")

// answerer is the identity in the certificate of the agent that answered
// a call (p, from grpc.Peer or a stream's context), nil without TLS.
func (a *Agent) answerer(p *peer.Peer) (*pki.Identity, error) {
	if a.tls == nil {
		return nil, nil
	}
	if p == nil {
		return nil, fmt.Errorf("%w: no peer", errBadReply)
	}
	id, isTLS, err := pki.PeerIdentity(p.AuthInfo)
	if err == nil && !isTLS {
		err = errors.New("answer without TLS")
	}
	if err != nil {
		return nil, fmt.Errorf("%w: %w", errBadReply, err)
	}
	return &id, nil
}

// nodeIs checks that the agent that answered, of certificate id (nil
// without TLS), is node's. The certificate already names the address
// dialed (pki.Source.ClientConfig); this binds the answer to the node
// it was asked of.
func nodeIs(id *pki.Identity, node string) error {
	if id != nil && id.Node != node {
		return fmt.Errorf("%w: node %s's agent answered for node %q", errBadReply, id.Node, node)
	}
	return nil
}

// vouchFor checks that the agent that answered, of certificate id (nil
// without TLS), is node's and may speak for the engine peer at gid on
// rail: a GID of its certificate's addresses (RoCE v2 GIDs are IP
// addresses) or, for rails 1.., one listed says is node's on that rail
// (its RDMANode: the signer certifies only a Node's addresses, and a
// second NIC's is rarely one), and never the zero GID, which is no one's.
func vouchFor(id *pki.Identity, node string, gid verbs.GID, rail int, listed railLister) error {
	if err := nodeIs(id, node); err != nil {
		return err
	}
	if gid == (verbs.GID{}) {
		return fmt.Errorf("%w: node %q: zero GID", errBadReply, node)
	}
	if id != nil && !vouched(id, gid, rail, listed) {
		return fmt.Errorf("%w: node %s: GID %s of rail %d is not one of its certificate's addresses, nor its RDMANode's for that rail", errBadReply, id.Node, net.IP(gid[:]), rail)
	}
	return nil
}

// railLister says whether discovery lists gid as node's GID on rail (1..)
// and as no other node's; nil lists nothing.
type railLister func(node string, rail int, gid verbs.GID) bool

// vouched: id's certificate names gid, or, on rails 1.., listed has it as
// id's node's on that rail.
func vouched(id *pki.Identity, gid verbs.GID, rail int, listed railLister) bool {
	return id.HasIP(net.IP(gid[:])) || rail > 0 && listed != nil && listed(id.Node, rail, gid)
}

// railGIDListed is the agent's railLister: the peers' RDMANodes (or the
// static peers' railGIDs), which only each node's own agent may write. A
// GID two nodes list is neither's.
func (a *Agent) railGIDListed(node string, rail int, gid verbs.GID) bool {
	ip, ok := net.IP(gid[:]), false
	for _, p := range a.disc.Peers() {
		for r, g := range p.RailGIDs {
			if !ip.Equal(net.ParseIP(g)) {
				continue
			}
			if p.NodeName != node || r+1 != rail {
				return false
			}
			ok = true
		}
	}
	return ok
}

// identityOf checks a peer agent's Identity reply, answered with the
// certificate id (nil without TLS) by the remote for node, and returns the
// peer's GID on rail: the reply must name node, and the GID be node's
// (vouchFor: under TLS a rail's address must be in the certificate, or
// listed for that rail).
func identityOf(rep *controlpb.IdentityReply, node string, id *pki.Identity, rail int, listed railLister) (verbs.GID, error) {
	n := rep.GetNode()
	if n.GetName() != node {
		return verbs.GID{}, fmt.Errorf("%w: node %q answered as %q", errBadReply, node, n.GetName())
	}
	b := n.GetGid()
	if rail > 0 {
		if rail > len(rep.GetRailGids()) {
			return verbs.GID{}, fmt.Errorf("%w: node %q has %d rail(s), not rail %d", errBadReply, node, len(rep.GetRailGids())+1, rail)
		}
		b = rep.GetRailGids()[rail-1]
	}
	var gid verbs.GID
	if len(b) != len(gid) {
		return verbs.GID{}, fmt.Errorf("%w: node %q: GID of %d bytes", errBadReply, node, len(b))
	}
	copy(gid[:], b)
	if err := vouchFor(id, node, gid, rail, listed); err != nil {
		return verbs.GID{}, err
	}
	return gid, nil
}

// bindGID binds an engine peer's GID to the node whose remote carries its
// control link, refusing a GID that is another node's: this agent's own,
// the address of a peer discovery lists, or one bound before to another
// node whose remote is kept. A certificate says which addresses a node may
// use; here only one node has each, even if two certificates name it (a
// signer that certified an address twice): otherwise the second node would
// take over the first's engine peer, its QPs and its heartbeat's verdicts.
func (a *Agent) bindGID(gid verbs.GID, node string) error {
	ip := net.IP(gid[:])
	owner := ""
	for _, e := range a.engines {
		if gid == e.GID() {
			owner = a.cfg.NodeName
		}
	}
	if owner == "" {
		owner = listedOwner(a.disc.Peers(), ip)
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	if n, ok := a.gids[gid]; owner == "" && ok && a.remotes[n] != nil {
		owner = n
	}
	if owner != "" && owner != node {
		return fmt.Errorf("%w: GID %s is node %s's, not %s's", errBadReply, ip, owner, node)
	}
	a.gids[gid] = node
	return nil
}

// listedOwner is the one peer whose listing (its RDMANode's address or
// rail GIDs, which each node's agent writes for itself) names ip; "" if
// none or several do. A listing is a node's word about itself: a node
// that lists another's address must not become its owner here, whatever
// the order of names (it took node-b's own GID from it, when the first
// node by name won), so a contested address is nobody's by listing, and
// the node that answers for it must be vouched for by its certificate
// (vouchFor) or have been bound before.
func listedOwner(peers []discovery.Peer, ip net.IP) string {
	owner := ""
	for _, p := range peers {
		h, _, err := net.SplitHostPort(p.Address)
		claims := err == nil && ip.Equal(net.ParseIP(h)) ||
			slices.ContainsFunc(p.RailGIDs, func(g string) bool { return ip.Equal(net.ParseIP(g)) })
		switch {
		case !claims || owner == p.NodeName:
		case owner == "":
			owner = p.NodeName
		default:
			return ""
		}
	}
	return owner
}
