package rdmanode

import (
	"context"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/fake"

	"github.com/rdmavisor/rdmavisor/internal/admin"
)

// An allocation bound to a pod becomes an Event on that pod, by its UID (as
// kubectl describe pod finds it), saying how many vconns, which allocation
// and which node.
func TestPodEventsAllocated(t *testing.T) {
	kube := fake.NewClientset()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	ev := NewPodEvents(ctx, kube, "node-2")
	ev.Allocated(admin.Pod{UID: "u-1", Namespace: "team", Name: "echo"}, admin.Allocation{ID: "dp-1", VConns: 8})
	deadline := time.Now().Add(10 * time.Second)
	for {
		list, err := kube.EventsV1().Events("team").List(ctx, metav1.ListOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if len(list.Items) == 1 {
			e := list.Items[0]
			r := e.Regarding
			if r.Kind != "Pod" || r.Namespace != "team" || r.Name != "echo" || string(r.UID) != "u-1" {
				t.Errorf("event regards %+v, want the pod team/echo, uid u-1", r)
			}
			if e.Reason != ReasonVConnsAllocated || e.Type != "Normal" || e.ReportingController != "rdmavisor.io/agent" {
				t.Errorf("event %s %s by %q, want Normal %s by rdmavisor.io/agent", e.Type, e.Reason, e.ReportingController, ReasonVConnsAllocated)
			}
			for _, w := range []string{"8 vconns", "node-2", "dp-1", "RDMAVISOR_SOCKET"} {
				if !strings.Contains(e.Note, w) {
					t.Errorf("note %q does not say %q", e.Note, w)
				}
			}
			return
		}
		if len(list.Items) > 1 || time.Now().After(deadline) {
			t.Fatalf("%d events, want 1: %+v", len(list.Items), list.Items)
		}
		time.Sleep(20 * time.Millisecond)
	}
}
