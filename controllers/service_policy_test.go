package controllers

import (
	"context"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/util/retry"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/rdmavisor/rdmavisor/api/v1alpha1"
	"github.com/rdmavisor/rdmavisor/controllers/testenv"
	"github.com/rdmavisor/rdmavisor/internal/poll"
)

// userClient impersonates user in groups.
func userClient(t *testing.T, user string, groups ...string) client.Client {
	t.Helper()
	cfg := rest.CopyConfig(restCfg)
	cfg.Impersonate = rest.ImpersonationConfig{UserName: user, Groups: append(groups, "system:authenticated")}
	c, err := client.New(cfg, client.Options{Scheme: testenv.Scheme()})
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// TestServiceFieldsPolicy: with the chart's policy, a user RBAC lets write
// RDMAServices may not set or change spec.agent.image (but to the default
// image) or spec.tolerations; a user or group the policy allows may.
func TestServiceFieldsPolicy(t *testing.T) {
	ctx := testCtx(t)
	policy, binding := NewServicePolicy(testImage, []string{"carol"}, []string{"rdma-admins"})
	writers := &rbacv1.ClusterRole{ObjectMeta: metav1.ObjectMeta{Name: "service-policy-test-writers"},
		Rules: []rbacv1.PolicyRule{{APIGroups: []string{v1alpha1.GroupVersion.Group}, Resources: []string{"rdmaservices"},
			Verbs: []string{"get", "create", "update", "patch"}}}}
	writersBinding := &rbacv1.ClusterRoleBinding{ObjectMeta: metav1.ObjectMeta{Name: writers.Name},
		RoleRef:  rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: writers.Name},
		Subjects: []rbacv1.Subject{{Kind: rbacv1.GroupKind, APIGroup: rbacv1.GroupName, Name: "system:authenticated"}}}
	for _, o := range []client.Object{policy, binding, writers, writersBinding} {
		if err := k8s.Create(ctx, o); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = k8s.Delete(context.Background(), o) })
	}
	alice := userClient(t, "alice")
	svc := func(name string, mutate func(*v1alpha1.RDMAService)) *v1alpha1.RDMAService {
		s := newService(name, "service-policy-no-node")
		mutate(s)
		return s
	}
	create := func(c client.Client, s *v1alpha1.RDMAService) error {
		err := c.Create(testCtx(t), s)
		if err == nil {
			t.Cleanup(func() { deleteService(t, s.Name) })
		}
		return err
	}
	// update mutates the service as c, retrying when the operator's
	// finalizer or status got in between.
	update := func(c client.Client, name string, mutate func(*v1alpha1.RDMAService)) error {
		return retry.RetryOnConflict(retry.DefaultRetry, func() error {
			s := &v1alpha1.RDMAService{}
			if err := c.Get(testCtx(t), client.ObjectKey{Name: name}, s); err != nil {
				return err
			}
			mutate(s)
			return c.Update(testCtx(t), s)
		})
	}
	const imageMsg = "spec.agent.image runs as root"
	// The policy takes effect a moment after it is created.
	poll.UntilNil(t, 30*time.Second, "the policy refuses alice an image", func() error {
		return wantForbidden(create(alice, svc("sp-image", func(s *v1alpha1.RDMAService) { s.Spec.Agent.Image = "evil.test/root:1" })), imageMsg)
	})
	toleration := []corev1.Toleration{{Key: "node-role.kubernetes.io/control-plane", Operator: corev1.TolerationOpExists}}
	if err := wantForbidden(create(alice, svc("sp-tol", func(s *v1alpha1.RDMAService) { s.Spec.Tolerations = toleration })), "spec.tolerations"); err != nil {
		t.Errorf("alice sets tolerations: %v", err)
	}

	// The default image, and fields that choose no code and no node, are
	// anyone's.
	own := svc("sp-own", func(s *v1alpha1.RDMAService) { s.Spec.Agent.Image = testImage })
	if err := create(alice, own); err != nil {
		t.Fatalf("alice creates a service of the default image: %v", err)
	}
	if err := update(alice, own.Name, func(s *v1alpha1.RDMAService) { s.Spec.QPsPerPeer = ptr[int32](3) }); err != nil {
		t.Fatalf("alice updates qpsPerPeer: %v", err)
	}
	if err := wantForbidden(update(alice, own.Name, func(s *v1alpha1.RDMAService) { s.Spec.Agent.Image = "evil.test/root:1" }), imageMsg); err != nil {
		t.Errorf("alice changes the image: %v", err)
	}

	// A service an allowed user made with its own image and tolerations:
	// others may edit the rest, not those.
	carol := svc("sp-carol", func(s *v1alpha1.RDMAService) {
		s.Spec.Agent.Image = "registry.test/rdmavisor:custom"
		s.Spec.Tolerations = toleration
	})
	if err := create(userClient(t, "carol"), carol); err != nil {
		t.Errorf("carol, an allowed user: %v", err)
	}
	admin := svc("sp-admin", func(s *v1alpha1.RDMAService) {
		s.Spec.Agent.Image = "registry.test/rdmavisor:custom"
		s.Spec.Tolerations = toleration
	})
	if err := create(userClient(t, "dave", "rdma-admins"), admin); err != nil {
		t.Fatalf("dave of rdma-admins: %v", err)
	}
	if err := update(alice, admin.Name, func(s *v1alpha1.RDMAService) { s.Spec.QPsPerPeer = ptr[int32](3) }); err != nil {
		t.Errorf("alice edits another field of dave's service: %v", err)
	}
	if err := wantForbidden(update(alice, admin.Name, func(s *v1alpha1.RDMAService) { s.Spec.Tolerations = nil }), "spec.tolerations"); err != nil {
		t.Errorf("alice removes the tolerations of dave's service: %v", err)
	}
}
