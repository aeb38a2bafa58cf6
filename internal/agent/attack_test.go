package agent_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"regexp"
	"runtime"
	"strconv"
	"sync"
	"sync/atomic"
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
	"github.com/rdmavisor/rdmavisor/internal/poll"
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

// impostor serves the control plane as a node with a valid certificate of
// its own (node-x) that answers as another node would: its Identity
// replies claim whatever as holds, and it counts the QPs it is asked for.
type impostor struct {
	controlpb.UnimplementedControlServer
	as  atomic.Pointer[controlpb.Node]
	qps atomic.Int64 // ConnectQP calls: QPs a victim routed here
}

// serveImpostor serves an impostor on ln with the certificate src.
func serveImpostor(t *testing.T, ln net.Listener, src *pki.Source) *impostor {
	t.Helper()
	m := &impostor{}
	srv := grpc.NewServer(grpc.Creds(src.Credentials()))
	controlpb.RegisterControlServer(srv, m)
	go func() { _ = srv.Serve(ln) }()
	t.Cleanup(srv.Stop)
	return m
}

func (m *impostor) Identity(context.Context, *controlpb.IdentityRequest) (*controlpb.IdentityReply, error) {
	return &controlpb.IdentityReply{Node: m.as.Load(), Qkey: 0x11111111, Mtu: 1024}, nil
}

func (m *impostor) ConnectQP(context.Context, *controlpb.QPRequest) (*controlpb.QPReply, error) {
	m.qps.Add(1)
	return &controlpb.QPReply{Qpn: 0x99, Psn: 1, Epoch: 77, Secret: 0x5ec, UdSecret: 0x5ec}, nil
}

// Heartbeat answers every beat as a freshly restarted agent whose side of
// the connection is new, which fails whatever peer the victim holds it for.
func (m *impostor) Heartbeat(stream grpc.BidiStreamingServer[controlpb.Beat, controlpb.Beat]) error {
	for inc := uint64(100); ; inc++ {
		b, err := stream.Recv()
		if err != nil {
			return nil
		}
		if err := stream.Send(&controlpb.Beat{Seq: b.Seq, Incarnation: inc, PeerEpoch: inc}); err != nil {
			return nil
		}
	}
}

// echoes checks that c echoes a message.
func echoes(t *testing.T, c net.Conn, msg string) {
	t.Helper()
	_ = c.SetDeadline(time.Now().Add(10 * time.Second))
	if _, err := c.Write([]byte(msg)); err != nil {
		t.Fatalf("echo %q: %v", msg, err)
	}
	got := make([]byte, len(msg))
	if _, err := io.ReadFull(c, got); err != nil || string(got) != msg {
		t.Fatalf("echo %q: got %q, %v", msg, got, err)
	}
}

// TestImpostorIdentity: node-x, with a valid certificate of its own, tries
// to make node-a route node-b's control link and QPs to itself by
// answering Identity with node-b's name and GID (or its own name with
// node-b's GID, or a zero GID): when a pod on node-a dials it, and when it
// dials node-a with a zero GID, which asked node-a to learn its GID by
// Identity. No QP is routed to the impostor (figure: 0 ConnectQP calls),
// and the vconns between node-a and node-b keep working, old and new.
func TestImpostorIdentity(t *testing.T) {
	const xIP = "127.0.0.9"
	xln, err := net.Listen("tcp", xIP+":0")
	if err != nil {
		t.Fatal(err)
	}
	defer xln.Close()
	cl := startCluster(t, agenttest.Options{TLS: true, TuneConfig: func(c *config.AgentConfig) {
		if c.NodeName == "node-a" { // node-a lists node-x as a peer, as discovery would
			c.PeerDiscovery.Static = append(c.PeerDiscovery.Static, config.Peer{NodeName: "node-x", Address: xln.Addr().String()})
		}
	}})
	a, b := cl.Nodes[0], cl.Nodes[1]
	ctx := ctxT(t)
	xSrc := certSource(t, cl.CA, "node-x", xIP)
	x := serveImpostor(t, xln, xSrc)

	// node-a and node-b talk.
	srv := appClient(t, b, "srv", 8)
	ln, err := srv.Listen(ctx, ":7")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	go agenttest.ServeEcho(ln)
	cli := appClient(t, a, "cli", 8)
	old, err := cli.Dial(ctx, "node-b:7")
	if err != nil {
		t.Fatal(err)
	}
	defer old.Close()
	echoes(t, old, "before")

	// A listener on node-a for node-x's dials.
	victim := appClient(t, a, "victim", 8)
	vln, err := victim.Listen(ctx, ":8")
	if err != nil {
		t.Fatal(err)
	}
	defer vln.Close()
	go agenttest.ServeDiscard(vln)
	xcl := hostile(t, a.Agent.ControlAddress(), xSrc.Credentials())

	bGID := mappedGID(b.IP)
	for i, as := range []*controlpb.Node{
		{Name: "node-b", ControlAddress: b.Agent.ControlAddress(), Gid: bGID, Incarnation: 1},
		{Name: "node-x", ControlAddress: xln.Addr().String(), Gid: bGID, Incarnation: 1},
		{Name: "node-x", ControlAddress: xln.Addr().String(), Gid: make([]byte, 16), Incarnation: 1},
		{Name: "", Gid: bGID},
	} {
		x.as.Store(as)
		// A pod on node-a dials node-x: node-a asks it who it is, and
		// finds node-x unreachable.
		if c, err := cli.Dial(ctx, "node-x:9"); !errors.Is(err, vconn.ErrUnreachable) {
			t.Errorf("dial node-x answering Identity as %+v: %v, want ErrUnreachable", as, err)
			if err == nil {
				_ = c.Close()
			}
		}
		// node-x dials node-a with a zero GID: node-a would ask it too.
		for _, caller := range []*controlpb.Node{
			{Name: "node-x", ControlAddress: xln.Addr().String(), Gid: make([]byte, 16), Incarnation: 1},
			{ControlAddress: xln.Addr().String(), Gid: make([]byte, 16)},
		} {
			cctx, cancel := context.WithTimeout(ctx, 5*time.Second)
			_, err := xcl.Dial(cctx, &controlpb.DialRequest{Caller: caller, Port: 8, Vconn: uint32(0x501 + i)})
			cancel()
			if err == nil {
				t.Errorf("node-x dialing node-a as %+v (answering Identity as %+v): accepted", caller, as)
			}
		}
	}
	// Long enough for a few of the impostor's beats, were node-a beating it.
	time.Sleep(time.Second)
	if n := x.qps.Load(); n != 0 {
		t.Errorf("%d QPs routed to the impostor, want 0", n)
	}
	echoes(t, old, "after")
	for i := range 4 { // new vconns, on new QPs of both indexes
		c, err := cli.Dial(ctx, "node-b:7")
		if err != nil {
			t.Fatalf("dial node-b after the impostor: %v", err)
		}
		echoes(t, c, fmt.Sprint("new ", i))
		_ = c.Close()
	}
	echoes(t, old, "last")
	if n := x.qps.Load(); n != 0 {
		t.Errorf("%d QPs routed to the impostor, want 0", n)
	}
}

// TestImpostorSharedAddress: node-x holds a valid certificate that names
// node-b's address too (a signer that certified an address twice), and
// serves its control plane there on another port. It dials node-a as
// itself with node-b's GID, which its certificate allows: node-a must not
// hand node-b's engine peer, and so its QPs, to node-x's connection
// (figure: 0 ConnectQP calls to the impostor), and the vconns between
// node-a and node-b keep working.
func TestImpostorSharedAddress(t *testing.T) {
	cl := startCluster(t, agenttest.Options{TLS: true})
	a, b := cl.Nodes[0], cl.Nodes[1]
	ctx := ctxT(t)
	xln, err := net.Listen("tcp", b.IP+":0")
	if err != nil {
		t.Fatal(err)
	}
	xSrc := certSource(t, cl.CA, "node-x", b.IP)
	x := serveImpostor(t, xln, xSrc)
	bGID := mappedGID(b.IP)
	x.as.Store(&controlpb.Node{Name: "node-x", ControlAddress: xln.Addr().String(), Gid: bGID, Incarnation: 1})

	srv := appClient(t, b, "srv", 8)
	ln, err := srv.Listen(ctx, ":7")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	go agenttest.ServeEcho(ln)
	cli := appClient(t, a, "cli", 8)
	old, err := cli.Dial(ctx, "node-b:7")
	if err != nil {
		t.Fatal(err)
	}
	defer old.Close()
	echoes(t, old, "before")

	victim := appClient(t, a, "victim", 8)
	vln, err := victim.Listen(ctx, ":8")
	if err != nil {
		t.Fatal(err)
	}
	defer vln.Close()
	go agenttest.ServeDiscard(vln)
	xcl := hostile(t, a.Agent.ControlAddress(), xSrc.Credentials())
	for i := range 4 {
		cctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		_, err := xcl.Dial(cctx, &controlpb.DialRequest{Caller: &controlpb.Node{Name: "node-x",
			ControlAddress: xln.Addr().String(), Gid: bGID, Incarnation: 1}, Port: 8, Vconn: uint32(0x501 + i)})
		cancel()
		if err == nil {
			t.Errorf("node-x dialing node-a with node-b's GID: accepted")
		}
	}
	time.Sleep(time.Second)
	for i := range 4 { // new vconns, on new QPs of both indexes
		c, err := cli.Dial(ctx, "node-b:7")
		if err != nil {
			t.Errorf("dial node-b after the impostor: %v", err)
			continue
		}
		_ = c.SetDeadline(time.Now().Add(10 * time.Second))
		msg := fmt.Sprint("new ", i)
		got := make([]byte, len(msg))
		if _, err := c.Write([]byte(msg)); err != nil {
			t.Errorf("echo %q: %v", msg, err)
		} else if _, err := io.ReadFull(c, got); err != nil || string(got) != msg {
			t.Errorf("echo %q: got %q, %v", msg, got, err)
		}
		_ = c.Close()
	}
	if n := x.qps.Load(); n != 0 {
		t.Errorf("%d QPs routed to the impostor, want 0", n)
	}
	echoes(t, old, "after")
}

// TestOnePeerOneRemote: a peer is a node, not an address:port. node-x,
// with a valid certificate, dials node-a claiming 32 control addresses of
// its IP with different ports; node-a keeps exactly one remote for it
// (figure: remotes added = 1, of 32 claims). Nothing of node-x answers at
// any of them, so every dial, let in, reaches the listener and fails where
// node-a's engine connects to node-x through that remote: Unavailable,
// every one at the same one of the claimed addresses.
func TestOnePeerOneRemote(t *testing.T) {
	cl := startCluster(t, agenttest.Options{TLS: true})
	a := cl.Nodes[0]
	ctx := ctxT(t)
	victim := appClient(t, a, "victim", 64)
	vln, err := victim.Listen(ctx, ":8")
	if err != nil {
		t.Fatal(err)
	}
	defer vln.Close()
	go agenttest.ServeDiscard(vln)
	xcl := hostile(t, a.Agent.ControlAddress(), certSource(t, cl.CA, "node-x", "127.0.0.9").Credentials())
	before := a.Agent.Remotes()
	const claims = 32
	errs := make([]error, claims)
	var wg sync.WaitGroup
	for i := range claims {
		wg.Go(func() {
			cctx, cancel := context.WithTimeout(ctx, 5*time.Second)
			defer cancel()
			_, errs[i] = xcl.Dial(cctx, &controlpb.DialRequest{Caller: &controlpb.Node{Name: "node-x",
				ControlAddress: fmt.Sprintf("127.0.0.9:%d", 20000+i), Gid: mappedGID("127.0.0.9"), Incarnation: 1},
				Port: 8, Vconn: uint32(0x501 + i)})
		})
	}
	wg.Wait()
	added := a.Agent.Remotes() - before
	t.Logf("%d claimed control addresses of node-x added %d remotes", claims, added)
	if added != 1 {
		t.Errorf("%d claimed control addresses of one node added %d remotes, want 1", claims, added)
	}
	reached := regexp.MustCompile(`^engine: connect QP to peer 127\.0\.0\.9: .*dial tcp 127\.0\.0\.9:(\d+): `)
	at := map[int]int{} // dials by the port node-a connected to
	for i, err := range errs {
		m := reached.FindStringSubmatch(status.Convert(err).Message())
		var port int
		if m != nil {
			port, _ = strconv.Atoi(m[1])
		}
		if status.Code(err) != codes.Unavailable || port < 20000 || port >= 20000+claims {
			t.Errorf("dial %d, claiming 127.0.0.9:%d: %v; want Unavailable, connecting to node-x at a claimed address", i, 20000+i, err)
			continue
		}
		at[port]++
	}
	if len(at) != 1 {
		t.Errorf("the dials reached node-x at %v; want all %d at one address", at, claims)
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
	poll.Until(t, 10*time.Second, "a session past the limit told so", func() bool {
		c, err := vconn.NewClient(ctx, vconn.Options{Socket: sock})
		if err == nil {
			_ = c.Close()
			t.Fatal("a session past limits.sessions was served")
		}
		return errors.Is(err, vconn.ErrLimit)
	})
}
