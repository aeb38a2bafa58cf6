package netpol_test

import (
	"net/netip"
	"testing"

	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"

	"github.com/rdmavisor/rdmavisor/internal/netpol"
)

// bytesOf hands out a fuzz input a piece at a time, zeros past its end.
type bytesOf struct{ b []byte }

func (r *bytesOf) n(max int) int {
	if len(r.b) == 0 {
		return 0
	}
	v := int(r.b[0]) % max
	r.b = r.b[1:]
	return v
}

// words are the fuzz's label keys and values: a few valid, a few the API
// server refuses.
var words = []string{"", "a", "b", "team", "kubernetes.io/metadata.name", "srv", "-bad-", "x/y/z", "UPPER", "a b"}

func (r *bytesOf) word() string { return words[r.n(len(words))] }

func (r *bytesOf) labels() map[string]string {
	if r.n(4) == 0 {
		return nil
	}
	m := map[string]string{}
	for range r.n(4) {
		m[r.word()] = r.word()
	}
	return m
}

var ops = []metav1.LabelSelectorOperator{metav1.LabelSelectorOpIn, metav1.LabelSelectorOpNotIn, metav1.LabelSelectorOpExists, metav1.LabelSelectorOpDoesNotExist, "Bogus", ""}

func (r *bytesOf) selector() *metav1.LabelSelector {
	if r.n(3) == 0 {
		return nil
	}
	s := &metav1.LabelSelector{MatchLabels: r.labels()}
	for range r.n(3) {
		req := metav1.LabelSelectorRequirement{Key: r.word(), Operator: ops[r.n(len(ops))]}
		for range r.n(3) {
			req.Values = append(req.Values, r.word())
		}
		s.MatchExpressions = append(s.MatchExpressions, req)
	}
	return s
}

var cidrs = []string{"10.0.0.0/8", "10.0.1.0/24", "0.0.0.0/0", "::/0", "fd00::/8", "bogus", "10.0.0.1/33", ""}

func (r *bytesOf) peers() []networkingv1.NetworkPolicyPeer {
	var out []networkingv1.NetworkPolicyPeer
	for range r.n(3) {
		p := networkingv1.NetworkPolicyPeer{PodSelector: r.selector(), NamespaceSelector: r.selector()}
		if r.n(3) == 0 {
			p.IPBlock = &networkingv1.IPBlock{CIDR: cidrs[r.n(len(cidrs))]}
			for range r.n(3) {
				p.IPBlock.Except = append(p.IPBlock.Except, cidrs[r.n(len(cidrs))])
			}
		}
		out = append(out, p)
	}
	return out
}

var protos = []corev1.Protocol{corev1.ProtocolTCP, corev1.ProtocolUDP, corev1.ProtocolSCTP, "", "ICMP"}

func (r *bytesOf) ports() []networkingv1.NetworkPolicyPort {
	var out []networkingv1.NetworkPolicyPort
	for range r.n(3) {
		var p networkingv1.NetworkPolicyPort
		if r.n(2) == 0 {
			p.Protocol = &protos[r.n(len(protos))]
		}
		switch r.n(3) {
		case 0:
			v := intstr.FromInt32(int32(r.n(256)) * 64)
			p.Port = &v
		case 1:
			v := intstr.FromString(r.word())
			p.Port = &v
		}
		if r.n(2) == 0 {
			e := int32(r.n(256)) * 64
			p.EndPort = &e
		}
		out = append(out, p)
	}
	return out
}

var namespaces = []string{"srv", "team-a", ""}

func (r *bytesOf) policy(i int) *networkingv1.NetworkPolicy {
	p := &networkingv1.NetworkPolicy{ObjectMeta: metav1.ObjectMeta{Name: string(rune('a' + i)), Namespace: namespaces[r.n(len(namespaces))]}}
	if s := r.selector(); s != nil {
		p.Spec.PodSelector = *s
	}
	for range r.n(3) {
		p.Spec.PolicyTypes = append(p.Spec.PolicyTypes, []networkingv1.PolicyType{"Ingress", "Egress", "Other"}[r.n(3)])
	}
	for range r.n(3) {
		p.Spec.Ingress = append(p.Spec.Ingress, networkingv1.NetworkPolicyIngressRule{From: r.peers(), Ports: r.ports()})
	}
	for range r.n(3) {
		p.Spec.Egress = append(p.Spec.Egress, networkingv1.NetworkPolicyEgressRule{To: r.peers(), Ports: r.ports()})
	}
	return p
}

func (r *bytesOf) peer() netpol.Peer {
	ips := []string{"10.0.1.10", "10.0.2.10", "fd00::1", "192.168.0.1"}
	if r.n(3) == 0 {
		p := netpol.Peer{Node: []string{"", "node-a"}[r.n(2)]}
		if r.n(2) == 0 {
			p.IP = netip.MustParseAddr(ips[r.n(len(ips))])
		}
		return p
	}
	pod := &netpol.Pod{Namespace: namespaces[r.n(len(namespaces))], Name: r.word(), Labels: r.labels(), Node: "node-a"}
	if r.n(2) == 0 {
		pod.IP = netip.MustParseAddr(ips[r.n(len(ips))])
	}
	for range r.n(3) {
		pod.Ports = append(pod.Ports, corev1.ContainerPort{Name: r.word(), ContainerPort: int32(r.n(256)) * 64, Protocol: protos[r.n(len(protos))]})
	}
	return netpol.Peer{Pod: pod}
}

// FuzzDecide feeds random policies, label sets and selectors (valid or
// not) and connections: no panic, and every verdict is consistent (a
// refusal names its policies and errs; an allowance does not err).
func FuzzDecide(f *testing.F) {
	f.Add([]byte{1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20})
	f.Add([]byte{255, 0, 255, 0, 3, 3, 3, 3, 2, 2, 2, 2, 1, 1, 1, 1})
	f.Fuzz(func(t *testing.T, b []byte) {
		r := &bytesOf{b: b}
		c := &netpol.Static{Namespaces: map[string]map[string]string{"srv": r.labels(), "team-a": r.labels()}}
		for i := range r.n(4) {
			c.List = append(c.List, r.policy(i))
		}
		conn := netpol.Conn{From: r.peer(), To: r.peer(), Port: int32(r.n(256)) * 64}
		d := netpol.Decide(c, conn)
		for _, v := range []netpol.Verdict{d.Ingress, d.Egress} {
			err := v.Err(conn)
			if v.Allowed != (err == nil) || v.Allowed != (len(v.Isolating) == 0) {
				t.Fatalf("%s: allowed %v, isolating %v, err %v", v.Dir, v.Allowed, v.Isolating, err)
			}
			if err != nil {
				_ = err.Error()
			}
		}
	})
}
