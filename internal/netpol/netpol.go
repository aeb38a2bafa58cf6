// Package netpol decides whether the cluster's networking.k8s.io/v1
// NetworkPolicies allow a connection, with Kubernetes' semantics, as a CNI
// plugin enforcing them does for IP: the agents apply it to vconn dials,
// which flow agent to agent over shared QPs and never meet the CNI's
// rules. It is pure: the caller gives it the cluster's state (Cluster).
//
// Choices where the API leaves room, or where a vconn is not IP:
//   - A vconn port is TCP's: a rule's port of protocol UDP or SCTP matches
//     no vconn (a vconn is a reliable stream or message channel, which
//     policies written for TCP services mean to govern).
//   - A named port is resolved against the destination pod's container
//     ports (protocol TCP); a destination that is no pod has none, so a
//     named port matches nothing there.
//   - ipBlock applies to the peer's IP, a pod's as well as a host's.
//   - The two exceptions the documentation states hold: a pod can always
//     reach itself, and a node's hosts can always reach the pods on it
//     (and those pods them).
//   - What the API server refuses (an invalid selector, a peer of both
//     ipBlock and selectors, or of none, endPort on a named port, an
//     unparsable CIDR) fails closed: it allows nothing, and an invalid
//     podSelector of a policy selects every pod of its namespace.
package netpol

import (
	"net/netip"

	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	"k8s.io/apimachinery/pkg/labels"
)

// Cluster is what a decision reads of the cluster's state.
type Cluster interface {
	// Policies returns the NetworkPolicies of namespace ns.
	Policies(ns string) []*networkingv1.NetworkPolicy
	// NamespaceLabels returns the labels of namespace ns (nil if it is
	// not known).
	NamespaceLabels(ns string) map[string]string
}

// Pod is what a decision reads of a pod.
type Pod struct {
	Namespace, Name string
	Labels          map[string]string
	IP              netip.Addr
	Node            string
	// Ports are its containers' ports, which named ports resolve against.
	Ports []corev1.ContainerPort
}

// Peer is one end of a connection: a pod, or (Pod nil) a host known by
// its IP alone (invalid when unknown: it matches no ipBlock), and the node
// it is if it is one.
type Peer struct {
	Pod  *Pod
	IP   netip.Addr
	Node string
}

// ip is the peer's IP, which ipBlocks match.
func (p Peer) ip() netip.Addr {
	if p.Pod != nil {
		return p.Pod.IP.Unmap()
	}
	return p.IP.Unmap()
}

// Conn is a connection to port Port (TCP's; see the package's doc).
type Conn struct {
	From, To Peer
	Port     int32
}

// Direction is a policy type: which end of a connection a verdict is for.
type Direction = networkingv1.PolicyType

// Verdict is one direction's decision.
type Verdict struct {
	Dir     Direction
	Allowed bool
	// Pod is the pod ("namespace/name") the verdict is for; "" when the
	// end is no pod (then it is allowed: policies govern pods).
	Pod string
	// Isolating names the policies of the pod's namespace that select it
	// for Dir, in their order, when the verdict refuses.
	Isolating []string
}

// Decision is both directions' verdicts: a connection passes when both
// allow it.
type Decision struct {
	Ingress, Egress Verdict
}

// Allowed reports whether both directions allow the connection.
func (d Decision) Allowed() bool { return d.Ingress.Allowed && d.Egress.Allowed }

// Decide returns both directions' verdicts of conn.
func Decide(c Cluster, conn Conn) Decision {
	return Decision{Ingress: Ingress(c, conn), Egress: Egress(c, conn)}
}

// Ingress decides whether the destination pod's ingress allows conn.
func Ingress(c Cluster, conn Conn) Verdict {
	return decide(c, conn, networkingv1.PolicyTypeIngress, conn.To, conn.From,
		func(p *networkingv1.NetworkPolicy, i int) ([]networkingv1.NetworkPolicyPeer, []networkingv1.NetworkPolicyPort, bool) {
			if i >= len(p.Spec.Ingress) {
				return nil, nil, false
			}
			return p.Spec.Ingress[i].From, p.Spec.Ingress[i].Ports, true
		})
}

// Egress decides whether the source pod's egress allows conn.
func Egress(c Cluster, conn Conn) Verdict {
	return decide(c, conn, networkingv1.PolicyTypeEgress, conn.From, conn.To,
		func(p *networkingv1.NetworkPolicy, i int) ([]networkingv1.NetworkPolicyPeer, []networkingv1.NetworkPolicyPort, bool) {
			if i >= len(p.Spec.Egress) {
				return nil, nil, false
			}
			return p.Spec.Egress[i].To, p.Spec.Egress[i].Ports, true
		})
}

// decide is one direction's verdict for the end self of conn, whose
// other end is other: the policies of self's namespace that select it for
// dir isolate it, and it passes if any of their rules (rule i of a policy:
// its peers and ports, false past the last) admits other at conn's port.
func decide(c Cluster, conn Conn, dir Direction, self, other Peer,
	rule func(p *networkingv1.NetworkPolicy, i int) ([]networkingv1.NetworkPolicyPeer, []networkingv1.NetworkPolicyPort, bool)) Verdict {
	pod := self.Pod
	if pod == nil {
		return Verdict{Dir: dir, Allowed: true}
	}
	v := Verdict{Dir: dir, Pod: pod.Namespace + "/" + pod.Name}
	if samePod(other.Pod, pod) || ownNode(other, pod) {
		v.Allowed = true
		return v
	}
	for _, p := range c.Policies(pod.Namespace) {
		if p == nil || !affects(p, dir) || !selects(p, pod) {
			continue
		}
		for i := 0; ; i++ {
			peers, ports, ok := rule(p, i)
			if !ok {
				break
			}
			if peersMatch(c, p.Namespace, peers, other) && portsMatch(ports, conn.To.Pod, conn.Port) {
				return Verdict{Dir: v.Dir, Pod: v.Pod, Allowed: true}
			}
		}
		v.Isolating = append(v.Isolating, p.Name)
	}
	v.Allowed = len(v.Isolating) == 0
	return v
}

// samePod: a pod cannot block its own traffic to itself.
func samePod(a, b *Pod) bool {
	return a != nil && b != nil && a.Namespace == b.Namespace && a.Name == b.Name
}

// ownNode: traffic between a pod and a host of its own node is always
// allowed (kubelet probes, as CNIs let pass).
func ownNode(host Peer, pod *Pod) bool {
	return host.Pod == nil && host.Node != "" && host.Node == pod.Node
}

// affects reports whether p governs direction dir, with policyTypes
// defaulted as the API server does: Ingress always, Egress when p has
// egress rules.
func affects(p *networkingv1.NetworkPolicy, dir Direction) bool {
	types := p.Spec.PolicyTypes
	if len(types) == 0 {
		return dir == networkingv1.PolicyTypeIngress || len(p.Spec.Egress) > 0
	}
	for _, t := range types {
		if t == dir {
			return true
		}
	}
	return false
}

// selects reports whether p's podSelector selects pod, in p's namespace.
func selects(p *networkingv1.NetworkPolicy, pod *Pod) bool {
	if p.Namespace != pod.Namespace {
		return false
	}
	m, ok := matches(&p.Spec.PodSelector, labels.Set(pod.Labels))
	return m || !ok // an invalid selector isolates: fail closed
}

// Endpoint names an end of a connection as an agent knows it, before the
// cluster's state says what it is: a pod by "namespace/name" (Pod), or by
// its IP alone; or a node's host services by the node's name and IP (IP
// invalid when not known).
type Endpoint struct {
	Pod  string
	IP   netip.Addr
	Node string
}
