//go:build e2e

package e2e

import (
	"context"
	"fmt"
	"maps"
	"net"
	"net/netip"
	"os"
	"path"
	"path/filepath"
	"strings"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/status"

	"github.com/rdmavisor/rdmavisor/api/v1alpha1"
	"github.com/rdmavisor/rdmavisor/controllers"
	"github.com/rdmavisor/rdmavisor/internal/agent/controlpb"
	"github.com/rdmavisor/rdmavisor/internal/pki"
)

// node-x, the rogue node of the step in rogue_test.go: a certificate of
// the cluster CA's, a control plane that counts what reaches it, and an
// announcer.

// nodeXName is the rogue node's name: one no node has, so no RDMANode of
// the service lists it, and the agents refuse its announcements as an
// outsider's (before they did, they kept it as a peer, and its silence
// made the service NotReady). A compromised node's own name would not do: its
// peers keep its real control address for it, so dials sent its way
// would reach its real agent, which this test cannot count. Holding the
// CA's key, read from its Secret, node-x can do what any certified node
// can, and more.
const nodeXName = "node-x"

// nodeXIncarnation is node-x's incarnation, in its answers.
const nodeXIncarnation = 33

// nodeX is the rogue node: a control plane on this host's address on the
// nodes' network, under a certificate for node-x, which answers heartbeats
// and announcements as an agent does, should an agent take it for a peer,
// and counts every call that reaches it, by method. A dial routed to it
// would begin with Identity (or Dial, or ConnectQP).
type nodeX struct {
	controlpb.UnimplementedControlServer
	ip    net.IP
	addr  string // host:port the agents reach it at
	creds credentials.TransportCredentials
	srv   *grpc.Server

	mu      sync.Mutex
	calls   map[string]int       // by method
	refused map[string]time.Time // node → when its agent last refused node-x's announcement as an outsider's
	takes   map[string]int       // node → how many its agent took (the step wants 0)
	errs    map[string]string    // node → the last announcement's error, if it failed otherwise
}

// startNodeX issues node-x a certificate with the cluster CA, read from
// its Secret with the admin client, for this host's address on the
// nodes' network, and serves node-x's control plane there.
func (e *env) startNodeX() *nodeX {
	n, err := e.kube.CoreV1().Nodes().Get(e.ctx, e.nodes[0], metav1.GetOptions{})
	if err != nil {
		e.t.Fatal(err)
	}
	ip, err := hostAddrFacing(internalIP(n))
	if err != nil {
		e.t.Fatal(err)
	}
	sec, err := e.kube.CoreV1().Secrets(namespace).Get(e.ctx, controllers.CAName, metav1.GetOptions{})
	if err != nil {
		e.t.Fatalf("the cluster CA's Secret: %v", err)
	}
	ca, err := pki.LoadCA(sec.Data[corev1.TLSCertKey], sec.Data[corev1.TLSPrivateKeyKey])
	if err != nil {
		e.t.Fatalf("the cluster CA's Secret %s/%s: %v", namespace, controllers.CAName, err)
	}
	cert, key, err := ca.Issue(nodeXName, []net.IP{ip}, time.Hour)
	if err != nil {
		e.t.Fatal(err)
	}
	dir := e.t.TempDir() // removed with the step
	f := pki.Files{Cert: filepath.Join(dir, "tls.crt"), Key: filepath.Join(dir, "tls.key"), CA: filepath.Join(dir, "ca.crt")}
	for p, b := range map[string][]byte{f.Cert: cert, f.Key: key, f.CA: ca.CertPEM} {
		if err := os.WriteFile(p, b, 0o600); err != nil {
			e.t.Fatal(err)
		}
	}
	src, err := pki.NewSource(f)
	if err != nil {
		e.t.Fatal(err)
	}
	ln, err := net.Listen("tcp", net.JoinHostPort(ip.String(), "0"))
	if err != nil {
		e.t.Fatalf("node-x's control plane on %s: %v", ip, err)
	}
	x := &nodeX{ip: ip, addr: ln.Addr().String(), creds: src.Credentials(),
		calls: map[string]int{}, refused: map[string]time.Time{}, takes: map[string]int{}, errs: map[string]string{}}
	x.srv = grpc.NewServer(grpc.Creds(x.creds),
		grpc.UnaryInterceptor(func(ctx context.Context, req any, info *grpc.UnaryServerInfo, h grpc.UnaryHandler) (any, error) {
			x.count(info.FullMethod)
			return h(ctx, req)
		}),
		grpc.StreamInterceptor(func(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, h grpc.StreamHandler) error {
			x.count(info.FullMethod)
			return h(srv, ss)
		}),
		// A method of no service here: counted too (by the interceptor).
		grpc.UnknownServiceHandler(func(any, grpc.ServerStream) error { return status.Error(codes.Unimplemented, "node-x") }))
	controlpb.RegisterControlServer(x.srv, x)
	go func() { _ = x.srv.Serve(ln) }()
	e.t.Logf("node-x: certificate of the cluster CA for %q at %s, control plane at %s", nodeXName, ip, x.addr)
	return x
}

// hostAddrFacing is this host's address on the network of node address
// nodeIP (the local cluster's bridge: hack/local-cluster).
func hostAddrFacing(nodeIP string) (net.IP, error) {
	ip := net.ParseIP(nodeIP)
	if ip == nil {
		return nil, fmt.Errorf("node address %q is not an IP", nodeIP)
	}
	addrs, err := net.InterfaceAddrs()
	if err != nil {
		return nil, fmt.Errorf("this host's addresses: %w", err)
	}
	for _, a := range addrs {
		if n, ok := a.(*net.IPNet); ok && n.Contains(ip) && !n.IP.Equal(ip) {
			return n.IP, nil
		}
	}
	return nil, fmt.Errorf("no address of this host's is on the network of node address %s", nodeIP)
}

func (x *nodeX) count(method string) {
	x.mu.Lock()
	x.calls[path.Base(method)]++
	x.mu.Unlock()
}

// Heartbeat answers every beat, as a live agent does.
func (x *nodeX) Heartbeat(s controlpb.Control_HeartbeatServer) error {
	for {
		b, err := s.Recv()
		if err != nil {
			return nil
		}
		if err := s.Send(&controlpb.Beat{Seq: b.GetSeq(), Incarnation: nodeXIncarnation}); err != nil {
			return fmt.Errorf("node-x's heartbeat: %w", err)
		}
	}
}

// Announce takes the agents' announcements, as an agent does.
func (x *nodeX) Announce(context.Context, *controlpb.Announcement) (*controlpb.AnnounceReply, error) {
	return &controlpb.AnnounceReply{Incarnation: nodeXIncarnation}, nil
}

// calledBy splits the calls that reached node-x: those an agent makes of
// any peer it keeps (Heartbeat, Announce), and the rest, which only a
// dial routed to node-x would make.
func (x *nodeX) calledBy() (peerCalls, dialCalls int, all map[string]int) {
	x.mu.Lock()
	defer x.mu.Unlock()
	all = map[string]int{}
	for m, n := range x.calls {
		all[m] = n
		if m == "Heartbeat" || m == "Announce" {
			peerCalls += n
		} else {
			dialCalls += n
		}
	}
	return peerCalls, dialCalls, all
}

// self is node-x as an announcement names its caller: its name, control
// address and GID (its IPv4 address, mapped, as a RoCE v2 GID is).
func (x *nodeX) self(name string) *controlpb.Node {
	return &controlpb.Node{Name: name, ControlAddress: x.addr, Gid: x.ip.To16(), Incarnation: nodeXIncarnation}
}

// dial is a client of the agent at addr under node-x's certificate.
func (x *nodeX) dial(addr string) (controlpb.ControlClient, func(), error) {
	conn, err := grpc.NewClient("passthrough:///"+addr, grpc.WithTransportCredentials(x.creds))
	if err != nil {
		return nil, nil, fmt.Errorf("node-x's client of %s: %w", addr, err)
	}
	return controlpb.NewControlClient(conn), func() { _ = conn.Close() }, nil
}

// announce announces claim to every agent (node → control address), again
// every half second, until ctx ends: each agent's restart, or its peers
// changing, drops a peer's announcement, and node-x says it again at
// once, as an agent would.
func (x *nodeX) announce(ctx context.Context, agents map[string]string, claim [][]byte) {
	var wg sync.WaitGroup
	defer wg.Wait()
	for node, addr := range agents {
		cl, closeConn, err := x.dial(addr)
		if err != nil {
			x.result(node, err)
			continue
		}
		wg.Go(func() {
			defer closeConn()
			for ctx.Err() == nil {
				actx, cancel := context.WithTimeout(ctx, 5*time.Second)
				_, err := cl.Announce(actx, &controlpb.Announcement{Caller: x.self(nodeXName), PodIps: claim})
				cancel()
				x.result(node, err)
				select {
				case <-ctx.Done():
				case <-time.After(500 * time.Millisecond):
				}
			}
		})
	}
}

// result records an agent's answer: refused as an outsider's
// (PermissionDenied, naming why), taken, or failed otherwise (the agent
// restarting, say).
func (x *nodeX) result(node string, err error) {
	x.mu.Lock()
	defer x.mu.Unlock()
	switch {
	case err == nil:
		x.takes[node]++
	case status.Code(err) == codes.PermissionDenied && strings.Contains(err.Error(), "not a node of this service"):
		x.refused[node] = time.Now()
		delete(x.errs, node)
	default:
		x.errs[node] = err.Error()
	}
}

// refusedSince: every node's agent refused node-x's announcement, as an
// outsider's, after t.
func (x *nodeX) refusedSince(t time.Time, nodes []string) func() (bool, string) {
	return func() (bool, string) {
		x.mu.Lock()
		defer x.mu.Unlock()
		for _, n := range nodes {
			if !x.refused[n].After(t) {
				return false, fmt.Sprintf("the agent on %s: last refused it at %s; took it %d times; last other error: %s",
					n, x.refused[n].Format(time.StampMilli), x.takes[n], x.errs[n])
			}
		}
		return true, ""
	}
}

// announcementsTaken is how many announcements each node's agent took.
func (x *nodeX) announcementsTaken() map[string]int {
	x.mu.Lock()
	defer x.mu.Unlock()
	return maps.Clone(x.takes)
}

// stop ends node-x's control plane (grpc.Server.Stop may be called again).
func (x *nodeX) stop() { x.srv.Stop() }

// claimAround is ip's /16, every address of it: 65,536 IPs, as many as
// an announcement may carry, the pods of every node's among them (the
// local cluster's pod network is one /16).
func claimAround(ip string) ([][]byte, error) {
	a, err := netip.ParseAddr(ip)
	if err != nil || !a.Is4() {
		return nil, fmt.Errorf("pod IP %q: want an IPv4 address (%v)", ip, err)
	}
	b := a.As4()
	claim := make([][]byte, 0, 1<<16)
	for i := range 1 << 16 {
		claim = append(claim, []byte{b[0], b[1], byte(i >> 8), byte(i)})
	}
	return claim, nil
}

// controlAddresses are the agents' control addresses, by node, as their
// RDMANodes say.
func (e *env) controlAddresses() map[string]string {
	m := map[string]string{}
	for _, n := range e.nodes {
		var rn v1alpha1.RDMANode
		if err := e.crs.Get(e.ctx, client.ObjectKey{Name: n}, &rn); err != nil {
			e.t.Fatal(err)
		}
		if rn.Status.Address == nil {
			e.t.Fatalf("RDMANode %s has no address", n)
		}
		m[n] = net.JoinHostPort(rn.Status.Address.IP, fmt.Sprint(rn.Status.Address.ControlPort))
	}
	return m
}
