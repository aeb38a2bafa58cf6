package controllers

import (
	"context"
	"fmt"
	"testing"
	"time"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/rdmavisor/rdmavisor/controllers/testenv"
	"github.com/rdmavisor/rdmavisor/internal/poll"
)

// operatorClient acts as the operator's service account, with the RBAC
// generated from the markers (config/rbac/role.yaml), as the manager does.
func operatorClient(t *testing.T) client.Client {
	t.Helper()
	c, err := client.New(operatorRestConfig(), client.Options{Scheme: testenv.Scheme()})
	if err != nil {
		t.Fatal(err)
	}
	return c
}

func binding(name, role string, subject rbacv1.Subject) *rbacv1.ClusterRoleBinding {
	return &rbacv1.ClusterRoleBinding{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: role},
		Subjects:   []rbacv1.Subject{subject},
	}
}

// TestOperatorCannotEscalate: the operator reconciles a service (binding its
// agents to the chart's AgentClusterRole), yet can neither grant itself or
// anyone more than that role, nor write ClusterRoles or admission policies,
// nor touch bindings that are not its agents'.
func TestOperatorCannotEscalate(t *testing.T) {
	createNodes(t, map[string]string{"rbac": "true"}, "rbac-1")
	createService(t, newService("rbac", "rbac"))
	ctx := testCtx(t)

	// The normal reconcile, as the operator: the agents' binding.
	b := &rbacv1.ClusterRoleBinding{}
	poll.UntilNil(t, 30*time.Second, "the agents' ClusterRoleBinding", func() error {
		return k8s.Get(ctx, client.ObjectKey{Name: "rdmavisor-agent-rbac"}, b)
	})
	wantSubject := rbacv1.Subject{Kind: rbacv1.ServiceAccountKind, Name: "rdmavisor-agent-rbac", Namespace: testNamespace}
	if b.RoleRef.Name != AgentClusterRole || len(b.Subjects) != 1 || b.Subjects[0] != wantSubject {
		t.Errorf("binding roleRef %+v subjects %+v, want %s to %+v", b.RoleRef, b.Subjects, AgentClusterRole, wantSubject)
	}

	op := operatorClient(t)
	self := rbacv1.Subject{Kind: rbacv1.ServiceAccountKind, Name: operatorSA, Namespace: testNamespace}
	mallory := rbacv1.Subject{Kind: rbacv1.UserKind, APIGroup: rbacv1.GroupName, Name: "mallory"}
	agentPolicy, _ := NewAgentPolicy(testNamespace)
	tests := []struct {
		name string
		do   func(context.Context, client.Client) error
		want string
	}{
		{"bind cluster-admin to itself, named as an agent's binding",
			func(ctx context.Context, c client.Client) error {
				return c.Create(ctx, binding("rdmavisor-agent-evil", "cluster-admin", self))
			}, "attempting to grant RBAC permissions not currently held"},
		{"create a ClusterRole with every permission",
			func(ctx context.Context, c client.Client) error {
				return c.Create(ctx, &rbacv1.ClusterRole{ObjectMeta: metav1.ObjectMeta{Name: "rdmavisor-agent-evil"},
					Rules: []rbacv1.PolicyRule{{APIGroups: []string{"*"}, Resources: []string{"*"}, Verbs: []string{"*"}}}})
			}, "cannot create resource \"clusterroles\""},
		{"widen the agents' ClusterRole",
			func(ctx context.Context, c client.Client) error {
				cr := NewAgentClusterRole()
				cr.Rules = append(cr.Rules, rbacv1.PolicyRule{APIGroups: []string{""}, Resources: []string{"secrets"}, Verbs: []string{"get"}})
				return c.Update(ctx, cr)
			}, "cannot update resource \"clusterroles\""},
		{"bind the agents' role to another user",
			func(ctx context.Context, c client.Client) error {
				return c.Create(ctx, binding("rdmavisor-agent-evil", AgentClusterRole, mallory))
			}, "the RDMAvisor operator may write only ClusterRoleBindings"},
		{"bind the agents' role under another name",
			func(ctx context.Context, c client.Client) error {
				return c.Create(ctx, binding("evil", AgentClusterRole,
					rbacv1.Subject{Kind: rbacv1.ServiceAccountKind, Name: "evil", Namespace: testNamespace}))
			}, "the RDMAvisor operator may write only ClusterRoleBindings"},
		{"delete a binding not its agents'",
			func(ctx context.Context, c client.Client) error {
				return c.Delete(ctx, &rbacv1.ClusterRoleBinding{ObjectMeta: metav1.ObjectMeta{Name: "cluster-admin"}})
			}, "the RDMAvisor operator may write only ClusterRoleBindings"},
		{"delete the agent policy",
			func(ctx context.Context, c client.Client) error { return c.Delete(ctx, agentPolicy) },
			"cannot delete resource \"validatingadmissionpolicies\""},
		{"create an admission policy",
			func(ctx context.Context, c client.Client) error {
				p, _ := NewAgentPolicy("elsewhere")
				p.Name = "rdmavisor-agent-evil"
				return c.Create(ctx, p)
			}, "cannot create resource \"validatingadmissionpolicies\""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			// The suite's policies take effect a moment after they are
			// created: until then RBAC alone decides.
			poll.UntilNil(t, 30*time.Second, "refused", func() error {
				err := tt.do(testCtx(t), op)
				if err == nil {
					_ = k8s.Delete(context.Background(), &rbacv1.ClusterRoleBinding{ObjectMeta: metav1.ObjectMeta{Name: "rdmavisor-agent-evil"}})
					_ = k8s.Delete(context.Background(), &rbacv1.ClusterRoleBinding{ObjectMeta: metav1.ObjectMeta{Name: "evil"}})
				}
				return wantForbidden(err, tt.want)
			})
		})
	}
	// The refusals above changed nothing the operator relies on.
	for _, o := range []client.Object{NewAgentClusterRole(), agentPolicy, &admissionregistrationv1.ValidatingAdmissionPolicyBinding{ObjectMeta: metav1.ObjectMeta{Name: AgentPolicy}}} {
		if err := k8s.Get(ctx, client.ObjectKeyFromObject(o), o); err != nil {
			t.Errorf("%T %s: %v", o, o.GetName(), err)
		}
	}
}

// TestOperatorReplacesOldBinding: a binding an older operator made to a
// per-service ClusterRole (its roleRef cannot change) is replaced by one to
// AgentClusterRole.
func TestOperatorReplacesOldBinding(t *testing.T) {
	ctx := testCtx(t)
	old := binding("rdmavisor-agent-upgrade", "view", rbacv1.Subject{Kind: rbacv1.ServiceAccountKind, Name: "rdmavisor-agent-upgrade", Namespace: testNamespace})
	old.Labels = map[string]string{labelManagedBy: FieldOwner, LabelService: "upgrade"}
	if err := k8s.Create(ctx, old); err != nil {
		t.Fatal(err)
	}
	createNodes(t, map[string]string{"upgrade": "true"}, "upgrade-1")
	createService(t, newService("upgrade", "upgrade"))
	poll.UntilNil(t, 30*time.Second, "the binding is AgentClusterRole's", func() error {
		b := &rbacv1.ClusterRoleBinding{}
		if err := k8s.Get(ctx, client.ObjectKeyFromObject(old), b); err != nil {
			return err
		}
		if b.RoleRef.Name != AgentClusterRole {
			return fmt.Errorf("roleRef %s", b.RoleRef.Name)
		}
		return nil
	})
}
