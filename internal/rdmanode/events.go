package rdmanode

import (
	"context"
	"fmt"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/tools/events"

	"github.com/rdmavisor/rdmavisor/internal/admin"
)

// The reasons of the Events a pod gets: when its vconns are allocated,
// and when some fail because their path did.
const (
	ReasonVConnsAllocated = "VConnsAllocated"
	ReasonVConnsFailed    = "VConnsFailed"
)

// PodEvents records Events on pods through the events API, with its
// broadcaster's rate limits and aggregation: what `kubectl describe pod`
// shows of the pod's vconns.
type PodEvents struct {
	node string
	rec  events.EventRecorder
}

// NewPodEvents records Events as the agent of node, until ctx ends. The
// reporting controller is one name for every agent (a qualified name;
// a node's may be longer than its 63 characters); the note names the node.
func NewPodEvents(ctx context.Context, kube kubernetes.Interface, node string) *PodEvents {
	b := events.NewBroadcaster(&events.EventSinkImpl{Interface: kube.EventsV1()})
	b.StartRecordingToSink(ctx.Done())
	go func() { <-ctx.Done(); b.Shutdown() }()
	return &PodEvents{node: node, rec: b.NewRecorder(scheme.Scheme, "rdmavisor.io/agent")}
}

// Allocated says on the pod which allocation of how many vconns its
// node's agent holds for it, and where its socket is.
func (e *PodEvents) Allocated(pod admin.Pod, al admin.Allocation) {
	ref := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: pod.Namespace, Name: pod.Name, UID: types.UID(pod.UID)}}
	e.rec.Eventf(ref, nil, corev1.EventTypeNormal, ReasonVConnsAllocated, "Allocate",
		"%s", allocatedNote(e.node, al))
}

func allocatedNote(node string, al admin.Allocation) string {
	return fmt.Sprintf("%d vconns allocated by the RDMAvisor agent on %s (allocation %s); the pod's RDMAVISOR_SOCKET is its socket", al.VConns, node, al.ID)
}

// VConnsFailed says on the pod that n of its vconns failed with their
// path, and why (a Warning: the application sees the errors too).
func (e *PodEvents) VConnsFailed(pod admin.Pod, n int, why string) {
	ref := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: pod.Namespace, Name: pod.Name, UID: types.UID(pod.UID)}}
	e.rec.Eventf(ref, nil, corev1.EventTypeWarning, ReasonVConnsFailed, "Fail", "%s", failedNote(e.node, n, why))
}

func failedNote(node string, n int, why string) string {
	return truncate(fmt.Sprintf("%d vconns failed on %s: %s", n, node, why), 1000)
}
