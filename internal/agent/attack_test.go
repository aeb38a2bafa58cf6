package agent_test

import (
	"context"
	"errors"
	"io"
	"net"
	"os"
	"path/filepath"
	"runtime"
	"syscall"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"

	"github.com/rdmavisor/rdmavisor/internal/agent/agenttest"
	"github.com/rdmavisor/rdmavisor/internal/agent/controlpb"
	"github.com/rdmavisor/rdmavisor/internal/config"
	"github.com/rdmavisor/rdmavisor/internal/pki"
	"github.com/rdmavisor/rdmavisor/pkg/vconn"
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

// TestRefusedSessionsCostLittle: with limits.sessions at 1, 3,000
// connections to the allocation's socket that never say hello cost the
// agent almost nothing (figure: heap growth per refused connection under
// 4 KiB; goroutines grow by far fewer than the connections), the session
// that was let in keeps working, and once the flood ends a session past the
// limit is told so (ErrLimit).
func TestRefusedSessionsCostLittle(t *testing.T) {
	cl := startCluster(t, agenttest.Options{TuneConfig: func(c *config.AgentConfig) { c.Limits.Sessions = 1 }})
	a := cl.Nodes[0]
	ctx := ctxT(t)
	sock, err := a.Allocate(ctx, "flood", 4)
	if err != nil {
		t.Fatal(err)
	}
	first, err := vconn.NewClient(ctx, vconn.Options{Socket: sock})
	if err != nil {
		t.Fatal(err)
	}
	defer first.Close()

	const n = 3000
	fds := make([]int, 0, n)
	defer func() {
		for _, fd := range fds {
			_ = syscall.Close(fd)
		}
	}()
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	g0 := runtime.NumGoroutine()
	// Raw sockets: the test's side of the flood holds no Go memory.
	for range n {
		fd, err := syscall.Socket(syscall.AF_UNIX, syscall.SOCK_SEQPACKET|syscall.SOCK_CLOEXEC, 0)
		if err != nil {
			t.Fatal(err)
		}
		fds = append(fds, fd)
		if err := syscall.Connect(fd, &syscall.SockaddrUnix{Name: sock}); err != nil {
			t.Fatal(err)
		}
	}
	// The agent accepts in order: once a client after the flood has its
	// answer, every connection of the flood was accepted.
	if c, err := vconn.NewClient(ctx, vconn.Options{Socket: sock}); err == nil {
		_ = c.Close()
		t.Fatal("a session past limits.sessions was served")
	}
	runtime.GC()
	runtime.ReadMemStats(&after)
	g1 := runtime.NumGoroutine()
	heap := (int64(after.HeapAlloc) - int64(before.HeapAlloc)) / n
	inuse := (int64(after.HeapInuse) - int64(before.HeapInuse)) / n
	t.Logf("per refused connection: %d B of heap allocated, %d B of heap in use; goroutines %d -> %d for %d connections", heap, inuse, g0, g1, n)
	if heap > 4<<10 {
		t.Errorf("each refused connection holds %d B of the agent's heap, want < 4096", heap)
	}
	if g1-g0 > 64 {
		t.Errorf("goroutines grew by %d for %d refused connections, want at most 64", g1-g0, n)
	}
	if _, err := first.Listen(ctx, ":1"); err != nil {
		t.Errorf("the session let in, after the flood: %v", err)
	}
	for _, fd := range fds {
		_ = syscall.Close(fd)
	}
	fds = nil
	eventuallyT(t, "a session past the limit told so", func() bool {
		c, err := vconn.NewClient(ctx, vconn.Options{Socket: sock})
		if err == nil {
			_ = c.Close()
			t.Fatal("a session past limits.sessions was served")
		}
		return errors.Is(err, vconn.ErrLimit)
	})
}
