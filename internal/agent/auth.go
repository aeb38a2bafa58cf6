package agent

import (
	"context"
	"fmt"
	"net"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/status"

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

// claim is what a caller says about itself in a control RPC.
type claim struct {
	node    string    // "" when the call names no node
	address string    // control address host:port; "" when none
	gid     verbs.GID // zero when none
}

// authorize checks a caller's claims against its certificate: a peer may
// speak only for its own node, addresses and GIDs (RoCE v2 GIDs are IP
// addresses). Without TLS every claim passes.
func (a *Agent) authorize(ctx context.Context, c claim) error {
	if a.tls == nil {
		return nil
	}
	p, ok := peer.FromContext(ctx)
	if !ok {
		return status.Error(codes.Unauthenticated, "no peer")
	}
	id, isTLS, err := pki.PeerIdentity(p.AuthInfo)
	if err == nil && !isTLS {
		err = fmt.Errorf("call without TLS")
	}
	if err != nil {
		return status.Error(codes.Unauthenticated, err.Error())
	}
	if c.node != "" && c.node != id.Node {
		return status.Errorf(codes.PermissionDenied, "caller %s claims to be node %q", id.Node, c.node)
	}
	if c.address != "" {
		host, _, err := net.SplitHostPort(c.address)
		ip := net.ParseIP(host)
		if err != nil || ip == nil || !id.HasIP(ip) {
			return status.Errorf(codes.PermissionDenied, "caller %s claims control address %q, not one of its certificate's", id.Node, c.address)
		}
	}
	if c.gid != (verbs.GID{}) && !id.HasIP(net.IP(c.gid[:])) {
		return status.Errorf(codes.PermissionDenied, "caller %s claims GID %s, not one of its certificate's addresses", id.Node, net.IP(c.gid[:]))
	}
	return nil
}
