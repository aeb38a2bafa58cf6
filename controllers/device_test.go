package controllers

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/go-logr/logr/testr"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/rdmavisor/rdmavisor/api/v1alpha1"
	"github.com/rdmavisor/rdmavisor/internal/admin"
	"github.com/rdmavisor/rdmavisor/internal/config"
	"github.com/rdmavisor/rdmavisor/internal/device"
	"github.com/rdmavisor/rdmavisor/internal/rdmanode"
)

// TestDeviceUnavailable: an agent whose device does not open reports it
// on its RDMANode (the agent's own reporter, with the error device.Open
// returned), and the service turns Degraded, DeviceUnavailable, naming
// the node, the reason and the error; once the device opens, the service
// is Ready again.
func TestDeviceUnavailable(t *testing.T) {
	createNodes(t, map[string]string{"nodev": "true"}, "nodev-1", "nodev-2")
	svc := newService("nodev", "nodev")
	svc.Spec.Device = v1alpha1.DeviceSelector{Provider: v1alpha1.ProviderIBVerbs, Names: []string{"mlx5_9"}}
	createService(t, svc)

	reportNode(t, "nodev-1", "nodev", metav1.ConditionTrue, "Serving", "")
	// nodev-2's agent: its device does not open (without -tags ibverbs the
	// provider is not built in; with it, no mlx5_9 here).
	cfg := config.Default()
	cfg.Device = config.DeviceConfig{Provider: config.ProviderIBVerbs, Names: []string{"mlx5_9"}}
	_, openErr := device.Open(cfg)
	if openErr == nil {
		t.Fatal("device mlx5_9 opened")
	}
	var agent rdmanode.Pending
	agent.Fail(openErr)
	ctx, cancel := context.WithCancel(context.Background())
	r := &rdmanode.Reporter{Client: k8s, Node: "nodev-2", Service: "nodev", Provider: v1alpha1.ProviderIBVerbs,
		Log: testr.New(t), Poll: 50 * time.Millisecond}
	done := make(chan struct{})
	go func() { defer close(done); r.Run(ctx, &agent) }()
	t.Cleanup(func() { cancel(); <-done })

	c := waitCondition(t, "nodev", v1alpha1.ConditionDegraded, metav1.ConditionTrue, ReasonDeviceUnavailable)
	for _, want := range []string{"1 of 2 nodes", "node nodev-2", device.Reason(openErr), openErr.Error()} {
		if !strings.Contains(c.Message, want) {
			t.Errorf("Degraded message %q lacks %q", c.Message, want)
		}
	}
	c = waitCondition(t, "nodev", v1alpha1.ConditionReady, metav1.ConditionFalse, ReasonNodeUnhealthy)
	if !strings.Contains(c.Message, "node nodev-2: "+device.Reason(openErr)) {
		t.Errorf("Ready message %q should name the node and the reason", c.Message)
	}

	// The device opens: the agent starts and reports itself ready.
	agent.Start(openedAgent{})
	waitCondition(t, "nodev", v1alpha1.ConditionReady, metav1.ConditionTrue, ReasonAllNodesReady)
	waitCondition(t, "nodev", v1alpha1.ConditionDegraded, metav1.ConditionFalse, ReasonAsExpected)
}

// openedAgent is an agent serving on its device.
type openedAgent struct{}

func (openedAgent) Status() admin.Status {
	return admin.Status{Ready: true, Capacity: 64, Device: "mlx5_9", GID: "10.0.0.2", Control: "10.0.0.2:7471"}
}
