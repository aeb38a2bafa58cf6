package netpol

import networkingv1 "k8s.io/api/networking/v1"

// Static is a Cluster of fixed objects: the policies, and the namespaces'
// labels by name.
type Static struct {
	List       []*networkingv1.NetworkPolicy
	Namespaces map[string]map[string]string
}

// Policies returns the policies of namespace ns, in List's order.
func (s *Static) Policies(ns string) []*networkingv1.NetworkPolicy {
	var out []*networkingv1.NetworkPolicy
	for _, p := range s.List {
		if p.Namespace == ns {
			out = append(out, p)
		}
	}
	return out
}

// NamespaceLabels returns namespace ns's labels.
func (s *Static) NamespaceLabels(ns string) map[string]string { return s.Namespaces[ns] }
