package rdmanode

import (
	"context"
	"errors"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/go-logr/logr"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/client-go/kubernetes/fake"
	"k8s.io/client-go/tools/cache"

	"github.com/rdmavisor/rdmavisor/internal/netpol"
	"github.com/rdmavisor/rdmavisor/internal/poll"
)

func nsPod(ns, name, node, ip string, labels map[string]string, ports ...corev1.ContainerPort) *corev1.Pod {
	p := pod(name, node, corev1.PodRunning, false, ip)
	p.Namespace, p.Labels = ns, labels
	p.Spec.Containers = []corev1.Container{{Name: "main", Image: "x", Ports: ports}}
	return p
}

// TestPolicies: the agent's checks read the cluster through the informers:
// a deny-all ingress policy refuses a pod of another namespace, naming the
// policy; an allow rule by namespace label (the namespace's, from its
// informer) and a named port (the destination's container port, kept by
// PodIPs' slimming) admits it, as the policies change; an egress deny on
// the client refuses; a namespace without policies passes without the
// pod being known.
func TestPolicies(t *testing.T) {
	kube := fake.NewClientset(
		&corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "srv"}},
		&corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "cli", Labels: map[string]string{"team": "a"}, Annotations: map[string]string{"big": "x"}}},
		nsPod("srv", "echo", "node-b", "10.244.1.10", map[string]string{"app": "echo"}, corev1.ContainerPort{Name: "rdma", ContainerPort: 7000}),
		nsPod("cli", "c", "node-a", "10.244.0.10", nil),
		&networkingv1.NetworkPolicy{ObjectMeta: metav1.ObjectMeta{Name: "deny-all", Namespace: "srv"},
			Spec: networkingv1.NetworkPolicySpec{PolicyTypes: []networkingv1.PolicyType{networkingv1.PolicyTypeIngress}}},
	)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	pods, err := NewPodIPs(ctx, kube, logr.Discard())
	if err != nil {
		t.Fatal(err)
	}
	p, err := NewPolicies(ctx, kube, pods, logr.Discard())
	if err != nil {
		t.Fatal(err)
	}
	if !cache.WaitForCacheSync(ctx.Done(), p.HasSynced) {
		t.Fatal("not synced")
	}
	from := netpol.Endpoint{IP: netip.MustParseAddr("10.244.0.10"), Node: "node-a"}
	to := netpol.Endpoint{Pod: "srv/echo", IP: netip.MustParseAddr("10.244.1.10"), Node: "node-b"}
	var r *netpol.Refusal
	if err := p.Ingress(from, to, 7000); !errors.As(err, &r) || !strings.Contains(err.Error(), "deny-all") || !strings.Contains(err.Error(), "cli/c") {
		t.Fatalf("ingress under deny-all: %v, want a refusal naming deny-all and the client pod", err)
	}
	if err := p.Ingress(from, netpol.Endpoint{Pod: "srv/nobody"}, 7000); err == nil || errors.As(err, &r) {
		t.Errorf("ingress to a pod the API server has not listed: %v, want an error (fail closed)", err)
	}
	if err := p.Ingress(from, netpol.Endpoint{Pod: "other/nobody"}, 7000); err != nil {
		t.Errorf("ingress in a namespace without policies: %v", err)
	}
	tcp := corev1.ProtocolTCP
	named := intstr.FromString("rdma")
	allow := &networkingv1.NetworkPolicy{ObjectMeta: metav1.ObjectMeta{Name: "allow-team-a", Namespace: "srv"},
		Spec: networkingv1.NetworkPolicySpec{PodSelector: metav1.LabelSelector{MatchLabels: map[string]string{"app": "echo"}},
			Ingress: []networkingv1.NetworkPolicyIngressRule{{
				From:  []networkingv1.NetworkPolicyPeer{{NamespaceSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"team": "a"}}}},
				Ports: []networkingv1.NetworkPolicyPort{{Protocol: &tcp, Port: &named}}}}}}
	if _, err := kube.NetworkingV1().NetworkPolicies("srv").Create(ctx, allow, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	poll.Until(t, 20*time.Second, "the allow rule admits the client on the named port", func() bool { return p.Ingress(from, to, 7000) == nil })
	if err := p.Ingress(from, to, 7001); !errors.As(err, &r) || !strings.Contains(err.Error(), "allow-team-a, deny-all") {
		t.Errorf("ingress on a port the rule does not name: %v, want a refusal naming both policies", err)
	}
	deny := &networkingv1.NetworkPolicy{ObjectMeta: metav1.ObjectMeta{Name: "no-egress", Namespace: "cli"},
		Spec: networkingv1.NetworkPolicySpec{PolicyTypes: []networkingv1.PolicyType{networkingv1.PolicyTypeEgress}}}
	if _, err := kube.NetworkingV1().NetworkPolicies("cli").Create(ctx, deny, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	cli := netpol.Endpoint{Pod: "cli/c", IP: netip.MustParseAddr("10.244.0.10"), Node: "node-a"}
	poll.Until(t, 20*time.Second, "the egress deny refuses", func() bool { return errors.As(p.Egress(cli, to, 7000), &r) })
	if err := p.Egress(cli, to, 7000); !strings.Contains(err.Error(), "no-egress") {
		t.Errorf("egress refusal %q names no no-egress", err)
	}
	if got := p.NamespaceLabels("cli"); got["team"] != "a" {
		t.Errorf("namespace labels %v", got)
	}
}

// TestSlimPolicy: the caches keep of namespaces and policies what a
// decision reads, and no annotations.
func TestSlimPolicy(t *testing.T) {
	o, _ := slimPolicy(&corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "n", Labels: map[string]string{"a": "b"}, Annotations: map[string]string{"big": "x"}}})
	if n := o.(*corev1.Namespace); n.Name != "n" || n.Labels["a"] != "b" || n.Annotations != nil {
		t.Errorf("slim namespace %+v", n.ObjectMeta)
	}
	o, _ = slimPolicy(&networkingv1.NetworkPolicy{ObjectMeta: metav1.ObjectMeta{Name: "p", Namespace: "n", Annotations: map[string]string{"big": "x"}},
		Spec: networkingv1.NetworkPolicySpec{PolicyTypes: []networkingv1.PolicyType{networkingv1.PolicyTypeEgress}}})
	if np := o.(*networkingv1.NetworkPolicy); np.Name != "p" || np.Namespace != "n" || np.Annotations != nil || len(np.Spec.PolicyTypes) != 1 {
		t.Errorf("slim policy %+v", np)
	}
	sp, _ := slimPod(nsPod("n", "p", "node", "10.0.0.1", nil, corev1.ContainerPort{Name: "rdma", ContainerPort: 7000, HostPort: 7000}))
	if c := sp.(*corev1.Pod).Spec.Containers; len(c) != 1 || len(c[0].Ports) != 1 || c[0].Ports[0].Name != "rdma" || c[0].Ports[0].HostPort != 0 || c[0].Image != "" {
		t.Errorf("slim pod's containers %+v", c)
	}
}

// TestPoliciesNotListed: before the informers listed the cluster, a check
// refuses (fails closed) rather than allow what a policy may forbid.
func TestPoliciesNotListed(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	cancel() // the informers never list
	kube := fake.NewClientset()
	pods, err := NewPodIPs(ctx, kube, logr.Discard())
	if err != nil {
		t.Fatal(err)
	}
	p, err := NewPolicies(ctx, kube, pods, logr.Discard())
	if err != nil {
		t.Fatal(err)
	}
	e := netpol.Endpoint{Pod: "ns/p"}
	if err := p.Ingress(netpol.Endpoint{}, e, 1); !errors.Is(err, errNotListed) {
		t.Errorf("ingress before the lists: %v, want errNotListed", err)
	}
	if err := p.Egress(e, netpol.Endpoint{}, 1); !errors.Is(err, errNotListed) {
		t.Errorf("egress before the lists: %v, want errNotListed", err)
	}
}
