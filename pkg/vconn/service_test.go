package vconn_test

import (
	"context"
	"errors"
	"net"
	"net/netip"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	"golang.org/x/net/dns/dnsmessage"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	"github.com/rdmavisor/rdmavisor/internal/admin"
	"github.com/rdmavisor/rdmavisor/internal/agent/agenttest"
	"github.com/rdmavisor/rdmavisor/pkg/vconn"
)

// fakeDNS is a cluster DNS on loopback: A records for the names it holds
// (a headless Service's pods), no AAAA, NXDOMAIN for other names.
type fakeDNS struct {
	pc      net.PacketConn
	records map[string][]netip.Addr // by FQDN, "echo.default.svc."
}

func startDNS(t *testing.T, records map[string][]netip.Addr) *fakeDNS {
	t.Helper()
	pc, err := net.ListenPacket("udp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	d := &fakeDNS{pc: pc, records: records}
	done := make(chan struct{})
	go func() {
		defer close(done)
		d.serve()
	}()
	t.Cleanup(func() { _ = pc.Close(); <-done })
	return d
}

func (d *fakeDNS) addr() string { return d.pc.LocalAddr().String() }

// resolver is a net.Resolver that asks only this server.
func (d *fakeDNS) resolver() *net.Resolver {
	return &net.Resolver{PreferGo: true, Dial: func(ctx context.Context, _, _ string) (net.Conn, error) {
		var nd net.Dialer
		return nd.DialContext(ctx, "udp", d.addr())
	}}
}

func (d *fakeDNS) serve() {
	buf := make([]byte, 1500)
	for {
		n, from, err := d.pc.ReadFrom(buf)
		if err != nil {
			return
		}
		if rep, err := d.answer(buf[:n]); err == nil {
			_, _ = d.pc.WriteTo(rep, from)
		}
	}
}

func (d *fakeDNS) answer(query []byte) ([]byte, error) {
	var p dnsmessage.Parser
	h, err := p.Start(query)
	if err != nil {
		return nil, err
	}
	q, err := p.Question()
	if err != nil {
		return nil, err
	}
	ips, known := d.records[strings.ToLower(q.Name.String())]
	rcode := dnsmessage.RCodeSuccess
	if !known {
		rcode = dnsmessage.RCodeNameError
	}
	b := dnsmessage.NewBuilder(nil, dnsmessage.Header{ID: h.ID, Response: true, Authoritative: true, RecursionDesired: h.RecursionDesired, RCode: rcode})
	if err := b.StartQuestions(); err != nil {
		return nil, err
	}
	if err := b.Question(q); err != nil {
		return nil, err
	}
	if err := b.StartAnswers(); err != nil {
		return nil, err
	}
	if q.Type == dnsmessage.TypeA {
		for _, ip := range ips {
			rh := dnsmessage.ResourceHeader{Name: q.Name, Type: dnsmessage.TypeA, Class: dnsmessage.ClassINET, TTL: 5}
			if err := b.AResource(rh, dnsmessage.AResource{A: ip.As4()}); err != nil {
				return nil, err
			}
		}
	}
	return b.Finish()
}

// countingListener counts the vconns its server accepted.
type countingListener struct {
	net.Listener
	n *atomic.Int64
}

func (l countingListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err == nil {
		l.n.Add(1)
	}
	return c, err
}

// TestServiceName: a client pod reaches a headless Service's pods by the
// Service's name with no discovery system of ours, as Kubernetes clients
// do over TCP: gRPC's own dns resolver (grpc.NewClient("dns:///...")),
// asking the cluster's DNS (here a fake on loopback), gives the pods' IPs
// to a vconn dialer, and round_robin spreads the calls over both pods,
// one on each node; and pkg/vconn resolves the name itself for a dialer
// given it whole (passthrough).
func TestServiceName(t *testing.T) {
	cl := cluster(t, agenttest.Options{})
	ctx := testCtx(t)
	pod := func(n *agenttest.Node, name, ip string) *vconn.Client {
		c, err := n.PodClient(ctx, admin.Pod{UID: "uid-" + name, Namespace: "default", Name: name, IPs: []string{ip}}, name, 8)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = c.Close() })
		return c
	}
	servers := []struct {
		node *agenttest.Node
		name string
		ip   netip.Addr
	}{{cl.Nodes[1], "echo-0", netip.MustParseAddr("10.244.1.7")}, {cl.Nodes[0], "echo-1", netip.MustParseAddr("10.244.0.7")}}
	dns := startDNS(t, map[string][]netip.Addr{"echo.default.svc.": {servers[0].ip, servers[1].ip}})
	accepted := make([]atomic.Int64, len(servers))
	for i, s := range servers {
		c := pod(s.node, s.name, s.ip.String())
		ln, err := c.Listen(ctx, ":7000")
		if err != nil {
			t.Fatal(err)
		}
		if got, want := ln.Addr().String(), s.ip.String()+":7000"; got != want {
			t.Errorf("%s listens at %s, want %s", s.name, got, want)
		}
		srv := grpc.NewServer()
		healthpb.RegisterHealthServer(srv, health.NewServer())
		done := make(chan struct{})
		go func() { defer close(done); _ = srv.Serve(countingListener{ln, &accepted[i]}) }()
		t.Cleanup(func() { srv.Stop(); <-done })
	}
	cli := pod(cl.Nodes[0], "cli", "10.244.0.9")
	cl.Hosts.Set("echo.default.svc", servers[0].ip)
	var dialed sync.Map // the addresses gRPC had the vconn dialer dial
	dialer := grpc.WithContextDialer(func(ctx context.Context, addr string) (net.Conn, error) {
		dialed.Store(addr, true)
		return cli.Dial(ctx, addr)
	})
	for _, tc := range []struct {
		name, target string
		opts         []grpc.DialOption
		minEach      int64 // vconns each server pod accepts at least
	}{
		{"grpc dns resolver, round_robin", "dns://" + dns.addr() + "/echo.default.svc:7000",
			[]grpc.DialOption{grpc.WithDefaultServiceConfig(`{"loadBalancingConfig":[{"round_robin":{}}]}`)}, 1},
		{"vconn resolves the name", "passthrough:///echo.default.svc:7000", nil, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			conn, err := grpc.NewClient(tc.target, append(tc.opts, grpc.WithTransportCredentials(insecure.NewCredentials()), dialer)...)
			if err != nil {
				t.Fatal(err)
			}
			defer conn.Close()
			hc := healthpb.NewHealthClient(conn)
			for i := 0; i < 20; i++ {
				rep, err := hc.Check(ctx, &healthpb.HealthCheckRequest{})
				if err != nil {
					t.Fatalf("call %d: %v", i, err)
				}
				if rep.Status != healthpb.HealthCheckResponse_SERVING {
					t.Fatalf("status %v", rep.Status)
				}
			}
			for i := range servers {
				if n := accepted[i].Load(); n < tc.minEach {
					t.Errorf("server pod %s accepted %d vconns, want at least %d", servers[i].name, n, tc.minEach)
				}
			}
		})
	}
	for _, want := range []string{"10.244.1.7:7000", "10.244.0.7:7000", "echo.default.svc:7000"} {
		if _, ok := dialed.Load(want); !ok {
			t.Errorf("gRPC never dialed %s", want)
		}
	}
	// Through the resolver pkg/vconn was given: a name it does not know is
	// ErrUnknownHost; a pod IP no node serves is ErrUnreachable.
	if _, err := cli.Dial(ctx, "nosuch.default.svc:7000"); !errors.Is(err, vconn.ErrUnknownHost) {
		t.Errorf("dial an unknown name: %v, want ErrUnknownHost", err)
	}
	viaDNS, err := vconn.NewClient(ctx, vconn.Options{Socket: clientSocket(t, cl, "cli"), Resolver: dns.resolver()})
	if err != nil {
		t.Fatal(err)
	}
	defer viaDNS.Close()
	c, err := viaDNS.Dial(ctx, "echo.default.svc:7000")
	if err != nil {
		t.Fatalf("dial the Service's name through DNS: %v", err)
	}
	if got := c.RemoteAddr().String(); got != "10.244.1.7:7000" && got != "10.244.0.7:7000" {
		t.Errorf("dialed %s, want one of the Service's pods", got)
	}
	_ = c.Close()
}

// clientSocket is the socket of allocation id on the cluster's first node.
func clientSocket(t *testing.T, cl *agenttest.Cluster, id string) string {
	t.Helper()
	for _, al := range cl.Nodes[0].Agent.Allocations() {
		if al.ID == id {
			return al.Socket
		}
	}
	t.Fatalf("no allocation %s", id)
	return ""
}
