package pki

import (
	"context"
	"fmt"
	"net"

	"google.golang.org/grpc/credentials"
)

// Credentials are gRPC transport credentials from s: mutual TLS, a fresh
// client configuration per connection (so rotation applies), the server
// verified against the host of the address dialed.
func (s *Source) Credentials() credentials.TransportCredentials {
	return &creds{s: s, server: credentials.NewTLS(s.ServerConfig())}
}

type creds struct {
	s      *Source
	server credentials.TransportCredentials
}

func (c *creds) ClientHandshake(ctx context.Context, authority string, conn net.Conn) (net.Conn, credentials.AuthInfo, error) {
	host, _, err := net.SplitHostPort(authority)
	if err != nil {
		host = authority
	}
	cc, info, err := credentials.NewTLS(c.s.ClientConfig(host)).ClientHandshake(ctx, authority, conn)
	if err != nil {
		return nil, nil, fmt.Errorf("pki: handshake with %s: %w", authority, err)
	}
	return cc, info, nil
}

func (c *creds) ServerHandshake(conn net.Conn) (net.Conn, credentials.AuthInfo, error) {
	return c.server.ServerHandshake(conn)
}

func (c *creds) Info() credentials.ProtocolInfo { return c.server.Info() }

func (c *creds) Clone() credentials.TransportCredentials {
	return &creds{s: c.s, server: c.server.Clone()}
}

func (c *creds) OverrideServerName(string) error { return nil } //nolint:staticcheck // required by the interface

// PeerIdentity is the identity in a gRPC call's verified client
// certificate; ok is false when the call came without TLS.
func PeerIdentity(ai credentials.AuthInfo) (id Identity, ok bool, err error) {
	ti, isTLS := ai.(credentials.TLSInfo)
	if !isTLS {
		return Identity{}, false, nil
	}
	if len(ti.State.VerifiedChains) == 0 || len(ti.State.PeerCertificates) == 0 {
		return Identity{}, true, fmt.Errorf("pki: caller presented no verified certificate")
	}
	id, err = IdentityOf(ti.State.PeerCertificates[0])
	return id, true, err
}
