package rdmanode

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"strings"

	"github.com/go-logr/logr"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/cache"

	"github.com/rdmavisor/rdmavisor/internal/netpol"
)

// errNotListed: a check before the informers listed their objects
// refuses, rather than allow what a policy may forbid.
var errNotListed = errors.New("the cluster's NetworkPolicies, namespaces and pods are not listed yet")

// Policies is the cluster's NetworkPolicies and Namespaces (their labels),
// through informers, with PodIPs' pods: the state vconn dials are checked
// against (package netpol). It implements agent.Policy and netpol.Cluster.
type Policies struct {
	pods      *PodIPs
	pols, nss cache.SharedIndexInformer
}

// NewPolicies starts the informers of kube's NetworkPolicies and
// Namespaces; they run until ctx ends. pods gives the pods.
func NewPolicies(ctx context.Context, kube kubernetes.Interface, pods *PodIPs, log logr.Logger) (*Policies, error) {
	f := informers.NewSharedInformerFactoryWithOptions(kube, 0, informers.WithTransform(slimPolicy))
	p := &Policies{pods: pods, pols: f.Networking().V1().NetworkPolicies().Informer(), nss: f.Core().V1().Namespaces().Informer()}
	for what, inf := range map[string]cache.SharedIndexInformer{"NetworkPolicies": p.pols, "namespaces": p.nss} {
		if err := inf.SetWatchErrorHandler(func(_ *cache.Reflector, err error) {
			log.Error(err, "Watching "+what+" for the vconns' NetworkPolicies; retrying")
		}); err != nil {
			return nil, fmt.Errorf("rdmanode: %s informer: %w", what, err)
		}
	}
	f.Start(ctx.Done())
	return p, nil
}

// slimPolicy keeps of a NetworkPolicy its name and spec, of a Namespace
// its name and labels: no annotations (kubectl's last-applied copy) nor
// managed fields in the cache.
func slimPolicy(obj any) (any, error) {
	switch o := obj.(type) {
	case *networkingv1.NetworkPolicy:
		return &networkingv1.NetworkPolicy{ObjectMeta: metav1.ObjectMeta{Name: o.Name, Namespace: o.Namespace, UID: o.UID,
			ResourceVersion: o.ResourceVersion}, Spec: o.Spec}, nil
	case *corev1.Namespace:
		return &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: o.Name, UID: o.UID, Labels: o.Labels,
			ResourceVersion: o.ResourceVersion}}, nil
	}
	return obj, nil // a tombstone
}

// HasSynced reports whether the policies, namespaces and pods were listed.
func (p *Policies) HasSynced() bool {
	return p.pols.HasSynced() && p.nss.HasSynced() && p.pods.HasSynced()
}

// Policies returns namespace ns's NetworkPolicies, by name: a refusal
// names them in a stable order.
func (p *Policies) Policies(ns string) []*networkingv1.NetworkPolicy {
	objs, err := p.pols.GetIndexer().ByIndex(cache.NamespaceIndex, ns)
	if err != nil {
		return nil
	}
	out := make([]*networkingv1.NetworkPolicy, 0, len(objs))
	for _, o := range objs {
		if np, ok := o.(*networkingv1.NetworkPolicy); ok {
			out = append(out, np)
		}
	}
	slices.SortFunc(out, func(a, b *networkingv1.NetworkPolicy) int { return strings.Compare(a.Name, b.Name) })
	return out
}

// NamespaceLabels returns namespace ns's labels; nil if not known.
func (p *Policies) NamespaceLabels(ns string) map[string]string {
	o, ok, err := p.nss.GetStore().GetByKey(ns)
	if err != nil || !ok {
		return nil
	}
	n, _ := o.(*corev1.Namespace)
	if n == nil {
		return nil
	}
	return n.Labels
}

// Ingress is nil when the NetworkPolicies of pod to's namespace let a
// dial from from reach it on port; else an error naming them
// (*netpol.Refusal), or why it cannot be told.
func (p *Policies) Ingress(from, to netpol.Endpoint, port uint32) error {
	return p.check(netpol.Ingress, to.Pod, from, to, port)
}

// Egress is nil when the NetworkPolicies of pod from's namespace let it
// dial to on port; else an error naming them (*netpol.Refusal), or why it
// cannot be told.
func (p *Policies) Egress(from, to netpol.Endpoint, port uint32) error {
	return p.check(netpol.Egress, from.Pod, from, to, port)
}

// check decides one direction for pod ("namespace/name"), one end of
// from → to. A namespace without policies passes at once: no lookup.
func (p *Policies) check(decide func(netpol.Cluster, netpol.Conn) netpol.Verdict, pod string, from, to netpol.Endpoint, port uint32) error {
	if !p.HasSynced() {
		return errNotListed
	}
	ns, _, _ := strings.Cut(pod, "/")
	if pod == "" || len(p.Policies(ns)) == 0 {
		return nil
	}
	src, err := p.peer(from)
	if err != nil {
		return err
	}
	dst, err := p.peer(to)
	if err != nil {
		return err
	}
	conn := netpol.Conn{From: src, To: dst, Port: int32(min(port, 1<<16))}
	return decide(p, conn).Err(conn)
}

// peer is what the API server says e is: the pod it names, or the pod
// that has its IP; else a host with that IP.
func (p *Policies) peer(e netpol.Endpoint) (netpol.Peer, error) {
	var pod *corev1.Pod
	switch {
	case e.Pod != "":
		if pod = p.pods.podNamed(e.Pod); pod == nil {
			return netpol.Peer{}, fmt.Errorf("pod %s is not among the API server's pods (yet): its NetworkPolicies cannot be checked", e.Pod)
		}
	case e.IP.IsValid():
		pod = p.pods.podOf(e.IP)
	}
	if pod == nil {
		return netpol.Peer{IP: e.IP, Node: e.Node}, nil
	}
	np := &netpol.Pod{Namespace: pod.Namespace, Name: pod.Name, Labels: pod.Labels, IP: e.IP, Node: pod.Spec.NodeName}
	for _, c := range pod.Spec.Containers {
		np.Ports = append(np.Ports, c.Ports...)
	}
	if !np.IP.IsValid() && len(pod.Status.PodIPs) > 0 {
		np.IP, _ = netip.ParseAddr(pod.Status.PodIPs[0].IP)
	}
	return netpol.Peer{Pod: np}, nil
}
