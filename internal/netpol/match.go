package netpol

import (
	"net/netip"

	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/util/intstr"
)

// nameLabel is the label the API server sets on every namespace, its
// name: a namespaceSelector may select a namespace by it even before its
// labels are known.
const nameLabel = "kubernetes.io/metadata.name"

// nsLabels is a namespace's labels with nameLabel, without a copy.
type nsLabels struct {
	name string
	m    map[string]string
}

func (n nsLabels) Has(k string) bool {
	_, ok := n.m[k]
	return ok || k == nameLabel
}

func (n nsLabels) Get(k string) string {
	v, _ := n.Lookup(k)
	return v
}

func (n nsLabels) Lookup(k string) (string, bool) {
	if k == nameLabel {
		return n.name, true
	}
	v, ok := n.m[k]
	return v, ok
}

// matches reports whether sel matches l; ok is false when sel is invalid
// (and then it matches nothing).
func matches(sel *metav1.LabelSelector, l labels.Labels) (match, ok bool) {
	s, err := metav1.LabelSelectorAsSelector(sel)
	if err != nil {
		return false, false
	}
	return s.Matches(l), true
}

// peersMatch reports whether a rule's peers (from or to) of a policy of
// namespace ns match peer: all peers when the rule names none.
func peersMatch(c Cluster, ns string, peers []networkingv1.NetworkPolicyPeer, peer Peer) bool {
	if len(peers) == 0 {
		return true
	}
	for i := range peers {
		if peerMatches(c, ns, &peers[i], peer) {
			return true
		}
	}
	return false
}

// peerMatches reports whether one NetworkPolicyPeer of a policy of
// namespace ns matches peer: an ipBlock its IP; a podSelector the pods of
// ns; a namespaceSelector every pod of the namespaces it selects; both,
// the pods podSelector selects in those namespaces.
func peerMatches(c Cluster, ns string, np *networkingv1.NetworkPolicyPeer, peer Peer) bool {
	if np.IPBlock != nil {
		if np.PodSelector != nil || np.NamespaceSelector != nil {
			return false // the API server refuses it
		}
		return inBlock(np.IPBlock, peer.ip())
	}
	pod := peer.Pod
	if pod == nil || (np.PodSelector == nil && np.NamespaceSelector == nil) {
		return false
	}
	if np.NamespaceSelector == nil {
		if pod.Namespace != ns {
			return false
		}
	} else if m, _ := matches(np.NamespaceSelector, nsLabels{name: pod.Namespace, m: c.NamespaceLabels(pod.Namespace)}); !m {
		return false
	}
	if np.PodSelector == nil {
		return true
	}
	m, _ := matches(np.PodSelector, labels.Set(pod.Labels))
	return m
}

// inBlock reports whether ip is in b's CIDR and none of its excepts.
func inBlock(b *networkingv1.IPBlock, ip netip.Addr) bool {
	if !ip.IsValid() {
		return false
	}
	cidr, err := netip.ParsePrefix(b.CIDR)
	if err != nil || !cidr.Contains(ip) {
		return false
	}
	for _, e := range b.Except {
		x, err := netip.ParsePrefix(e)
		if err != nil || x.Contains(ip) {
			return false // an unparsable except fails closed
		}
	}
	return true
}

// portsMatch reports whether a rule's ports match TCP port port of dst
// (nil: no pod, which has no named ports): all ports when the rule names
// none.
func portsMatch(ports []networkingv1.NetworkPolicyPort, dst *Pod, port int32) bool {
	if len(ports) == 0 {
		return true
	}
	for i := range ports {
		if portMatches(&ports[i], dst, port) {
			return true
		}
	}
	return false
}

func portMatches(p *networkingv1.NetworkPolicyPort, dst *Pod, port int32) bool {
	if p.Protocol != nil && *p.Protocol != corev1.ProtocolTCP {
		return false // a vconn is TCP's (the package's doc); nil is TCP
	}
	switch {
	case p.Port == nil:
		return true
	case p.Port.Type == intstr.Int && p.EndPort != nil:
		return p.Port.IntVal <= port && port <= *p.EndPort
	case p.Port.Type == intstr.Int:
		return p.Port.IntVal == port
	case p.EndPort != nil || dst == nil:
		return false // endPort on a name: refused by the API server
	}
	for _, cp := range dst.Ports {
		if cp.Name == p.Port.StrVal && cp.ContainerPort == port && (cp.Protocol == "" || cp.Protocol == corev1.ProtocolTCP) {
			return true
		}
	}
	return false
}
