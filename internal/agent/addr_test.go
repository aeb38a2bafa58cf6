package agent_test

import (
	"context"
	"errors"
	"io"
	"net"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/rdmavisor/rdmavisor/internal/admin"
	"github.com/rdmavisor/rdmavisor/internal/agent/agenttest"
	"github.com/rdmavisor/rdmavisor/internal/agent/controlpb"
	"github.com/rdmavisor/rdmavisor/pkg/vconn"
)

func podClient(t *testing.T, ctx context.Context, n *agenttest.Node, ns, name, ip string, k int) *vconn.Client {
	t.Helper()
	c, err := n.PodClient(ctx, admin.Pod{UID: "uid-" + name, Namespace: ns, Name: name, IPs: []string{ip}}, "alloc-"+name, k)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() })
	return c
}

// sink accepts every vconn of ln and counts what arrives on them.
type sink struct {
	accepted, bytes atomic.Int64
	wg              sync.WaitGroup
}

func drain(ln *vconn.Listener) *sink {
	s := &sink{}
	s.wg.Add(1)
	go func() {
		defer s.wg.Done()
		for {
			c, err := ln.AcceptVConn()
			if err != nil {
				return
			}
			s.accepted.Add(1)
			s.wg.Add(1)
			go func() {
				defer s.wg.Done()
				defer c.Close()
				n, _ := io.Copy(io.Discard, c)
				s.bytes.Add(n)
			}()
		}
	}()
	return s
}

// TestPortHijackAcrossTenants is issue 23's item 1: a tenant's pod Listens
// on the port another tenant's service uses, while the service runs and
// while it restarts. Each pod has its own port space: the attacker's
// Listen succeeds without learning that the port is taken elsewhere, and
// receives 0 bytes of what the service's clients send, 0 vconns.
func TestPortHijackAcrossTenants(t *testing.T) {
	cl := startCluster(t, agenttest.Options{})
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	nodeA, nodeB := cl.Nodes[0], cl.Nodes[1]
	victim := podClient(t, ctx, nodeB, "tenant-a", "echo", "10.244.1.10", 8)
	attacker := podClient(t, ctx, nodeB, "tenant-b", "evil", "10.244.1.11", 8)
	client := podClient(t, ctx, nodeA, "tenant-a", "client", "10.244.0.10", 8)

	vl, err := victim.Listen(ctx, ":7000")
	if err != nil {
		t.Fatal(err)
	}
	if got := vl.Addr().String(); got != "10.244.1.10:7000" {
		t.Errorf("victim listens at %s, want 10.244.1.10:7000", got)
	}
	go agenttest.ServeEcho(vl)
	// The port is the attacker's own: no ErrAddrInUse, which would tell
	// it the port is taken by another pod.
	al, err := attacker.Listen(ctx, ":7000")
	if err != nil {
		t.Fatalf("attacker's listen on its own port 7000: %v", err)
	}
	if got := al.Addr().String(); got != "10.244.1.11:7000" {
		t.Errorf("attacker listens at %s, want 10.244.1.11:7000", got)
	}
	stolen := drain(al)
	// Nor on the node's host services' port space.
	if _, err := client.Dial(ctx, nodeB.Name+":7000"); !errors.Is(err, vconn.ErrRefused) {
		t.Errorf("dial %s:7000 (host services; only pods listen): %v, want ErrRefused", nodeB.Name, err)
	}

	const msgs, size = 20, 1024
	sent := 0
	exchange := func() {
		c, err := client.Dial(ctx, "10.244.1.10:7000")
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		buf := make([]byte, size)
		for i := range msgs {
			for j := range buf {
				buf[j] = byte(i + j)
			}
			if _, err := c.Write(buf); err != nil {
				t.Fatal(err)
			}
			sent += size
			got := make([]byte, size)
			if _, err := io.ReadFull(c, got); err != nil {
				t.Fatal(err)
			}
			if string(got) != string(buf) {
				t.Fatalf("message %d: echo differs", i)
			}
		}
	}
	exchange()

	// The service restarts: while its port is free, the attacker still
	// listens only on its own; the clients' dials are refused, not
	// answered by the attacker.
	if err := vl.Close(); err != nil {
		t.Fatal(err)
	}
	if c, err := client.Dial(ctx, "10.244.1.10:7000"); !errors.Is(err, vconn.ErrRefused) {
		if c != nil {
			_ = c.Close()
		}
		t.Fatalf("dial the restarting service: %v, want ErrRefused", err)
	}
	again, err := attacker.Listen(ctx, ":7001")
	if err != nil {
		t.Fatal(err)
	}
	_ = again.Close()
	if vl, err = victim.Listen(ctx, ":7000"); err != nil {
		t.Fatalf("the service takes its port back: %v", err)
	}
	go agenttest.ServeEcho(vl)
	exchange()
	defer vl.Close()

	// The attacker's listener is reachable at its own address only.
	c, err := client.Dial(ctx, "10.244.1.11:7000")
	if err != nil {
		t.Fatalf("dial the attacker's own address: %v", err)
	}
	_ = c.Close()
	deadline := time.Now().Add(5 * time.Second)
	for stolen.accepted.Load() < 1 && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	_ = al.Close()
	if n := stolen.accepted.Load(); n != 1 {
		t.Errorf("the attacker accepted %d vconns, want 1 (the one dialled to its own address)", n)
	}
	if n := stolen.bytes.Load(); n != 0 {
		t.Errorf("the attacker received %d bytes of the %d the service's clients sent, want 0", n, sent)
	}
	t.Logf("service's clients sent %d bytes; attacker received %d bytes", sent, stolen.bytes.Load())
}

// TestAddrInUseWithinPod: a pod's second listener on a port is refused,
// and the error names only the pod's own address.
func TestAddrInUseWithinPod(t *testing.T) {
	cl := startCluster(t, agenttest.Options{})
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	p := podClient(t, ctx, cl.Nodes[1], "ns", "srv", "10.244.1.20", 4)
	other := podClient(t, ctx, cl.Nodes[1], "ns2", "srv2", "10.244.1.21", 4)
	if _, err := other.Listen(ctx, ":9"); err != nil {
		t.Fatal(err)
	}
	ln, err := p.Listen(ctx, ":9")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	_, err = p.Listen(ctx, ":9")
	var ve *vconn.Error
	if !errors.As(err, &ve) || ve.Code != vconn.CodeAddrInUse {
		t.Fatalf("second listen on :9 in one pod: %v, want ErrAddrInUse", err)
	}
	if want := "listen: 10.244.1.20:9 already has a listener"; ve.Message != want {
		t.Errorf("message %q, want %q", ve.Message, want)
	}
	// A host other than the pod's own is refused with a clear error.
	if _, err := p.Listen(ctx, "10.244.1.21:10"); !errors.Is(err, &vconn.Error{Code: vconn.CodeBadRequest}) {
		t.Errorf("listen at another pod's IP: %v, want CodeBadRequest", err)
	}
	if l, err := p.Listen(ctx, "0.0.0.0:11"); err != nil || l.Addr().String() != "10.244.1.20:11" {
		t.Errorf("listen at 0.0.0.0:11: %v, %v; want 10.244.1.20:11", l, err)
	}
}

// TestPodAddresses: dials by pod IP reach the pod of that IP on either
// node (this one's, or one a peer announced), and the listener sees the
// dialing pod's IP; malformed addresses get a clear error; an IP no node
// announced is unreachable.
func TestPodAddresses(t *testing.T) {
	cl := startCluster(t, agenttest.Options{})
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	a := podClient(t, ctx, cl.Nodes[0], "ns", "a", "10.244.0.5", 8)
	b := podClient(t, ctx, cl.Nodes[1], "ns", "b", "fd00::b", 8)
	for _, tc := range []struct {
		from, to *vconn.Client
		addr     string
		remote   string
	}{
		{a, b, "[fd00::b]:80", "10.244.0.5:0"}, // across nodes
		{b, a, "10.244.0.5:80", "[fd00::b]:0"},
		{a, a, "10.244.0.5:81", "10.244.0.5:0"}, // a pod dials itself
	} {
		t.Run(tc.addr, func(t *testing.T) {
			_, port, _ := net.SplitHostPort(tc.addr)
			ln, err := tc.to.Listen(ctx, ":"+port)
			if err != nil {
				t.Fatal(err)
			}
			defer ln.Close()
			c, err := tc.from.Dial(ctx, tc.addr)
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			s, err := ln.AcceptVConn()
			if err != nil {
				t.Fatal(err)
			}
			defer s.Close()
			if got := s.RemoteAddr().String(); got != tc.remote {
				t.Errorf("accepted from %s, want %s", got, tc.remote)
			}
			if err := c.SendMsg(ctx, []byte("hi")); err != nil {
				t.Fatal(err)
			}
			if m, err := s.RecvMsg(ctx); err != nil || string(m.Data) != "hi" {
				t.Fatalf("received %q, %v", m.Data, err)
			}
		})
	}
	for _, addr := range []string{"10.244.0.5", "10.244.0.5:0", "10.244.0.5:65536", ":80", "[fe80::1%eth0]:80", "a:b:c"} {
		if _, err := a.Dial(ctx, addr); !errors.Is(err, &vconn.Error{Code: vconn.CodeBadRequest}) {
			t.Errorf("dial %q: %v, want CodeBadRequest", addr, err)
		}
	}
	start := time.Now()
	if _, err := a.Dial(ctx, "10.244.9.9:80"); !errors.Is(err, vconn.ErrUnreachable) {
		t.Errorf("dial a pod IP no node announced: %v, want ErrUnreachable", err)
	}
	t.Logf("an unannounced pod IP is unreachable after %v", time.Since(start).Round(time.Millisecond))
}

// TestPodNotKnownYet: a pod's allocation listens only as its pod; until
// the device plugin names the pod and the CNI plugin registers its IP,
// Listen waits, and then fails with ErrNoAddress.
func TestPodNotKnownYet(t *testing.T) {
	cl := startCluster(t, agenttest.Options{})
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	n := cl.Nodes[1]
	al, err := n.Agent.CreatePodAllocation("late", 2)
	if err != nil {
		t.Fatal(err)
	}
	c, err := vconn.NewClient(ctx, vconn.Options{Socket: al.Socket, Resolver: cl.Hosts})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	// Bound and registered while the Listen waits: it succeeds.
	go func() {
		time.Sleep(300 * time.Millisecond)
		_ = n.Agent.BindAllocation("late", "ns", "late")
		time.Sleep(300 * time.Millisecond)
		_ = n.Agent.RegisterPod(admin.Pod{UID: "uid-late", Namespace: "ns", Name: "late", IPs: []string{"10.244.1.30"}})
	}()
	ln, err := c.Listen(ctx, ":5")
	if err != nil || ln.Addr().String() != "10.244.1.30:5" {
		t.Fatalf("listen while the pod becomes known: %v, %v; want 10.244.1.30:5", ln, err)
	}
	_ = ln.Close()
	// Never bound: ErrNoAddress, never the node's port space.
	al2, err := n.Agent.CreatePodAllocation("unbound", 2)
	if err != nil {
		t.Fatal(err)
	}
	c2, err := vconn.NewClient(ctx, vconn.Options{Socket: al2.Socket, Resolver: cl.Hosts})
	if err != nil {
		t.Fatal(err)
	}
	defer c2.Close()
	if _, err := c2.Listen(ctx, ":5"); !errors.Is(err, vconn.ErrNoAddress) {
		t.Fatalf("listen of an allocation whose pod is unknown: %v, want ErrNoAddress", err)
	}
	if _, err := c2.Dial(ctx, "10.244.1.30:5"); !errors.Is(err, vconn.ErrNoAddress) {
		t.Fatalf("dial of an allocation whose pod is unknown: %v, want ErrNoAddress", err)
	}
	if err := n.Agent.BindAllocation("unbound", "", "x"); err == nil {
		t.Error("bind to a pod without namespace: no error")
	}
	if err := n.Agent.BindAllocation("nosuch", "ns", "x"); !errors.Is(err, admin.ErrNotFound) {
		t.Errorf("bind a missing allocation: %v, want ErrNotFound", err)
	}
	host, err := n.Agent.CreateAllocation("host", 1)
	if err != nil {
		t.Fatal(err)
	}
	if err := n.Agent.BindAllocation(host.ID, "ns", "x"); err == nil {
		t.Error("bind a host allocation to a pod: no error")
	}
}

// TestPodsSurviveAgentRestart: the pods the CNI plugin registered are kept
// across an agent restart (their ADD does not come again), so a pod's
// allocation, re-created by the device plugin, listens as its pod again,
// and the peers learn again where its IP is. Of two registered pods with
// one IP, the later has it: the other is gone (its DEL missed).
func TestPodsSurviveAgentRestart(t *testing.T) {
	cl := startCluster(t, agenttest.Options{})
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	nodeA, nodeB := cl.Nodes[0], cl.Nodes[1]
	srv := podClient(t, ctx, nodeB, "ns", "srv", "10.244.1.40", 4)
	cli := podClient(t, ctx, nodeA, "ns", "cli", "10.244.0.40", 4)
	if err := nodeB.Agent.RegisterPod(admin.Pod{UID: "uid-stale", Namespace: "ns", Name: "stale", IPs: []string{"10.244.1.41"}}); err != nil {
		t.Fatal(err)
	}
	if err := nodeB.Agent.RegisterPod(admin.Pod{UID: "uid-new", Namespace: "ns", Name: "new", IPs: []string{"10.244.1.41"}}); err != nil {
		t.Fatal(err)
	}
	if err := nodeB.Restart(); err != nil {
		t.Fatal(err)
	}
	pods := map[string]bool{}
	for _, p := range nodeB.Agent.Pods() {
		pods[p.Name] = true
	}
	if !pods["srv"] || !pods["new"] || !pods["stale"] || len(pods) != 3 {
		t.Fatalf("pods after the restart %v, want srv, stale and new", pods)
	}
	// The device plugin re-creates the allocation the agent lost.
	if _, err := nodeB.Agent.CreatePodAllocation("alloc-srv", 4); err != nil {
		t.Fatal(err)
	}
	if err := nodeB.Agent.BindAllocation("alloc-srv", "ns", "srv"); err != nil {
		t.Fatal(err)
	}
	var ln *vconn.Listener
	var err error
	for i := 0; i < 50; i++ { // the client's session to the old agent is gone: the next call reconnects
		if ln, err = srv.Listen(ctx, ":7"); err == nil {
			break
		}
		time.Sleep(50 * time.Millisecond)
	}
	if err != nil || ln.Addr().String() != "10.244.1.40:7" {
		t.Fatalf("listen after the restart: %v, %v; want 10.244.1.40:7", ln, err)
	}
	defer ln.Close()
	go agenttest.ServeEcho(ln)
	var c *vconn.Conn
	for i := 0; i < 100; i++ { // node-a sees node-b's new incarnation and its announcement
		if c, err = cli.Dial(ctx, "10.244.1.40:7"); err == nil {
			break
		}
		time.Sleep(50 * time.Millisecond)
	}
	if err != nil {
		t.Fatalf("dial the pod after its agent restarted: %v", err)
	}
	defer c.Close()
	if err := c.SendMsg(ctx, []byte("again")); err != nil {
		t.Fatal(err)
	}
	if m, err := c.RecvMsg(ctx); err != nil || string(m.Data) != "again" {
		t.Fatalf("echo %q, %v", m.Data, err)
	}
	// The IP "stale" and "new" both registered is the later's: every dial
	// to it reaches new's listener.
	if _, err := nodeB.Agent.CreatePodAllocation("alloc-new", 16); err != nil {
		t.Fatal(err)
	}
	if err := nodeB.Agent.BindAllocation("alloc-new", "ns", "new"); err != nil {
		t.Fatal(err)
	}
	nc, err := vconn.NewClient(ctx, vconn.Options{Socket: allocSocket(t, nodeB, "alloc-new")})
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	nl, err := nc.Listen(ctx, ":8")
	if err != nil || nl.Addr().String() != "10.244.1.41:8" {
		t.Fatalf("new's listen: %v, %v; want 10.244.1.41:8", nl, err)
	}
	defer nl.Close()
	got := drain(nl)
	const dials = 3 // cli's quota of 4 less the vconn it holds
	var held []*vconn.Conn
	defer func() {
		for _, c := range held {
			_ = c.Close()
		}
	}()
	for i := range dials {
		c, err := cli.Dial(ctx, "10.244.1.41:8")
		if err != nil {
			t.Fatalf("dial %d of the IP two pods registered: %v", i, err)
		}
		held = append(held, c)
	}
	deadline := time.Now().Add(5 * time.Second)
	for got.accepted.Load() < dials && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	if n := got.accepted.Load(); n != dials {
		t.Errorf("new's listener accepted %d of %d dials to its IP", n, dials)
	}
}

func allocSocket(t *testing.T, n *agenttest.Node, id string) string {
	t.Helper()
	for _, al := range n.Agent.Allocations() {
		if al.ID == id {
			return al.Socket
		}
	}
	t.Fatalf("no allocation %s on %s", id, n.Name)
	return ""
}

// thief is a node with a valid certificate of its own (node-x) that
// announces other nodes' pod IPs; it counts the dials routed to it (each
// begins with Identity, or reaches Dial).
type thief struct {
	controlpb.UnimplementedControlServer
	contacts atomic.Int64
}

func (m *thief) Identity(context.Context, *controlpb.IdentityRequest) (*controlpb.IdentityReply, error) {
	m.contacts.Add(1)
	return nil, status.Error(codes.Unavailable, "thief")
}

func (m *thief) Dial(context.Context, *controlpb.DialRequest) (*controlpb.DialReply, error) {
	m.contacts.Add(1)
	return nil, status.Error(codes.Unavailable, "thief")
}

// plainCluster is a standalone TLS cluster and node-x, a node outside
// it with a valid certificate, as apiCluster makes one.
func plainCluster(t *testing.T) (*agenttest.Cluster, *thief, controlpb.ControlClient, *controlpb.Node) {
	t.Helper()
	const xIP = "127.0.0.9"
	cl := startCluster(t, agenttest.Options{TLS: true})
	xSrc := certSource(t, cl.CA, "node-x", xIP)
	h := hostile(t, cl.Nodes[0].Agent.ControlAddress(), xSrc.Credentials())
	me := &controlpb.Node{Name: "node-x", ControlAddress: xIP + ":1", Gid: mappedGID(xIP), Incarnation: 1}
	return cl, &thief{}, h, me
}

// TestAnnounceCannotTakePodIP: on raw gRPC, a node of the service
// (compromised: a valid certificate, a configured peer) announces a pod
// IP another node serves. Dials to that IP are
// then refused as contested (ErrUnreachable), never routed to the
// announcer: 0 dials reach it. An announcement under another node's name
// is refused (PermissionDenied). What remains (SECURITY): an IP no other
// node announced goes to whoever claims it.
func TestAnnounceCannotTakePodIP(t *testing.T) {
	const xIP = "127.0.0.9"
	xln, err := net.Listen("tcp", xIP+":0")
	if err != nil {
		t.Fatal(err)
	}
	defer xln.Close()
	cl := startCluster(t, agenttest.Options{TLS: true, TuneConfig: withPeer("node-x", xln.Addr().String())})
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	nodeA, nodeB := cl.Nodes[0], cl.Nodes[1]
	xSrc := certSource(t, cl.CA, "node-x", xIP)
	x := &thief{}
	srv := grpc.NewServer(grpc.Creds(xSrc.Credentials()))
	controlpb.RegisterControlServer(srv, x)
	go func() { _ = srv.Serve(xln) }()
	defer srv.Stop()

	victim := podClient(t, ctx, nodeB, "tenant-a", "echo", "10.244.1.10", 4)
	cli := podClient(t, ctx, nodeA, "tenant-a", "cli", "10.244.0.10", 4)
	ln, err := victim.Listen(ctx, ":7000")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	go agenttest.ServeEcho(ln)
	c, err := cli.Dial(ctx, "10.244.1.10:7000")
	if err != nil {
		t.Fatal(err)
	}
	echoes(t, c, "before")
	_ = c.Close()

	h := hostile(t, nodeA.Agent.ControlAddress(), xSrc.Credentials())
	me := &controlpb.Node{Name: "node-x", ControlAddress: xln.Addr().String(), Gid: mappedGID(xIP), Incarnation: 1}
	stolen := [][]byte{{10, 244, 1, 10}, {10, 244, 7, 7}}
	if _, err := h.Announce(ctx, &controlpb.Announcement{Caller: me, PodIps: stolen}); err != nil {
		t.Fatalf("node-x's announcement: %v", err)
	}
	asB := &controlpb.Node{Name: "node-b", ControlAddress: xln.Addr().String(), Gid: mappedGID(xIP), Incarnation: 1}
	if _, err := h.Announce(ctx, &controlpb.Announcement{Caller: asB, PodIps: stolen}); status.Code(err) != codes.PermissionDenied {
		t.Errorf("node-x announcing as node-b: %v, want PermissionDenied", err)
	}
	if _, err := cli.Dial(ctx, "10.244.1.10:7000"); !errors.Is(err, vconn.ErrUnreachable) {
		t.Errorf("dial a pod IP two nodes announced: %v, want ErrUnreachable", err)
	}
	if n := x.contacts.Load(); n != 0 {
		t.Errorf("%d dials of the victim's pod IP routed to the node that claimed it, want 0", n)
	}
	// An IP only node-x claims is node-x's to answer: the limit of
	// announcements (SECURITY.md, "Pod IPs are what the agents say").
	_, _ = cli.Dial(ctx, "10.244.7.7:7000")
	if n := x.contacts.Load(); n == 0 {
		t.Errorf("a dial of an IP only node-x announced did not reach node-x")
	}
}
