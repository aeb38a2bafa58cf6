package agent_test

import (
	"context"
	"io"
	"net"
	"os"
	"path/filepath"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"

	"github.com/rdmavisor/rdmavisor/internal/agent/agenttest"
	"github.com/rdmavisor/rdmavisor/internal/agent/controlpb"
	"github.com/rdmavisor/rdmavisor/internal/pki"
)

// hostile is a program on the network that speaks the agents' control
// plane directly, with credentials of its choice.
func hostile(t *testing.T, target string, creds credentials.TransportCredentials) controlpb.ControlClient {
	t.Helper()
	conn, err := grpc.NewClient("passthrough:///"+target, grpc.WithTransportCredentials(creds))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = conn.Close() })
	return controlpb.NewControlClient(conn)
}

// certSource writes a certificate for node at ip, signed by ca, and
// returns it as a TLS source.
func certSource(t *testing.T, ca *pki.CA, node, ip string) *pki.Source {
	t.Helper()
	cert, key, err := ca.Issue(node, []net.IP{net.ParseIP(ip)}, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	f := pki.Files{Cert: filepath.Join(dir, "c"), Key: filepath.Join(dir, "k"), CA: filepath.Join(dir, "ca")}
	for p, b := range map[string][]byte{f.Cert: cert, f.Key: key, f.CA: ca.CertPEM} {
		if err := os.WriteFile(p, b, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	s, err := pki.NewSource(f)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func mappedGID(ip string) []byte { return net.ParseIP(ip).To16() }

// TestControlPlaneAuthenticated: with TLS, the agents still serve vconns
// to each other, and a hostile program is refused each way it tries to
// pose as a node or reach the control plane without a certificate.
func TestControlPlaneAuthenticated(t *testing.T) {
	cl := startCluster(t, agenttest.Options{TLS: true})
	a, b := cl.Nodes[0], cl.Nodes[1]
	ctx := ctxT(t)

	// Legitimate traffic across the authenticated control plane.
	srv := appClient(t, b, "srv", 4)
	ln, err := srv.Listen(ctx, ":7")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	go agenttest.ServeEcho(ln)
	c, err := appClient(t, a, "cli", 4).Dial(ctx, "node-b:7")
	if err != nil {
		t.Fatalf("dial over mutual TLS: %v", err)
	}
	msg := []byte("authenticated")
	if _, err := c.Write(msg); err != nil {
		t.Fatal(err)
	}
	got := make([]byte, len(msg))
	if _, err := io.ReadFull(c, got); err != nil || string(got) != string(msg) {
		t.Fatalf("echo %q, %v", got, err)
	}
	_ = c.Close()

	target := b.Agent.ControlAddress()
	aCtl := a.Agent.ControlAddress()
	aGID := mappedGID(a.IP)
	node := func(name, addr string, gid []byte) *controlpb.Node {
		return &controlpb.Node{Name: name, ControlAddress: addr, Gid: gid}
	}
	call := func(cl controlpb.ControlClient) map[string]error {
		ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		defer cancel()
		_, idErr := cl.Identity(ctx, &controlpb.IdentityRequest{})
		_, qpErr := cl.ConnectQP(ctx, &controlpb.QPRequest{Gid: aGID, Type: 2, Qpn: 77, Mtu: 3})
		_, dialErr := cl.Dial(ctx, &controlpb.DialRequest{Caller: node("node-a", aCtl, aGID), Port: 7, Vconn: 0x501})
		return map[string]error{"Identity": idErr, "ConnectQP as node-a": qpErr, "Dial as node-a": dialErr}
	}

	// No TLS at all: the handshake fails, nothing is served.
	for rpc, err := range call(hostile(t, target, insecure.NewCredentials())) {
		if status.Code(err) != codes.Unavailable {
			t.Errorf("plaintext %s: %v, want Unavailable (no handshake)", rpc, err)
		}
	}
	// A certificate from another CA: refused in the handshake.
	rogue, err := pki.NewCA("rogue", time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	for rpc, err := range call(hostile(t, target, certSource(t, rogue, "node-a", "127.0.0.2").Credentials())) {
		if status.Code(err) != codes.Unavailable {
			t.Errorf("rogue CA %s: %v, want Unavailable", rpc, err)
		}
	}
	// A genuine certificate of another node (node-x at 127.0.0.9) posing
	// as node-a: its own identity is fine, node-a's name, address and GID
	// are refused.
	x := hostile(t, target, certSource(t, cl.CA, "node-x", "127.0.0.9").Credentials())
	errs := call(x)
	if errs["Identity"] != nil {
		t.Errorf("Identity with a valid certificate: %v", errs["Identity"])
	}
	for _, rpc := range []string{"ConnectQP as node-a", "Dial as node-a"} {
		if status.Code(errs[rpc]) != codes.PermissionDenied {
			t.Errorf("node-x %s: %v, want PermissionDenied", rpc, errs[rpc])
		}
	}
	for name, n := range map[string]*controlpb.Node{
		"node-a's name":    node("node-a", "127.0.0.9:1", mappedGID("127.0.0.9")),
		"node-a's address": node("node-x", aCtl, mappedGID("127.0.0.9")),
		"node-a's GID":     node("node-x", "127.0.0.9:1", aGID),
	} {
		_, err := x.Dial(ctx, &controlpb.DialRequest{Caller: n, Port: 7, Vconn: 0x501})
		if status.Code(err) != codes.PermissionDenied {
			t.Errorf("node-x dialing with %s: %v, want PermissionDenied", name, err)
		}
	}
	// Claiming only what its certificate says gets past authorization:
	// nothing listens on port 8, so the answer is NotFound.
	_, err = x.Dial(ctx, &controlpb.DialRequest{Caller: node("node-x", "127.0.0.9:1", mappedGID("127.0.0.9")), Port: 8, Vconn: 0x501})
	if status.Code(err) != codes.NotFound {
		t.Errorf("node-x dialing as itself: %v, want NotFound", err)
	}
}
