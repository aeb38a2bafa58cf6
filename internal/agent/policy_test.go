package agent_test

import (
	"context"
	"errors"
	"net/netip"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/rdmavisor/rdmavisor/internal/agent"
	"github.com/rdmavisor/rdmavisor/internal/agent/agenttest"
	"github.com/rdmavisor/rdmavisor/internal/netpol"
	"github.com/rdmavisor/rdmavisor/pkg/vconn"
)

// fakePolicy is agent.Policy over fixed pods and the policies a test sets,
// with package netpol's semantics (rdmanode.Policies reads the same from
// informers); it counts the checks of each direction.
type fakePolicy struct {
	mu              sync.Mutex
	cluster         netpol.Static
	pods            []*netpol.Pod
	ingress, egress atomic.Int64
}

func (f *fakePolicy) set(p ...*networkingv1.NetworkPolicy) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.cluster.List = p
}

func (f *fakePolicy) peer(e netpol.Endpoint) netpol.Peer {
	for _, p := range f.pods {
		if e.Pod == p.Namespace+"/"+p.Name || (e.Pod == "" && e.IP == p.IP) {
			return netpol.Peer{Pod: p}
		}
	}
	return netpol.Peer{IP: e.IP, Node: e.Node}
}

func (f *fakePolicy) check(decide func(netpol.Cluster, netpol.Conn) netpol.Verdict, from, to netpol.Endpoint, port uint32) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	c := netpol.Conn{From: f.peer(from), To: f.peer(to), Port: int32(port)}
	return decide(&f.cluster, c).Err(c)
}

func (f *fakePolicy) Ingress(from, to netpol.Endpoint, port uint32) error {
	f.ingress.Add(1)
	return f.check(netpol.Ingress, from, to, port)
}

func (f *fakePolicy) Egress(from, to netpol.Endpoint, port uint32) error {
	f.egress.Add(1)
	return f.check(netpol.Egress, from, to, port)
}

// policyCluster: a server pod srv/echo on node-b (10.244.1.10) echoes on
// port 7000; a client pod cli/c on node-a (10.244.0.10), in a namespace
// labelled team=a; the agents check dials with pol.
func policyCluster(t *testing.T, ctx context.Context) (pol *fakePolicy, cli *vconn.Client) {
	t.Helper()
	pol = &fakePolicy{cluster: netpol.Static{Namespaces: map[string]map[string]string{"cli": {"team": "a"}, "srv": {}}}, pods: []*netpol.Pod{
		{Namespace: "srv", Name: "echo", IP: netip.MustParseAddr("10.244.1.10"), Node: "node-b", Labels: map[string]string{"app": "echo"}},
		{Namespace: "cli", Name: "c", IP: netip.MustParseAddr("10.244.0.10"), Node: "node-a"},
	}}
	cl := startCluster(t, agenttest.Options{TuneAgent: func(o *agent.Options) { o.Policy = pol }})
	srv := podClient(t, ctx, cl.Nodes[1], "srv", "echo", "10.244.1.10", 8)
	ln, err := srv.Listen(ctx, ":7000")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	go agenttest.ServeEcho(ln)
	return pol, podClient(t, ctx, cl.Nodes[0], "cli", "c", "10.244.0.10", 8)
}

// everyByte is each byte value, for an echo checked byte by byte.
func everyByte() string {
	b := make([]byte, 256)
	for i := range b {
		b[i] = byte(i)
	}
	return string(b)
}

var denyIngress = &networkingv1.NetworkPolicy{ObjectMeta: metav1.ObjectMeta{Name: "deny-all", Namespace: "srv"},
	Spec: networkingv1.NetworkPolicySpec{PolicyTypes: []networkingv1.PolicyType{networkingv1.PolicyTypeIngress}}}

// TestPolicyIngress: a deny-all ingress policy in the server's namespace
// refuses a dial from another namespace (ErrRefused, the callee's agent
// naming the policy); an allow rule for the client's namespace admits it,
// and the echo comes back byte for byte. A vconn open before the deny
// stays open and keeps working (policies are checked at dial time).
func TestPolicyIngress(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	pol, cli := policyCluster(t, ctx)
	before, err := cli.Dial(ctx, "10.244.1.10:7000")
	if err != nil {
		t.Fatalf("dial without a policy: %v", err)
	}
	defer before.Close()
	pol.set(denyIngress)
	_, err = cli.Dial(ctx, "10.244.1.10:7000")
	if !errors.Is(err, vconn.ErrRefused) || !strings.Contains(err.Error(), "NetworkPolicy deny-all of namespace srv") || !strings.Contains(err.Error(), "ingress") {
		t.Fatalf("dial under deny-all ingress: %v, want ErrRefused naming deny-all", err)
	}
	if pol.ingress.Load() == 0 {
		t.Error("the callee's agent asked no ingress question")
	}
	echoes(t, before, "open before the policy: "+everyByte())
	allow := &networkingv1.NetworkPolicy{ObjectMeta: metav1.ObjectMeta{Name: "allow-team-a", Namespace: "srv"},
		Spec: networkingv1.NetworkPolicySpec{PodSelector: metav1.LabelSelector{MatchLabels: map[string]string{"app": "echo"}},
			Ingress: []networkingv1.NetworkPolicyIngressRule{{From: []networkingv1.NetworkPolicyPeer{{NamespaceSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"team": "a"}}}}}}}}
	pol.set(denyIngress, allow)
	c, err := cli.Dial(ctx, "10.244.1.10:7000")
	if err != nil {
		t.Fatalf("dial with an allow rule for the client's namespace: %v", err)
	}
	defer c.Close()
	echoes(t, c, everyByte())
}

// TestPolicyEgress: an egress deny on the client's namespace refuses its
// dial on the client's own node (ErrRefused naming the policy): the
// callee's agent is never asked.
func TestPolicyEgress(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	pol, cli := policyCluster(t, ctx)
	pol.set(&networkingv1.NetworkPolicy{ObjectMeta: metav1.ObjectMeta{Name: "no-egress", Namespace: "cli"},
		Spec: networkingv1.NetworkPolicySpec{PolicyTypes: []networkingv1.PolicyType{networkingv1.PolicyTypeEgress}}})
	_, err := cli.Dial(ctx, "10.244.1.10:7000")
	if !errors.Is(err, vconn.ErrRefused) || !strings.Contains(err.Error(), "NetworkPolicy no-egress of namespace cli") || !strings.Contains(err.Error(), "egress") {
		t.Fatalf("dial under an egress deny: %v, want ErrRefused naming no-egress", err)
	}
	if n := pol.ingress.Load(); n != 0 {
		t.Errorf("ingress questions %d after an egress refusal, want 0: the dial left its node", n)
	}
	pol.set()
	c, err := cli.Dial(ctx, "10.244.1.10:7000")
	if err != nil {
		t.Fatalf("dial once the policy is gone: %v", err)
	}
	defer c.Close()
	echoes(t, c, everyByte())
	if pol.egress.Load() < 2 || pol.ingress.Load() != 1 {
		t.Errorf("checks: egress %d, ingress %d; want 2 and 1", pol.egress.Load(), pol.ingress.Load())
	}
}
