package main

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"golang.org/x/net/dns/dnsmessage"
	"google.golang.org/grpc"

	"github.com/rdmavisor/rdmavisor/internal/admin"
	"github.com/rdmavisor/rdmavisor/internal/agent/agenttest"
	"github.com/rdmavisor/rdmavisor/pkg/vconn"
)

// TestGRPCEcho runs the example as pods would across two agents: two
// server pods, one on each node, behind a headless Service, and a client
// pod on the first node whose gRPC dns resolver asks a cluster DNS (a fake
// on loopback) for the Service's name. The client starts before the
// Service has pods: its calls wait until they exist. Every call comes back
// intact, round_robin spreads the calls over both pods, and the verdict
// says so.
func TestGRPCEcho(t *testing.T) {
	cl, err := agenttest.Start(agenttest.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	pod := func(n *agenttest.Node, name, ip string) *vconn.Client {
		c, err := n.PodClient(ctx, admin.Pod{UID: "uid-" + name, Namespace: "default", Name: name, IPs: []string{ip}}, name, 4)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = c.Close() })
		return c
	}
	const name = "grpcecho.default.svc.cluster.local."
	dns := startDNS(t)
	servers := []struct {
		node *agenttest.Node
		name string
		ip   netip.Addr
	}{{cl.Nodes[1], "grpcecho-0", netip.MustParseAddr("10.244.1.4")}, {cl.Nodes[0], "grpcecho-1", netip.MustParseAddr("10.244.0.4")}}
	cli := pod(cl.Nodes[0], "client", "10.244.0.9")

	type result struct {
		out string
		err error
	}
	res := make(chan result, 1)
	var count counts
	go func() {
		out, err := client(ctx, cli, "dns://"+dns.addr()+"/"+strings.TrimSuffix(name, ".")+":7100", 200, 3000, &count)
		res <- result{out, err}
	}()
	time.Sleep(200 * time.Millisecond)
	calls := make([]atomic.Int64, len(servers))
	var wg sync.WaitGroup
	sctx, stop := context.WithCancel(ctx)
	defer func() { stop(); wg.Wait() }()
	for i, s := range servers {
		c := pod(s.node, s.name, s.ip.String())
		counting := grpc.UnaryInterceptor(func(ctx context.Context, req any, info *grpc.UnaryServerInfo, h grpc.UnaryHandler) (any, error) {
			calls[i].Add(1)
			return h(ctx, req)
		})
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := serve(sctx, c, 7100, counting); err != nil {
				t.Errorf("server %s: %v", s.name, err)
			}
		}()
	}
	// The pods are ready: the Service's name resolves to them.
	dns.set(name, servers[0].ip, servers[1].ip)

	r := <-res
	if r.err != nil || !strings.HasPrefix(r.out, "grpcecho: OK 200 calls, 600000 bytes checked") {
		t.Fatalf("client: %q, %v", r.out, r.err)
	}
	for i, s := range servers {
		if n := calls[i].Load(); n == 0 {
			t.Errorf("server pod %s answered no calls: round_robin did not spread them", s.name)
		}
	}
	if got := calls[0].Load() + calls[1].Load(); got != 200 {
		t.Errorf("the servers answered %d calls, want 200", got)
	}

	path := filepath.Join(t.TempDir(), "verdict")
	writeVerdict(path, r.err, &count)
	var v Verdict
	if b, err := os.ReadFile(path); err != nil || json.Unmarshal(b, &v) != nil {
		t.Fatalf("verdict: %s, %v", b, err)
	}
	if !v.OK || v.Error != "" || v.Sent != 200 || v.Delivered != 200 || time.Since(v.At) > time.Minute {
		t.Errorf("verdict %+v, want ok, 200 sent and delivered, just now", v)
	}

	// A name the DNS does not know: the calls wait for it until the
	// deadline, and the verdict says the call failed and none came back.
	short, cancelShort := context.WithTimeout(ctx, 500*time.Millisecond)
	defer cancelShort()
	var none counts
	_, err = client(short, cli, "dns://"+dns.addr()+"/nosuch.default.svc.cluster.local:7100", 3, 10, &none)
	if err == nil {
		t.Fatal("calls to an unknown Service succeeded")
	}
	writeVerdict(path, err, &none)
	b, _ := os.ReadFile(path)
	if err := json.Unmarshal(b, &v); err != nil || v.OK || v.Error == "" || v.Sent != 1 || v.Delivered != 0 {
		t.Errorf("verdict of a failed client %s (%v), want not ok, an error, 1 sent, 0 delivered", b, err)
	}
}

// fakeDNS is the cluster's DNS on loopback: A records for the names set,
// NXDOMAIN for others (as hack/cmd/localdns answers).
type fakeDNS struct {
	pc      net.PacketConn
	mu      sync.Mutex
	records map[string][]netip.Addr
}

func startDNS(t *testing.T) *fakeDNS {
	t.Helper()
	pc, err := net.ListenPacket("udp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	d := &fakeDNS{pc: pc, records: map[string][]netip.Addr{}}
	done := make(chan struct{})
	go func() {
		defer close(done)
		buf := make([]byte, 1500)
		for {
			n, from, err := pc.ReadFrom(buf)
			if err != nil {
				return
			}
			if rep, err := d.answer(buf[:n]); err == nil {
				_, _ = pc.WriteTo(rep, from)
			}
		}
	}()
	t.Cleanup(func() { _ = pc.Close(); <-done })
	return d
}

func (d *fakeDNS) addr() string { return d.pc.LocalAddr().String() }

func (d *fakeDNS) set(name string, ips ...netip.Addr) {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.records[name] = ips
}

func (d *fakeDNS) answer(query []byte) ([]byte, error) {
	var p dnsmessage.Parser
	h, err := p.Start(query)
	if err != nil {
		return nil, fmt.Errorf("parsing: %w", err)
	}
	q, err := p.Question()
	if err != nil {
		return nil, fmt.Errorf("parsing: %w", err)
	}
	d.mu.Lock()
	ips, known := d.records[strings.ToLower(q.Name.String())]
	d.mu.Unlock()
	rh := dnsmessage.Header{ID: h.ID, Response: true, Authoritative: true, RecursionDesired: h.RecursionDesired}
	if !known {
		rh.RCode = dnsmessage.RCodeNameError
	}
	b := dnsmessage.NewBuilder(nil, rh)
	_ = b.StartQuestions()
	if err := b.Question(q); err != nil {
		return nil, err
	}
	_ = b.StartAnswers()
	for _, ip := range ips {
		if q.Type != dnsmessage.TypeA {
			break
		}
		if err := b.AResource(dnsmessage.ResourceHeader{Name: q.Name, Type: dnsmessage.TypeA, Class: dnsmessage.ClassINET, TTL: 5}, dnsmessage.AResource{A: ip.As4()}); err != nil {
			return nil, err
		}
	}
	return b.Finish()
}
