package rdmanode

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"unicode/utf8"

	"k8s.io/apimachinery/pkg/api/meta"
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

// A rail the agent reports down is an Unhealthy device with the agent's
// reason; DeviceReady turns False (DevicesDown, naming them) only when
// every rail is down, and says which are down while others serve. The
// API server takes such a status.
func TestReportRailsDown(t *testing.T) {
	r := &Reporter{Node: "node-down", Service: "svc", Provider: v1alpha1.ProviderIBVerbs}
	rails := func(down ...string) admin.Status {
		s := admin.Status{Ready: true, Capacity: 64, Device: "mlx5_0", GID: "10.0.0.1"}
		for i, why := range down {
			s.Rails = append(s.Rails, admin.Rail{Device: fmt.Sprintf("mlx5_%d", i), GID: fmt.Sprintf("10.0.%d.1", i), NUMANode: -1, Down: why})
		}
		return s
	}
	long := strings.Repeat("é", 600) // 1200 bytes: cut to the CRD's 1024
	for _, tc := range []struct {
		name       string
		s          admin.Status
		health     []v1alpha1.DeviceHealth
		messages   []string
		ready      metav1.ConditionStatus
		reason     string
		message    string // DeviceReady's message
		write      bool
		longDevice bool // device 1's message is cut
	}{
		{name: "none down", s: rails("", ""), health: []v1alpha1.DeviceHealth{v1alpha1.DeviceHealthy, v1alpha1.DeviceHealthy},
			messages: []string{"", ""}, ready: metav1.ConditionTrue, reason: ReasonDeviceOpen, message: "device mlx5_0, GID 10.0.0.1"},
		{name: "one down", s: rails("", "port DOWN"), health: []v1alpha1.DeviceHealth{v1alpha1.DeviceHealthy, v1alpha1.DeviceUnhealthy},
			messages: []string{"", "port DOWN"}, ready: metav1.ConditionTrue, reason: ReasonDeviceOpen,
			message: "device mlx5_0, GID 10.0.0.1; 1 of 2 devices down: mlx5_1 (port DOWN)", write: true},
		{name: "all down", s: rails("device gone", "port DOWN"), health: []v1alpha1.DeviceHealth{v1alpha1.DeviceUnhealthy, v1alpha1.DeviceUnhealthy},
			messages: []string{"device gone", "port DOWN"}, ready: metav1.ConditionFalse, reason: ReasonDevicesDown,
			message: "every RDMA device is down: mlx5_0 (device gone), mlx5_1 (port DOWN)", write: true},
		{name: "the one rail down", s: rails("port INIT"), health: []v1alpha1.DeviceHealth{v1alpha1.DeviceUnhealthy},
			messages: []string{"port INIT"}, ready: metav1.ConditionFalse, reason: ReasonDevicesDown,
			message: "every RDMA device is down: mlx5_0 (port INIT)"},
		{name: "a long reason", s: rails("", long), health: []v1alpha1.DeviceHealth{v1alpha1.DeviceHealthy, v1alpha1.DeviceUnhealthy},
			messages: []string{"", ""}, ready: metav1.ConditionTrue, reason: ReasonDeviceOpen, write: true, longDevice: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			st := r.status(tc.s, nil, metav1.Now())
			if len(st.Devices) != len(tc.health) {
				t.Fatalf("devices %+v, want %d", st.Devices, len(tc.health))
			}
			for i, d := range st.Devices {
				if d.Health != tc.health[i] {
					t.Errorf("device %s: health %s, want %s", d.Name, d.Health, tc.health[i])
				}
				if tc.longDevice && i == 1 {
					if len(d.Message) > 1024 || !utf8.ValidString(d.Message) || !strings.HasPrefix(d.Message, "éé") || !strings.HasSuffix(d.Message, "...") {
						t.Errorf("device %s: message of %d bytes, want a valid cut of at most 1024: %q", d.Name, len(d.Message), d.Message)
					}
				} else if d.Message != tc.messages[i] {
					t.Errorf("device %s: message %q, want %q", d.Name, d.Message, tc.messages[i])
				}
			}
			c := meta.FindStatusCondition(st.Conditions, v1alpha1.ConditionDeviceReady)
			if c == nil || c.Status != tc.ready || c.Reason != tc.reason || (tc.message != "" && c.Message != tc.message) {
				t.Errorf("DeviceReady %+v, want %s %s %q", c, tc.ready, tc.reason, tc.message)
			}
			if !tc.write {
				return
			}
			r.Client = k8s
			if err := r.Write(context.Background(), st); err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() {
				_ = k8s.Delete(context.Background(), &v1alpha1.RDMANode{ObjectMeta: metav1.ObjectMeta{Name: "node-down"}})
			})
			if rn := get(t, "node-down"); rn == nil || len(rn.Status.Devices) != len(tc.health) || rn.Status.Devices[1].Health != tc.health[1] {
				t.Errorf("written: %+v", rn)
			}
		})
	}
}
