package netpol_test

import (
	"errors"
	"net/netip"
	"slices"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"

	"github.com/rdmavisor/rdmavisor/internal/netpol"
)

var (
	tcp  = corev1.ProtocolTCP
	udp  = corev1.ProtocolUDP
	sctp = corev1.ProtocolSCTP
	ing  = []networkingv1.PolicyType{networkingv1.PolicyTypeIngress}
	egr  = []networkingv1.PolicyType{networkingv1.PolicyTypeEgress}
	all  = metav1.LabelSelector{}
)

func pol(name, ns string, sel metav1.LabelSelector, types []networkingv1.PolicyType, in []networkingv1.NetworkPolicyIngressRule, out []networkingv1.NetworkPolicyEgressRule) *networkingv1.NetworkPolicy {
	return &networkingv1.NetworkPolicy{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns},
		Spec: networkingv1.NetworkPolicySpec{PodSelector: sel, PolicyTypes: types, Ingress: in, Egress: out}}
}

func sel(kv ...string) *metav1.LabelSelector {
	m := map[string]string{}
	for i := 0; i+1 < len(kv); i += 2 {
		m[kv[i]] = kv[i+1]
	}
	return &metav1.LabelSelector{MatchLabels: m}
}

func from(peers ...networkingv1.NetworkPolicyPeer) []networkingv1.NetworkPolicyIngressRule {
	return []networkingv1.NetworkPolicyIngressRule{{From: peers}}
}

func port(proto *corev1.Protocol, p intstr.IntOrString, end *int32) networkingv1.NetworkPolicyPort {
	return networkingv1.NetworkPolicyPort{Protocol: proto, Port: &p, EndPort: end}
}

func ptr[T any](v T) *T { return &v }

func pod(ns, name, ip, node string, kv ...string) netpol.Peer {
	return netpol.Peer{Pod: &netpol.Pod{Namespace: ns, Name: name, IP: netip.MustParseAddr(ip), Node: node, Labels: sel(kv...).MatchLabels,
		Ports: []corev1.ContainerPort{{Name: "rdma", ContainerPort: 7000}, {Name: "stats", ContainerPort: 7001, Protocol: udp}}}}
}

func host(ip, node string) netpol.Peer { return netpol.Peer{IP: netip.MustParseAddr(ip), Node: node} }

var (
	srv     = pod("srv", "echo", "10.0.1.10", "node-b", "app", "echo")
	cliA    = pod("team-a", "cli", "10.0.2.10", "node-a", "role", "cli")
	otherA  = pod("team-a", "other", "10.0.2.11", "node-a", "role", "other")
	cliB    = pod("team-b", "cli", "10.0.3.10", "node-a", "role", "cli")
	peerSrv = pod("srv", "peer", "10.0.1.11", "node-a", "role", "cli")
	nss     = map[string]map[string]string{"team-a": {"team": "a"}, "team-b": {"team": "b"}, "srv": {}}
)

type check struct {
	name            string
	pols            []*networkingv1.NetworkPolicy
	from, to        netpol.Peer
	port            int32
	ingress, egress bool
	isoIn, isoEg    []string // the isolating policies named when refused
}

func run(t *testing.T, cases []check) {
	t.Helper()
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			p := c.port
			if p == 0 {
				p = 7000
			}
			conn := netpol.Conn{From: c.from, To: c.to, Port: p}
			d := netpol.Decide(&netpol.Static{List: c.pols, Namespaces: nss}, conn)
			if d.Ingress.Allowed != c.ingress || d.Egress.Allowed != c.egress {
				t.Fatalf("ingress %v, egress %v; want %v, %v", d.Ingress.Allowed, d.Egress.Allowed, c.ingress, c.egress)
			}
			if d.Allowed() != (c.ingress && c.egress) {
				t.Errorf("Allowed() = %v", d.Allowed())
			}
			if !c.ingress && !slices.Equal(d.Ingress.Isolating, c.isoIn) {
				t.Errorf("ingress isolated by %v, want %v", d.Ingress.Isolating, c.isoIn)
			}
			if !c.egress && !slices.Equal(d.Egress.Isolating, c.isoEg) {
				t.Errorf("egress isolated by %v, want %v", d.Egress.Isolating, c.isoEg)
			}
			for _, v := range []netpol.Verdict{d.Ingress, d.Egress} {
				err := v.Err(conn)
				if (err == nil) != v.Allowed {
					t.Errorf("%s: Err %v with Allowed %v", v.Dir, err, v.Allowed)
				}
				var r *netpol.Refusal
				if err != nil && (!errors.As(err, &r) || !strings.Contains(err.Error(), v.Isolating[0]) || !strings.Contains(err.Error(), v.Pod)) {
					t.Errorf("%s: refusal %q names neither its policy %v nor pod %s", v.Dir, err, v.Isolating, v.Pod)
				}
			}
		})
	}
}

func TestIsolation(t *testing.T) {
	denyIn := pol("deny-in", "srv", all, ing, nil, nil)
	run(t, []check{
		{name: "default allow: no policy", from: cliA, to: srv, ingress: true, egress: true},
		{name: "default deny ingress", pols: []*networkingv1.NetworkPolicy{denyIn}, from: cliA, to: srv, egress: true, isoIn: []string{"deny-in"}},
		{name: "deny ingress leaves egress", pols: []*networkingv1.NetworkPolicy{denyIn}, from: srv, to: cliA, ingress: true, egress: true},
		{name: "deny ingress of another namespace", pols: []*networkingv1.NetworkPolicy{pol("deny-in", "team-b", all, ing, nil, nil)}, from: cliA, to: srv, ingress: true, egress: true},
		{name: "podSelector not selecting the pod", pols: []*networkingv1.NetworkPolicy{pol("db", "srv", *sel("app", "db"), ing, nil, nil)}, from: cliA, to: srv, ingress: true, egress: true},
		{name: "podSelector selecting the pod", pols: []*networkingv1.NetworkPolicy{pol("echo", "srv", *sel("app", "echo"), ing, nil, nil)}, from: cliA, to: srv, egress: true, isoIn: []string{"echo"}},
		{name: "default deny egress", pols: []*networkingv1.NetworkPolicy{pol("deny-out", "team-a", all, egr, nil, nil)}, from: cliA, to: srv, ingress: true, isoEg: []string{"deny-out"}},
		{name: "deny egress leaves ingress", pols: []*networkingv1.NetworkPolicy{pol("deny-out", "team-a", all, egr, nil, nil)}, from: cliB, to: cliA, ingress: true, egress: true},
		{name: "deny both", pols: []*networkingv1.NetworkPolicy{denyIn, pol("deny-out", "team-a", all, append(ing, egr...), nil, nil)}, from: cliA, to: srv, isoIn: []string{"deny-in"}, isoEg: []string{"deny-out"}},
		{name: "allow all ingress: a rule without from or ports", pols: []*networkingv1.NetworkPolicy{denyIn, pol("allow-all", "srv", all, ing, []networkingv1.NetworkPolicyIngressRule{{}}, nil)}, from: cliB, to: srv, ingress: true, egress: true},
		{name: "allow all egress", pols: []*networkingv1.NetworkPolicy{pol("out", "team-a", all, egr, nil, []networkingv1.NetworkPolicyEgressRule{{}})}, from: cliA, to: srv, ingress: true, egress: true},
		{name: "a pod reaches itself", pols: []*networkingv1.NetworkPolicy{denyIn, pol("deny-out", "srv", all, egr, nil, nil)}, from: srv, to: srv, ingress: true, egress: true},
		{name: "its own node reaches a pod", pols: []*networkingv1.NetworkPolicy{denyIn}, from: host("192.168.0.2", "node-b"), to: srv, ingress: true, egress: true},
		{name: "another node does not", pols: []*networkingv1.NetworkPolicy{denyIn}, from: host("192.168.0.1", "node-a"), to: srv, egress: true, isoIn: []string{"deny-in"}},
		{name: "a pod reaches its own node", pols: []*networkingv1.NetworkPolicy{pol("deny-out", "team-a", all, egr, nil, nil)}, from: cliA, to: host("192.168.0.1", "node-a"), ingress: true, egress: true},
		{name: "a host end is ungoverned", pols: []*networkingv1.NetworkPolicy{denyIn}, from: cliA, to: host("192.168.0.2", "node-b"), ingress: true, egress: true},
	})
}

func TestPolicyTypesDefault(t *testing.T) {
	toSrv := []networkingv1.NetworkPolicyEgressRule{{To: []networkingv1.NetworkPolicyPeer{{NamespaceSelector: sel("kubernetes.io/metadata.name", "srv")}}}}
	run(t, []check{
		{name: "no types, no rules: ingress only", pols: []*networkingv1.NetworkPolicy{pol("p", "team-a", all, nil, nil, nil)}, from: cliA, to: cliB, ingress: true, egress: true},
		{name: "no types, no rules: isolates ingress", pols: []*networkingv1.NetworkPolicy{pol("p", "team-a", all, nil, nil, nil)}, from: cliB, to: cliA, egress: true, isoIn: []string{"p"}},
		{name: "no types, egress rules: egress too (allowed)", pols: []*networkingv1.NetworkPolicy{pol("p", "team-a", all, nil, nil, toSrv)}, from: cliA, to: srv, ingress: true, egress: true},
		{name: "no types, egress rules: egress too (refused)", pols: []*networkingv1.NetworkPolicy{pol("p", "team-a", all, nil, nil, toSrv)}, from: cliA, to: cliB, ingress: true, isoEg: []string{"p"}},
		{name: "no types, egress rules: and ingress", pols: []*networkingv1.NetworkPolicy{pol("p", "team-a", all, nil, nil, toSrv)}, from: srv, to: cliA, egress: true, isoIn: []string{"p"}},
		{name: "Ingress only: egress rules ignored", pols: []*networkingv1.NetworkPolicy{pol("p", "team-a", all, ing, nil, toSrv)}, from: cliA, to: cliB, ingress: true, egress: true},
		{name: "Egress only: ingress open", pols: []*networkingv1.NetworkPolicy{pol("p", "team-a", all, egr, nil, toSrv)}, from: cliB, to: cliA, ingress: true, egress: true},
	})
}

func TestPeers(t *testing.T) {
	nsA := pol("from-a", "srv", all, ing, from(networkingv1.NetworkPolicyPeer{NamespaceSelector: sel("team", "a")}), nil)
	cliInA := pol("cli-in-a", "srv", all, ing, from(networkingv1.NetworkPolicyPeer{NamespaceSelector: sel("team", "a"), PodSelector: sel("role", "cli")}), nil)
	sameNS := pol("same-ns", "srv", all, ing, from(networkingv1.NetworkPolicyPeer{PodSelector: sel("role", "cli")}), nil)
	byName := pol("by-name", "srv", all, ing, from(networkingv1.NetworkPolicyPeer{NamespaceSelector: sel("kubernetes.io/metadata.name", "team-b")}), nil)
	block := pol("block", "srv", all, ing, from(networkingv1.NetworkPolicyPeer{IPBlock: &networkingv1.IPBlock{CIDR: "10.0.0.0/16", Except: []string{"10.0.3.0/24"}}}), nil)
	exists := pol("exists", "srv", all, ing, from(networkingv1.NetworkPolicyPeer{NamespaceSelector: &metav1.LabelSelector{MatchExpressions: []metav1.LabelSelectorRequirement{{Key: "kubernetes.io/metadata.name", Operator: metav1.LabelSelectorOpExists}}}}), nil)
	allNS := pol("all-ns", "srv", all, ing, from(networkingv1.NetworkPolicyPeer{NamespaceSelector: &all}), nil)
	run(t, []check{
		{name: "from a namespace: in it", pols: []*networkingv1.NetworkPolicy{nsA}, from: otherA, to: srv, ingress: true, egress: true},
		{name: "from a namespace: another", pols: []*networkingv1.NetworkPolicy{nsA}, from: cliB, to: srv, egress: true, isoIn: []string{"from-a"}},
		{name: "from a namespace: a host", pols: []*networkingv1.NetworkPolicy{nsA}, from: host("10.0.2.99", "node-a"), to: srv, egress: true, isoIn: []string{"from-a"}},
		{name: "from a namespace by its name label", pols: []*networkingv1.NetworkPolicy{byName}, from: cliB, to: srv, ingress: true, egress: true},
		{name: "from a namespace by name: another", pols: []*networkingv1.NetworkPolicy{byName}, from: cliA, to: srv, egress: true, isoIn: []string{"by-name"}},
		{name: "name label of a namespace not known yet", pols: []*networkingv1.NetworkPolicy{exists}, from: pod("team-c", "cli", "10.0.4.10", "node-a"), to: srv, ingress: true, egress: true},
		{name: "from every namespace", pols: []*networkingv1.NetworkPolicy{allNS}, from: cliB, to: srv, ingress: true, egress: true},
		{name: "from every namespace: not a host", pols: []*networkingv1.NetworkPolicy{allNS}, from: host("10.0.3.99", ""), to: srv, egress: true, isoIn: []string{"all-ns"}},
		{name: "from pods in a namespace", pols: []*networkingv1.NetworkPolicy{cliInA}, from: cliA, to: srv, ingress: true, egress: true},
		{name: "from pods in a namespace: other label", pols: []*networkingv1.NetworkPolicy{cliInA}, from: otherA, to: srv, egress: true, isoIn: []string{"cli-in-a"}},
		{name: "from pods in a namespace: other namespace", pols: []*networkingv1.NetworkPolicy{cliInA}, from: cliB, to: srv, egress: true, isoIn: []string{"cli-in-a"}},
		{name: "podSelector: the policy's namespace", pols: []*networkingv1.NetworkPolicy{sameNS}, from: peerSrv, to: srv, ingress: true, egress: true},
		{name: "podSelector: not another's", pols: []*networkingv1.NetworkPolicy{sameNS}, from: cliA, to: srv, egress: true, isoIn: []string{"same-ns"}},
		{name: "ipBlock: a pod in it", pols: []*networkingv1.NetworkPolicy{block}, from: cliA, to: srv, ingress: true, egress: true},
		{name: "ipBlock: a host in it", pols: []*networkingv1.NetworkPolicy{block}, from: host("10.0.9.1", ""), to: srv, ingress: true, egress: true},
		{name: "ipBlock: except", pols: []*networkingv1.NetworkPolicy{block}, from: cliB, to: srv, egress: true, isoIn: []string{"block"}},
		{name: "ipBlock: outside", pols: []*networkingv1.NetworkPolicy{block}, from: host("10.1.0.1", ""), to: srv, egress: true, isoIn: []string{"block"}},
		{name: "ipBlock: other family", pols: []*networkingv1.NetworkPolicy{block}, from: host("fd00::1", ""), to: srv, egress: true, isoIn: []string{"block"}},
		{name: "ipBlock: no IP", pols: []*networkingv1.NetworkPolicy{block}, from: netpol.Peer{Node: "node-x"}, to: srv, egress: true, isoIn: []string{"block"}},
		{name: "egress to an ipBlock", pols: []*networkingv1.NetworkPolicy{pol("out", "team-a", all, egr, nil, []networkingv1.NetworkPolicyEgressRule{{To: []networkingv1.NetworkPolicyPeer{{IPBlock: &networkingv1.IPBlock{CIDR: "192.168.0.0/16"}}}}})}, from: cliA, to: host("192.168.7.7", "node-b"), ingress: true, egress: true},
		{name: "egress to an ipBlock: outside", pols: []*networkingv1.NetworkPolicy{pol("out", "team-a", all, egr, nil, []networkingv1.NetworkPolicyEgressRule{{To: []networkingv1.NetworkPolicyPeer{{IPBlock: &networkingv1.IPBlock{CIDR: "192.168.0.0/16"}}}}})}, from: cliA, to: srv, ingress: true, isoEg: []string{"out"}},
	})
}

func TestPorts(t *testing.T) {
	ports := func(name string, ps ...networkingv1.NetworkPolicyPort) *networkingv1.NetworkPolicy {
		return pol(name, "srv", all, ing, []networkingv1.NetworkPolicyIngressRule{{Ports: ps}}, nil)
	}
	p7000 := ports("p7000", port(nil, intstr.FromInt32(7000), nil))
	tcp7000 := ports("tcp7000", port(&tcp, intstr.FromInt32(7000), nil))
	udp7000 := ports("udp7000", port(&udp, intstr.FromInt32(7000), nil))
	sctpAll := ports("sctp", networkingv1.NetworkPolicyPort{Protocol: &sctp})
	tcpAll := ports("tcp", networkingv1.NetworkPolicyPort{Protocol: &tcp})
	rng := ports("range", port(&tcp, intstr.FromInt32(7000), ptr[int32](7100)))
	named := ports("named", port(nil, intstr.FromString("rdma"), nil))
	namedUDP := ports("named-udp", port(nil, intstr.FromString("stats"), nil))
	namedRange := ports("named-range", port(nil, intstr.FromString("rdma"), ptr[int32](7100)))
	run(t, []check{
		{name: "port: equal", pols: []*networkingv1.NetworkPolicy{p7000}, from: cliA, to: srv, ingress: true, egress: true},
		{name: "port: other", pols: []*networkingv1.NetworkPolicy{p7000}, from: cliA, to: srv, port: 7001, egress: true, isoIn: []string{"p7000"}},
		{name: "port: TCP", pols: []*networkingv1.NetworkPolicy{tcp7000}, from: cliA, to: srv, ingress: true, egress: true},
		{name: "port: UDP matches no vconn", pols: []*networkingv1.NetworkPolicy{udp7000}, from: cliA, to: srv, egress: true, isoIn: []string{"udp7000"}},
		{name: "protocol SCTP, every port: no vconn", pols: []*networkingv1.NetworkPolicy{sctpAll}, from: cliA, to: srv, egress: true, isoIn: []string{"sctp"}},
		{name: "protocol TCP, every port", pols: []*networkingv1.NetworkPolicy{tcpAll}, from: cliA, to: srv, port: 1, ingress: true, egress: true},
		{name: "range: low end", pols: []*networkingv1.NetworkPolicy{rng}, from: cliA, to: srv, port: 7000, ingress: true, egress: true},
		{name: "range: high end", pols: []*networkingv1.NetworkPolicy{rng}, from: cliA, to: srv, port: 7100, ingress: true, egress: true},
		{name: "range: below", pols: []*networkingv1.NetworkPolicy{rng}, from: cliA, to: srv, port: 6999, egress: true, isoIn: []string{"range"}},
		{name: "range: above", pols: []*networkingv1.NetworkPolicy{rng}, from: cliA, to: srv, port: 7101, egress: true, isoIn: []string{"range"}},
		{name: "named: the pod's port", pols: []*networkingv1.NetworkPolicy{named}, from: cliA, to: srv, ingress: true, egress: true},
		{name: "named: another port", pols: []*networkingv1.NetworkPolicy{named}, from: cliA, to: srv, port: 7001, egress: true, isoIn: []string{"named"}},
		{name: "named: a UDP container port", pols: []*networkingv1.NetworkPolicy{namedUDP}, from: cliA, to: srv, port: 7001, egress: true, isoIn: []string{"named-udp"}},
		{name: "named with endPort: invalid", pols: []*networkingv1.NetworkPolicy{namedRange}, from: cliA, to: srv, egress: true, isoIn: []string{"named-range"}},
		{name: "egress named port: the destination's", pols: []*networkingv1.NetworkPolicy{pol("out", "team-a", all, egr, nil, []networkingv1.NetworkPolicyEgressRule{{Ports: []networkingv1.NetworkPolicyPort{port(nil, intstr.FromString("rdma"), nil)}}})}, from: cliA, to: srv, ingress: true, egress: true},
		{name: "egress named port: a host has none", pols: []*networkingv1.NetworkPolicy{pol("out", "team-a", all, egr, nil, []networkingv1.NetworkPolicyEgressRule{{Ports: []networkingv1.NetworkPolicyPort{port(nil, intstr.FromString("rdma"), nil)}}})}, from: cliA, to: host("192.168.0.2", "node-b"), ingress: true, isoEg: []string{"out"}},
	})
}

func TestUnion(t *testing.T) {
	nsA := pol("from-a", "srv", all, ing, from(networkingv1.NetworkPolicyPeer{NamespaceSelector: sel("team", "a")}), nil)
	p9000 := pol("p9000", "srv", all, ing, []networkingv1.NetworkPolicyIngressRule{{Ports: []networkingv1.NetworkPolicyPort{port(nil, intstr.FromInt32(9000), nil)}}}, nil)
	both := pol("both", "srv", all, ing, []networkingv1.NetworkPolicyIngressRule{{From: []networkingv1.NetworkPolicyPeer{{NamespaceSelector: sel("team", "b")}}, Ports: []networkingv1.NetworkPolicyPort{port(nil, intstr.FromInt32(8000), nil)}}}, nil)
	pols := []*networkingv1.NetworkPolicy{nsA, p9000, both}
	run(t, []check{
		{name: "first policy's rule", pols: pols, from: cliA, to: srv, ingress: true, egress: true},
		{name: "second policy's rule", pols: pols, from: cliB, to: srv, port: 9000, ingress: true, egress: true},
		{name: "a rule's from and ports together", pols: pols, from: cliB, to: srv, port: 8000, ingress: true, egress: true},
		{name: "from without its ports", pols: pols, from: cliB, to: srv, port: 7000, egress: true, isoIn: []string{"from-a", "p9000", "both"}},
	})
}

func TestInvalidFailsClosed(t *testing.T) {
	bogus := metav1.LabelSelector{MatchExpressions: []metav1.LabelSelectorRequirement{{Key: "app", Operator: "Bogus"}}}
	run(t, []check{
		{name: "invalid podSelector isolates", pols: []*networkingv1.NetworkPolicy{pol("bad", "srv", bogus, ing, []networkingv1.NetworkPolicyIngressRule{{From: []networkingv1.NetworkPolicyPeer{{PodSelector: &bogus}}}}, nil)}, from: peerSrv, to: srv, egress: true, isoIn: []string{"bad"}},
		{name: "empty peer matches nothing", pols: []*networkingv1.NetworkPolicy{pol("empty", "srv", all, ing, from(networkingv1.NetworkPolicyPeer{}), nil)}, from: peerSrv, to: srv, egress: true, isoIn: []string{"empty"}},
		{name: "ipBlock with a selector matches nothing", pols: []*networkingv1.NetworkPolicy{pol("mixed", "srv", all, ing, from(networkingv1.NetworkPolicyPeer{IPBlock: &networkingv1.IPBlock{CIDR: "0.0.0.0/0"}, PodSelector: &all}), nil)}, from: cliA, to: srv, egress: true, isoIn: []string{"mixed"}},
		{name: "unparsable CIDR", pols: []*networkingv1.NetworkPolicy{pol("cidr", "srv", all, ing, from(networkingv1.NetworkPolicyPeer{IPBlock: &networkingv1.IPBlock{CIDR: "10.0.0.0/99"}}), nil)}, from: cliA, to: srv, egress: true, isoIn: []string{"cidr"}},
		{name: "unparsable except", pols: []*networkingv1.NetworkPolicy{pol("except", "srv", all, ing, from(networkingv1.NetworkPolicyPeer{IPBlock: &networkingv1.IPBlock{CIDR: "10.0.0.0/8", Except: []string{"x"}}}), nil)}, from: cliA, to: srv, egress: true, isoIn: []string{"except"}},
		{name: "matchExpressions", pols: []*networkingv1.NetworkPolicy{pol("expr", "srv", all, ing, from(networkingv1.NetworkPolicyPeer{NamespaceSelector: &metav1.LabelSelector{MatchExpressions: []metav1.LabelSelectorRequirement{{Key: "team", Operator: metav1.LabelSelectorOpIn, Values: []string{"a", "c"}}}}}), nil)}, from: cliA, to: srv, ingress: true, egress: true},
		{name: "matchExpressions: not in", pols: []*networkingv1.NetworkPolicy{pol("expr", "srv", all, ing, from(networkingv1.NetworkPolicyPeer{NamespaceSelector: &metav1.LabelSelector{MatchExpressions: []metav1.LabelSelectorRequirement{{Key: "team", Operator: metav1.LabelSelectorOpIn, Values: []string{"a", "c"}}}}}), nil)}, from: cliB, to: srv, egress: true, isoIn: []string{"expr"}},
	})
}

// TestRefusalMessage: the error names every isolating policy, the pod, the
// direction and the peer.
func TestRefusalMessage(t *testing.T) {
	c := &netpol.Static{List: []*networkingv1.NetworkPolicy{pol("a", "srv", all, ing, nil, nil), pol("b", "srv", all, ing, nil, nil)}}
	conn := netpol.Conn{From: cliA, To: srv, Port: 7000}
	err := netpol.Ingress(c, conn).Err(conn)
	want := "NetworkPolicies a, b of namespace srv isolate pod srv/echo for ingress and allow nothing from pod team-a/cli (10.0.2.10) on port 7000"
	if err == nil || err.Error() != want {
		t.Errorf("refusal %q, want %q", err, want)
	}
}
