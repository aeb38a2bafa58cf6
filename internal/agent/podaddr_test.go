package agent_test

import (
	"context"
	"errors"
	"net"
	"net/netip"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/rdmavisor/rdmavisor/internal/agent"
	"github.com/rdmavisor/rdmavisor/internal/agent/agenttest"
	"github.com/rdmavisor/rdmavisor/internal/agent/controlpb"
	"github.com/rdmavisor/rdmavisor/internal/config"
	"github.com/rdmavisor/rdmavisor/internal/vqpn"
	"github.com/rdmavisor/rdmavisor/pkg/vconn"
)

// apiPods is the API server's word on pod IPs, as rdmanode.PodIPs gives
// it: ip → node.
type apiPods struct {
	mu    sync.Mutex
	nodes map[netip.Addr]string
}

func (p *apiPods) NodeOf(ip netip.Addr) (string, bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	n, ok := p.nodes[ip]
	return n, ok
}

func (p *apiPods) set(ip, node string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.nodes[netip.MustParseAddr(ip)] = node
}

// apiCluster is a TLS cluster whose agents take pod IPs from api, and
// node-x: a node with a valid certificate, serving a control plane that
// counts whatever reaches it. A member node-x is one of the service's
// nodes (compromised); else it is a node outside the service.
func apiCluster(t *testing.T, api *apiPods, member bool) (*agenttest.Cluster, *thief, controlpb.ControlClient, *controlpb.Node) {
	t.Helper()
	const xIP = "127.0.0.9"
	xln, err := net.Listen("tcp", xIP+":0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { xln.Close() })
	o := agenttest.Options{TLS: true, TuneAgent: func(o *agent.Options) { o.PodAddresses = api }}
	if member {
		o.TuneConfig = withPeer("node-x", xln.Addr().String())
	}
	cl := startCluster(t, o)
	xSrc := certSource(t, cl.CA, "node-x", xIP)
	x := &thief{}
	srv := grpc.NewServer(grpc.Creds(xSrc.Credentials()))
	controlpb.RegisterControlServer(srv, x)
	go func() { _ = srv.Serve(xln) }()
	t.Cleanup(srv.Stop)
	h := hostile(t, cl.Nodes[0].Agent.ControlAddress(), xSrc.Credentials())
	me := &controlpb.Node{Name: "node-x", ControlAddress: xln.Addr().String(), Gid: mappedGID(xIP), Incarnation: 1}
	return cl, x, h, me
}

// withPeer adds node at addr to an agent's configured peers: a node of
// the service.
func withPeer(node, addr string) func(*config.AgentConfig) {
	return func(c *config.AgentConfig) {
		c.PeerDiscovery.Static = append(c.PeerDiscovery.Static, config.Peer{NodeName: node, Address: addr})
	}
}

// TestOutsiderCannotAnnounce is the membership half of issue 33's finding
// 2: a node with a valid certificate that no RDMANode of the service
// lists (here: no configured peer) announces pod IPs, and is refused
// (PermissionDenied, naming why), as the agents take their pod addresses
// from the API server and would otherwise keep it as a peer, whose silence
// later made the service NotReady (the rogue-announcer e2e step). The same
// holds in standalone mode, where an announcement routes dials.
func TestOutsiderCannotAnnounce(t *testing.T) {
	for _, kube := range []bool{true, false} {
		api := &apiPods{nodes: map[netip.Addr]string{}}
		var h controlpb.ControlClient
		var me *controlpb.Node
		if kube {
			_, _, h, me = apiCluster(t, api, false)
		} else {
			_, _, h, me = plainCluster(t)
		}
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		_, err := h.Announce(ctx, &controlpb.Announcement{Caller: me, PodIps: [][]byte{{10, 244, 1, 10}}})
		cancel()
		if status.Code(err) != codes.PermissionDenied || !strings.Contains(err.Error(), "not a node of this service") {
			t.Errorf("kubernetes mode %v: an outsider's announcement: %v, want PermissionDenied: not a node of this service", kube, err)
		}
	}
}

// TestAPIPodIPsOutrankAnnouncements is issue 33's findings 1 and 2 with
// pod addresses from the API server: node-x, a node of the service, announces the IP of a live
// pod on node-b, and 65,536 more (every pod of node-b's among them); then
// node-b's agent restarts (a rolling upgrade). Dials of node-b's pods
// reach node-b (pods made unreachable: 0), dials during the restart fail
// rather than go elsewhere, and dials of IPs no pod has are refused:
// dials reaching node-x: 0.
func TestAPIPodIPsOutrankAnnouncements(t *testing.T) {
	api := &apiPods{nodes: map[netip.Addr]string{}}
	cl, x, h, me := apiCluster(t, api, true)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	nodeA, nodeB := cl.Nodes[0], cl.Nodes[1]
	api.set("10.244.0.10", nodeA.Name)
	cli := podClient(t, ctx, nodeA, "tenant-a", "cli", "10.244.0.10", 64)
	victims := []string{"10.244.1.10", "10.244.1.11", "10.244.1.12", "10.244.1.13"}
	var lns []*vconn.Listener
	for i, ip := range victims {
		api.set(ip, nodeB.Name)
		v := podClient(t, ctx, nodeB, "tenant-b", "echo-"+string(rune('a'+i)), ip, 8)
		ln, err := v.Listen(ctx, ":7000")
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { ln.Close() })
		go agenttest.ServeEcho(ln)
		lns = append(lns, ln)
	}
	claim := make([][]byte, 0, 1<<16)
	for i := 0; len(claim) < 1<<16; i++ {
		claim = append(claim, []byte{10, 244, byte(i >> 8), byte(i)})
	}
	if _, err := h.Announce(ctx, &controlpb.Announcement{Caller: me, PodIps: claim}); err != nil {
		t.Fatalf("node-x's announcement: %v", err)
	}
	unreachable := 0
	for _, ip := range victims {
		c, err := cli.Dial(ctx, ip+":7000")
		if err != nil {
			t.Errorf("dial %s after node-x claimed it: %v", ip, err)
			unreachable++
			continue
		}
		echoes(t, c, "still node-b's")
		_ = c.Close()
	}
	if _, err := cli.Dial(ctx, "10.244.9.9:7000"); !errors.Is(err, vconn.ErrUnreachable) {
		t.Errorf("dial of an IP no pod has, which node-x claimed: %v, want ErrUnreachable", err)
	}
	if err := nodeB.Stop(); err != nil {
		t.Fatal(err)
	}
	dctx, dcancel := context.WithTimeout(ctx, 10*time.Second)
	if c, err := cli.Dial(dctx, victims[0]+":7000"); err == nil {
		t.Errorf("a dial of node-b's pod while its agent is down reached %v", c.RemoteAddr())
		_ = c.Close()
	}
	dcancel()
	if err := nodeB.Restart(); err != nil { // starts it again
		t.Fatal(err)
	}
	t.Logf("pods made unreachable: %d of %d; dials reaching node-x: %d", unreachable, len(victims), x.contacts.Load())
	if unreachable != 0 {
		t.Errorf("pods made unreachable by node-x's announcement: %d, want 0", unreachable)
	}
	if n := x.contacts.Load(); n != 0 {
		t.Errorf("dials reaching node-x: %d, want 0", n)
	}
}

// TestForgedCallerIP is issue 33's finding 3: node-x dials a listener on
// node-b naming as its caller a pod IP of node-a, and one of node-b: the
// API server places neither on node-x, so both are refused
// (PermissionDenied) before a listener sees them: forged source IPs seen:
// 0. A real pod's dial carries its own IP, which the listener sees.
func TestForgedCallerIP(t *testing.T) {
	api := &apiPods{nodes: map[netip.Addr]string{}}
	cl, _, _, me := apiCluster(t, api, true)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	nodeA, nodeB := cl.Nodes[0], cl.Nodes[1]
	api.set("10.244.0.10", nodeA.Name)
	api.set("10.244.1.10", nodeB.Name)
	api.set("10.244.1.20", nodeB.Name)
	cli := podClient(t, ctx, nodeA, "tenant-a", "cli", "10.244.0.10", 4)
	srv := podClient(t, ctx, nodeB, "tenant-b", "srv", "10.244.1.10", 8)
	ln, err := srv.Listen(ctx, ":7000")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	seen := make(chan string, 8)
	go func() {
		for {
			c, err := ln.AcceptVConn()
			if err != nil {
				return
			}
			seen <- c.RemoteAddr().String()
			_ = c.Close()
		}
	}()
	xSrc := certSource(t, cl.CA, "node-x", "127.0.0.9")
	hb := hostile(t, nodeB.Agent.ControlAddress(), xSrc.Credentials())
	for _, forged := range []string{"10.244.0.10", "10.244.1.20"} {
		_, err := hb.Dial(ctx, &controlpb.DialRequest{Caller: me, Port: 7000, Vconn: uint32(vqpn.MakeID(5, 1)),
			Ip: netip.MustParseAddr("10.244.1.10").AsSlice(), FromIp: netip.MustParseAddr(forged).AsSlice()})
		if status.Code(err) != codes.PermissionDenied {
			t.Errorf("node-x dialling as %s: %v, want PermissionDenied", forged, err)
		}
	}
	c, err := cli.Dial(ctx, "10.244.1.10:7000")
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	forged := 0
	for got := false; !got; {
		select {
		case r := <-seen:
			if r == "10.244.0.10:0" {
				got = true // the real pod's dial
			} else {
				forged++
			}
		case <-ctx.Done():
			t.Fatal("the real pod's dial never reached the listener")
		}
	}
	t.Logf("forged source IPs seen by the listener: %d", forged)
	if forged != 0 {
		t.Errorf("forged source IPs seen by the listener: %d, want 0", forged)
	}
}
