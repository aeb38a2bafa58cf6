package rdmanode

import (
	"context"
	"testing"
	"time"

	"github.com/go-logr/logr"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	k8sruntime "k8s.io/apimachinery/pkg/runtime"
	kfake "k8s.io/client-go/kubernetes/fake"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"

	"github.com/rdmavisor/rdmavisor/api/v1alpha1"
)

// TestNodeConditionEvents: each change of an RDMANode condition's status or
// reason is an Event on the RDMANode (a Warning when it turns false), and a
// write that changes none records none.
func TestNodeConditionEvents(t *testing.T) {
	s := k8sruntime.NewScheme()
	if err := v1alpha1.AddToScheme(s); err != nil {
		t.Fatal(err)
	}
	c := fake.NewClientBuilder().WithScheme(s).WithStatusSubresource(&v1alpha1.RDMANode{}).Build()
	kube := kfake.NewClientset()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	r := &Reporter{Client: c, Kube: kube, Node: "node-2", Service: "svc", Log: logr.Discard(), events: newNodeEvents(ctx, kube)}
	cond := func(typ string, st metav1.ConditionStatus, reason, msg string) metav1.Condition {
		return metav1.Condition{Type: typ, Status: st, Reason: reason, Message: msg}
	}
	ok := v1alpha1.RDMANodeStatus{Conditions: []metav1.Condition{
		cond(v1alpha1.ConditionNodeReady, metav1.ConditionTrue, "Serving", "serving"),
		cond(v1alpha1.ConditionDeviceReady, metav1.ConditionTrue, "DevicesHealthy", "every device healthy"),
	}}
	down := v1alpha1.RDMANodeStatus{Conditions: []metav1.Condition{
		cond(v1alpha1.ConditionNodeReady, metav1.ConditionTrue, "Serving", "serving"),
		cond(v1alpha1.ConditionDeviceReady, metav1.ConditionFalse, "DeviceUnhealthy", "rail 0 (rxe0): port DOWN"),
	}}
	for _, st := range []v1alpha1.RDMANodeStatus{ok, ok, down, down} {
		if err := r.Write(ctx, st); err != nil {
			t.Fatal(err)
		}
	}
	// Two on creation (each condition appeared), one for the device down.
	deadline := time.Now().Add(10 * time.Second)
	for {
		list, err := kube.EventsV1().Events("default").List(ctx, metav1.ListOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if len(list.Items) >= 3 {
			time.Sleep(200 * time.Millisecond) // a fourth would be there by now
			list, _ = kube.EventsV1().Events("default").List(ctx, metav1.ListOptions{})
			warnings := 0
			for _, e := range list.Items {
				if e.Regarding.Kind != "RDMANode" || e.Regarding.Name != "node-2" || e.ReportingController != "rdmavisor.io/agent" {
					t.Errorf("event regards %+v, by %q: want the RDMANode node-2, by rdmavisor.io/agent", e.Regarding, e.ReportingController)
				}
				if e.Type == "Warning" {
					warnings++
					if e.Reason != "DeviceUnhealthy" || e.Action != v1alpha1.ConditionDeviceReady || e.Note != "DeviceReady is False: rail 0 (rxe0): port DOWN" {
						t.Errorf("warning %s %s %q", e.Reason, e.Action, e.Note)
					}
				}
			}
			if len(list.Items) != 3 || warnings != 1 {
				t.Fatalf("%d events, %d warnings; want 3 (two conditions appearing, the device down) and 1", len(list.Items), warnings)
			}
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d events after 10s, want 3", len(list.Items))
		}
		time.Sleep(20 * time.Millisecond)
	}
}
