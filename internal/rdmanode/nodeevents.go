package rdmanode

import (
	"context"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	k8sruntime "k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/events"

	"github.com/rdmavisor/rdmavisor/api/v1alpha1"
)

// nodeEvents records an Event on the node's RDMANode for each change of
// one of its conditions (status or reason), as the operator does on an
// RDMAService: `kubectl describe rdmanode` and `kubectl get events` then
// say when a device went down or a peer was lost, and why.
type nodeEvents struct {
	rec events.EventRecorder
}

func newNodeEvents(ctx context.Context, kube kubernetes.Interface) *nodeEvents {
	s := k8sruntime.NewScheme()
	_ = v1alpha1.AddToScheme(s) // static types: cannot fail
	b := events.NewBroadcaster(&events.EventSinkImpl{Interface: kube.EventsV1()})
	b.StartRecordingToSink(ctx.Done())
	go func() { <-ctx.Done(); b.Shutdown() }()
	return &nodeEvents{rec: b.NewRecorder(s, "rdmavisor.io/agent")}
}

// changed records the conditions of now that differ from before in status
// or reason; a condition that is false is a Warning (each of an RDMANode's
// is good when true).
func (e *nodeEvents) changed(rn *v1alpha1.RDMANode, before, now []metav1.Condition) {
	if e == nil {
		return
	}
	for _, c := range now {
		prev := meta.FindStatusCondition(before, c.Type)
		if prev != nil && prev.Status == c.Status && prev.Reason == c.Reason {
			continue
		}
		typ := corev1.EventTypeNormal
		if c.Status != metav1.ConditionTrue {
			typ = corev1.EventTypeWarning
		}
		e.rec.Eventf(rn, nil, typ, c.Reason, c.Type, "%s is %s: %s", c.Type, c.Status, c.Message)
	}
}
