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

// railsAgent is an agent serving two rails, rail 1 down while down says
// why.
type railsAgent struct{ down chan string }

func (a railsAgent) Status() admin.Status {
	why := <-a.down
	a.down <- why
	return admin.Status{Ready: true, Capacity: 64, Device: "mlx5_0", GID: "10.0.0.3", Control: "10.0.0.3:7471",
		Rails: []admin.Rail{{Device: "mlx5_0", GID: "10.0.0.3", NUMANode: -1}, {Device: "mlx5_1", GID: "10.0.1.3", NUMANode: -1, Down: why}}}
}

// TestRailDown: an agent whose rail 1 goes down reports that device
// Unhealthy on its RDMANode (the agent's own reporter), and the service
// turns Degraded, DeviceUnhealthy, naming the node, the device and the
// agent's reason, while the node stays ready (rail 0 serves); the rail
// back up, the service is no longer Degraded.
func TestRailDown(t *testing.T) {
	createNodes(t, map[string]string{"raild": "true"}, "raild-1")
	createService(t, newService("raild", "raild"))
	agent := railsAgent{down: make(chan string, 1)}
	agent.down <- ""
	ctx, cancel := context.WithCancel(context.Background())
	r := &rdmanode.Reporter{Client: k8s, Node: "raild-1", Service: "raild", Provider: v1alpha1.ProviderIBVerbs,
		Log: testr.New(t), Poll: 50 * time.Millisecond}
	done := make(chan struct{})
	go func() { defer close(done); r.Run(ctx, agent) }()
	t.Cleanup(func() { cancel(); <-done })
	waitCondition(t, "raild", v1alpha1.ConditionReady, metav1.ConditionTrue, ReasonAllNodesReady)

	<-agent.down
	agent.down <- "port DOWN"
	c := waitCondition(t, "raild", v1alpha1.ConditionDegraded, metav1.ConditionTrue, ReasonDeviceUnhealthy)
	if want := "node raild-1 device mlx5_1 (port DOWN) unhealthy"; c.Message != want {
		t.Errorf("Degraded message %q, want %q", c.Message, want)
	}
	waitCondition(t, "raild", v1alpha1.ConditionReady, metav1.ConditionTrue, ReasonAllNodesReady)

	<-agent.down
	agent.down <- ""
	waitCondition(t, "raild", v1alpha1.ConditionDegraded, metav1.ConditionFalse, ReasonAsExpected)
}
