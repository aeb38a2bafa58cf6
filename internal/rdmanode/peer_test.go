package rdmanode

import (
	"slices"
	"testing"

	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/rdmavisor/rdmavisor/api/v1alpha1"
)

// TestPeerOfRails: a ready RDMANode's devices of rails 1.. give the peer's
// rail GIDs by rail, a gap left empty; rail 0's is its address, and a rail
// past config.MaxRails is ignored.
func TestPeerOfRails(t *testing.T) {
	rn := &v1alpha1.RDMANode{ObjectMeta: metav1.ObjectMeta{Name: "node-b"}}
	rn.Status.Address = &v1alpha1.AgentAddress{IP: "10.0.0.2", ControlPort: 7471}
	meta.SetStatusCondition(&rn.Status.Conditions, metav1.Condition{Type: v1alpha1.ConditionNodeReady, Status: metav1.ConditionTrue, Reason: ReasonServing})
	rn.Status.Devices = []v1alpha1.RDMADevice{
		{Name: "mlx5_0", GID: "10.0.0.2", Rail: 0},
		{Name: "mlx5_3", GID: "10.3.0.2", Rail: 3},
		{Name: "mlx5_1", GID: "10.1.0.2", Rail: 1},
		{Name: "mlx5_9", GID: "10.9.0.2", Rail: 99},
	}
	p, ok := peerOf(rn)
	if !ok || p.NodeName != "node-b" || p.Address != "10.0.0.2:7471" || !slices.Equal(p.RailGIDs, []string{"10.1.0.2", "", "10.3.0.2"}) {
		t.Fatalf("peerOf = %+v, %v", p, ok)
	}
	rn.Status.Devices = rn.Status.Devices[:1]
	if p, ok := peerOf(rn); !ok || p.RailGIDs != nil {
		t.Fatalf("one rail: peerOf = %+v, %v", p, ok)
	}
}
