//go:build e2e

package e2e

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/yaml"

	"github.com/rdmavisor/rdmavisor/api/v1alpha1"
)

// ibverbsWithoutDevice applies the hardware sample (provider ibverbs) to
// the first node, which has no RDMA device: the image's agent is the ibverbs
// one, so it starts, finds no device, and keeps running and saying so
// rather than crash-looping: the RDMANode's DeviceReady is False with the
// reason, and the RDMAService is Degraded (DeviceUnavailable) naming the
// node. The sample is applied as written except for its image (this
// cluster's, never pulled), and the node gets the sample's label.
func (e *env) ibverbsWithoutDevice() {
	data, err := os.ReadFile(filepath.Join(e.repo, "config", "samples", "rdmavisor_v1alpha1_rdmaservice.yaml"))
	if err != nil {
		e.t.Fatal(err)
	}
	svc := &v1alpha1.RDMAService{}
	if err := yaml.UnmarshalStrict(data, svc); err != nil {
		e.t.Fatal(err)
	}
	if svc.Spec.Device.Provider != v1alpha1.ProviderIBVerbs {
		e.t.Fatalf("the hardware sample's provider is %q", svc.Spec.Device.Provider)
	}
	svc.Spec.Agent.Image = "local.test/rdmavisor:dev"
	svc.Spec.Agent.ImagePullPolicy = corev1.PullNever
	for k, v := range svc.Spec.NodeSelector.MatchLabels {
		e.run(e.kubectl, "label", "node", e.nodes[0], "--overwrite", k+"="+v)
		defer e.run(e.kubectl, "label", "node", e.nodes[0], k+"-")
	}
	if err := e.crs.Create(e.ctx, svc); err != nil {
		e.t.Fatal(err)
	}
	defer func() {
		e.run(e.kubectl, "delete", "rdmaservice", svc.Name, "--wait=true", "--timeout=2m")
		e.eventually("the ibverbs agent gone", 2*time.Minute, func() (bool, string) {
			_, err := e.kube.AppsV1().DaemonSets(namespace).Get(e.ctx, "rdmavisor-agent-"+svc.Name, metav1.GetOptions{})
			pods := e.agentPods()
			return apierrors.IsNotFound(err) && len(pods) == 0, fmt.Sprintf("DaemonSet %v, %d pods", err, len(pods))
		})
	}()

	e.eventually("the RDMANode says the device does not open", 3*time.Minute, func() (bool, string) {
		var rn v1alpha1.RDMANode
		if err := e.crs.Get(e.ctx, client.ObjectKey{Name: e.nodes[0]}, &rn); err != nil {
			return false, err.Error()
		}
		c := meta.FindStatusCondition(rn.Status.Conditions, "DeviceReady")
		if c == nil || c.Status != metav1.ConditionFalse || c.Reason == "" || c.Message == "" {
			return false, fmt.Sprintf("DeviceReady %+v", c)
		}
		e.t.Logf("RDMANode %s: DeviceReady=False, %s: %s", rn.Name, c.Reason, c.Message)
		// And an Event says it on the RDMANode (kubectl describe).
		ev := e.eventOf("RDMANode", rn.Name, c.Reason, "DeviceReady")
		if ev == nil || ev.Type != corev1.EventTypeWarning || !strings.Contains(ev.Note, "DeviceReady is False") {
			return false, fmt.Sprintf("no Warning Event %s on RDMANode %s: %+v", c.Reason, rn.Name, ev)
		}
		e.t.Logf("RDMANode Event: %s %s: %s", ev.Type, ev.Reason, ev.Note)
		return true, ""
	})
	e.eventually("the RDMAService is Degraded: DeviceUnavailable", 2*time.Minute, func() (bool, string) {
		var s v1alpha1.RDMAService
		if err := e.crs.Get(e.ctx, client.ObjectKey{Name: svc.Name}, &s); err != nil {
			return false, err.Error()
		}
		c := meta.FindStatusCondition(s.Status.Conditions, v1alpha1.ConditionDegraded)
		if c == nil || c.Status != metav1.ConditionTrue || c.Reason != "DeviceUnavailable" || !strings.Contains(c.Message, e.nodes[0]) {
			return false, fmt.Sprintf("Degraded %+v", c)
		}
		e.t.Logf("RDMAService %s: Degraded=True, %s: %s", s.Name, c.Reason, c.Message)
		return true, ""
	})
	// Still running, not restarted, not ready: waiting for its device.
	pods := e.agentPods()
	if len(pods) != 1 {
		e.t.Fatalf("%d agent pods", len(pods))
	}
	for _, cs := range pods[0].Status.ContainerStatuses {
		if cs.Name != "agent" {
			continue
		}
		if cs.State.Running == nil || cs.RestartCount != 0 || cs.Ready {
			e.t.Fatalf("agent container: running %v, restarts %d, ready %v; want running, never restarted, not ready",
				cs.State.Running != nil, cs.RestartCount, cs.Ready)
		}
	}
}
