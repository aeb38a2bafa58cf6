package rdmanode

import (
	"context"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/rdmavisor/rdmavisor/api/v1alpha1"
	"github.com/rdmavisor/rdmavisor/internal/admin"
)

// TestReportRails: an agent's rails become one device each in its
// RDMANode, by rail, with their NUMA node (none when unknown), health and
// what they carry, and the API server takes the status (the CRD's schema).
func TestReportRails(t *testing.T) {
	ctx := context.Background()
	r := &Reporter{Client: k8s, Node: "node-rails", Service: "svc", Provider: v1alpha1.ProviderIBVerbs}
	s := admin.Status{Ready: true, Capacity: 64, Device: "mlx5_0", GID: "10.0.0.1", Control: "10.0.0.1:7471",
		Rails: []admin.Rail{
			{Device: "mlx5_0", GID: "10.0.0.1", NUMANode: 0, Allocated: 8, VConns: 3, QPs: 4, Peers: 1},
			{Device: "mlx5_1", GID: "10.0.1.1", NUMANode: -1, Allocated: 16, VConns: 5, QPs: 6, Peers: 1},
		}}
	if err := r.Write(ctx, r.status(s, nil, metav1.Now())); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = k8s.Delete(context.Background(), &v1alpha1.RDMANode{ObjectMeta: metav1.ObjectMeta{Name: "node-rails"}})
	})
	rn := get(t, "node-rails")
	if rn == nil || len(rn.Status.Devices) != 2 {
		t.Fatalf("RDMANode %+v: want two devices", rn)
	}
	d0, d1 := rn.Status.Devices[0], rn.Status.Devices[1]
	if d0.Name != "mlx5_0" || d0.Rail != 0 || d0.NUMANode == nil || *d0.NUMANode != 0 || d0.VConnsAllocated != 8 || d0.VConnsOpen != 3 ||
		d0.QPsInUse != 4 || d0.Health != v1alpha1.DeviceHealthy {
		t.Errorf("rail 0: %+v", d0)
	}
	if d1.Name != "mlx5_1" || d1.Rail != 1 || d1.NUMANode != nil || d1.GID != "10.0.1.1" || d1.VConnsAllocated != 16 || d1.VConnsOpen != 5 ||
		d1.QPsInUse != 6 || d1.Health != v1alpha1.DeviceHealthy {
		t.Errorf("rail 1: %+v", d1)
	}
}
