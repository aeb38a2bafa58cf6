package charts_test

import (
	"reflect"
	"strings"
	"testing"

	rbacv1 "k8s.io/api/rbac/v1"
)

// The kubectl plugin's RBAC is rendered only when asked for, and holds
// what its help says: reads and the non-resource URL /metrics
// cluster-wide, pods/portforward in the release namespace only.
func TestKubectlPluginRBAC(t *testing.T) {
	for _, o := range render(t) {
		if strings.Contains(o.Metadata.Name, "kubectl-plugin") {
			t.Errorf("rendered by default: %s", o.id())
		}
	}
	objs := render(t, "kubectlPlugin.clusterRole.create=true")
	var cr rbacv1.ClusterRole
	find(t, objs, "ClusterRole", release+"-kubectl-plugin", &cr)
	want := []rbacv1.PolicyRule{
		{APIGroups: []string{"rdmavisor.io"}, Resources: []string{"rdmaservices", "rdmanodes"}, Verbs: []string{"get", "list"}},
		{APIGroups: []string{""}, Resources: []string{"pods"}, Verbs: []string{"get", "list"}},
		{APIGroups: []string{"events.k8s.io"}, Resources: []string{"events"}, Verbs: []string{"list"}},
		{NonResourceURLs: []string{"/metrics"}, Verbs: []string{"get"}},
	}
	if !reflect.DeepEqual(cr.Rules, want) {
		t.Errorf("ClusterRole rules %+v, want %+v", cr.Rules, want)
	}
	var r rbacv1.Role
	find(t, objs, "Role", release+"-kubectl-plugin-metrics", &r)
	want = []rbacv1.PolicyRule{{APIGroups: []string{""}, Resources: []string{"pods/portforward"}, Verbs: []string{"create"}}}
	if r.Namespace != namespace || !reflect.DeepEqual(r.Rules, want) {
		t.Errorf("Role in %q, rules %+v, want %q, %+v", r.Namespace, r.Rules, namespace, want)
	}
}
