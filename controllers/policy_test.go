package controllers

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/rdmavisor/rdmavisor/api/v1alpha1"
	"github.com/rdmavisor/rdmavisor/controllers/testenv"
	"github.com/rdmavisor/rdmavisor/internal/poll"
)

// agentClient impersonates the agent of service on node, as its pod-bound
// service account token would authenticate it: the kubelet-issued token
// carries the node name as a user extra. node "" carries none.
func agentClient(t *testing.T, service, node string) client.Client {
	t.Helper()
	cfg := rest.CopyConfig(restCfg)
	cfg.Impersonate = rest.ImpersonationConfig{
		UserName: "system:serviceaccount:" + testNamespace + ":rdmavisor-agent-" + service,
		Groups:   []string{"system:serviceaccounts", "system:serviceaccounts:" + testNamespace, "system:authenticated"},
	}
	if node != "" {
		cfg.Impersonate.Extra = map[string][]string{nodeNameExtra: {node}}
	}
	c, err := client.New(cfg, client.Options{Scheme: testenv.Scheme()})
	if err != nil {
		t.Fatal(err)
	}
	return c
}

func rdmaNode(name, service string) *v1alpha1.RDMANode {
	return &v1alpha1.RDMANode{ObjectMeta: metav1.ObjectMeta{Name: name}, Spec: v1alpha1.RDMANodeSpec{ServiceName: service}}
}

// wantForbidden checks that err is a denial whose message holds want.
func wantForbidden(err error, want string) error {
	switch {
	case err == nil:
		return errors.New("allowed")
	case !apierrors.IsForbidden(err) && !apierrors.IsInvalid(err):
		return fmt.Errorf("error %w, want Forbidden", err)
	case !strings.Contains(err.Error(), want):
		return fmt.Errorf("message %q does not contain %q", err.Error(), want)
	}
	return nil
}

func TestAgentMayWriteOnlyItsOwnRDMANode(t *testing.T) {
	createNodes(t, map[string]string{"policy": "true"}, "pol-1", "pol-2")
	createService(t, newService("pol", "policy"))
	agent := agentClient(t, "pol", "pol-1")
	cleanup := func(name string) {
		_ = client.IgnoreNotFound(k8s.Delete(context.Background(), rdmaNode(name, "")))
	}
	t.Cleanup(func() { cleanup("pol-1"); cleanup("pol-2") })

	// The policy takes effect a moment after it is created: until then RBAC
	// alone would let the agent write any RDMANode.
	poll.UntilNil(t, 30*time.Second, "the policy denies the agent another node's RDMANode", func() error {
		err := agent.Create(testCtx(t), rdmaNode("pol-2", "pol"))
		if err == nil {
			cleanup("pol-2")
		}
		return wantForbidden(err, "the RDMAvisor agent on node pol-1 may write only RDMANode pol-1, not pol-2")
	})

	own := rdmaNode("pol-1", "pol")
	if err := agent.Create(testCtx(t), own); err != nil {
		t.Fatalf("the agent cannot create its own RDMANode: %v", err)
	}
	own.Status.VConnCapacity = 64
	if err := agent.Status().Update(testCtx(t), own); err != nil {
		t.Fatalf("the agent cannot update its own RDMANode's status: %v", err)
	}
	if err := wantForbidden(agent.Delete(testCtx(t), own), "cannot delete resource"); err != nil {
		t.Errorf("deleting its RDMANode: %v", err)
	}
	if err := wantForbidden(agentClient(t, "pol", "pol-2").Status().Update(testCtx(t), own), "may write only RDMANode pol-2, not pol-1"); err != nil {
		t.Errorf("the agent of pol-2 updating pol-1's status: %v", err)
	}

	cleanup("pol-1")
	tests := []struct {
		name   string
		client client.Client
		obj    *v1alpha1.RDMANode
		want   string
	}{
		{"another service's name", agent, rdmaNode("pol-1", "other"), "agents of RDMAService pol may write only RDMANodes with spec.serviceName pol"},
		{"a token bound to no node", agentClient(t, "pol", ""), rdmaNode("pol-1", "pol"), "its token names no node"},
		{"an agent of no service", agentClient(t, "nobody", "pol-1"), rdmaNode("pol-1", "pol"), "cannot create resource"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := tt.client.Create(testCtx(t), tt.obj)
			if err == nil {
				cleanup(tt.obj.Name)
			}
			if err := wantForbidden(err, tt.want); err != nil {
				t.Error(err)
			}
		})
	}
}
