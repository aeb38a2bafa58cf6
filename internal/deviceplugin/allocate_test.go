package deviceplugin

import (
	"context"
	"slices"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"

	"github.com/rdmavisor/rdmavisor/internal/admin"
	"github.com/rdmavisor/rdmavisor/internal/admin/admintest"
	"github.com/rdmavisor/rdmavisor/internal/config"
)

// newFakeAgent is an agent in memory of capacity vconns, at most 3 an
// allocation, whose allocations' sockets are under dir.
func newFakeAgent(dir string, capacity int) *admintest.Agent {
	a := admintest.New(capacity)
	a.Dir, a.MaxVConns = dir, 3
	return a
}

func testPlugin(t *testing.T, a admin.Agent, cdi bool) *Plugin {
	t.Helper()
	cfg := config.Default()
	cfg.VConnsPerNode = 4
	cfg.SocketDir = "/run/rv"
	o := Options{Config: cfg, Agent: a, CDI: cdi, Key: &testKey}
	if cdi {
		o.CDISpecDir = t.TempDir()
	}
	p, err := New(o)
	if err != nil {
		t.Fatal(err)
	}
	return p
}

func containers(reqs ...[]string) *pluginapi.AllocateRequest {
	r := &pluginapi.AllocateRequest{}
	for _, ids := range reqs {
		r.ContainerRequests = append(r.ContainerRequests, &pluginapi.ContainerAllocateRequest{DevicesIds: ids})
	}
	return r
}

func TestAllocate(t *testing.T) {
	for _, tc := range []struct {
		name     string
		capacity int
		down     bool
		cdi      bool
		before   [][]string // allocated first, successfully
		req      *pluginapi.AllocateRequest
		code     codes.Code
		vconns   []int    // per container, on success
		allocs   []string // allocation ids afterwards
	}{
		{name: "one device", capacity: 8, req: containers(ids(0)), vconns: []int{1},
			allocs: []string{AllocationID(&testKey, ids(0))}},
		{name: "several devices", capacity: 8, req: containers(ids(3, 1, 2)), vconns: []int{3},
			allocs: []string{AllocationID(&testKey, ids(1, 2, 3))}},
		{name: "two containers", capacity: 8, req: containers(ids(0), ids(1, 2)), vconns: []int{1, 2},
			allocs: slices.Sorted(slices.Values([]string{AllocationID(&testKey, ids(0)), AllocationID(&testKey, ids(1, 2))}))},
		{name: "retried", capacity: 8, before: [][]string{ids(2, 0)}, req: containers(ids(0, 2)), vconns: []int{2},
			allocs: []string{AllocationID(&testKey, ids(0, 2))}},
		{name: "cdi", capacity: 8, cdi: true, req: containers(ids(0)), vconns: []int{1},
			allocs: []string{AllocationID(&testKey, ids(0))}},
		{name: "unknown device", capacity: 8, req: containers(ids(0), []string{"vconn-0004"}), code: codes.InvalidArgument},
		{name: "foreign device", capacity: 8, req: containers([]string{"nvidia0"}), code: codes.InvalidArgument},
		{name: "more than advertised", capacity: 8, req: containers(ids(0, 1, 2, 3, 0)), code: codes.InvalidArgument},
		{name: "duplicate", capacity: 8, req: containers(ids(1, 1)), code: codes.InvalidArgument},
		{name: "no devices", capacity: 8, req: containers(nil), code: codes.InvalidArgument},
		{name: "no containers", capacity: 8, req: containers(), code: codes.InvalidArgument},
		{name: "agent quota, rolled back", capacity: 2, req: containers(ids(0), ids(1, 2)), code: codes.ResourceExhausted},
		{name: "agent refuses", capacity: 8, req: containers(ids(0, 1, 2, 3)), code: codes.FailedPrecondition},
		{name: "agent down", capacity: 8, down: true, req: containers(ids(0)), code: codes.Unavailable},
	} {
		t.Run(tc.name, func(t *testing.T) {
			fa := newFakeAgent("/run/rv", tc.capacity)
			p := testPlugin(t, fa, tc.cdi)
			s := &server{p: p}
			ctx := context.Background()
			for _, b := range tc.before {
				if _, err := s.Allocate(ctx, containers(b)); err != nil {
					t.Fatal(err)
				}
			}
			fa.Down = tc.down
			rep, err := s.Allocate(ctx, tc.req)
			if tc.code != codes.OK {
				if status.Code(err) != tc.code {
					t.Fatalf("Allocate: %v, want code %v", err, tc.code)
				}
				if got := fa.IDs(); len(got) != 0 {
					t.Errorf("allocations after a failed Allocate: %v", got)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if got := fa.IDs(); !slices.Equal(got, tc.allocs) {
				t.Errorf("allocations %v, want %v", got, tc.allocs)
			}
			if len(rep.ContainerResponses) != len(tc.vconns) {
				t.Fatalf("%d container responses, want %d", len(rep.ContainerResponses), len(tc.vconns))
			}
			for i, cr := range rep.ContainerResponses {
				id := AllocationID(&testKey, tc.req.ContainerRequests[i].DevicesIds)
				if got := cr.Envs["RDMAVISOR_VCONNS"]; got != []string{"", "1", "2", "3"}[tc.vconns[i]] {
					t.Errorf("RDMAVISOR_VCONNS=%q, want %d", got, tc.vconns[i])
				}
				if got := cr.Envs["RDMAVISOR_SOCKET"]; got != ContainerSocketDir+"/vconn.sock" {
					t.Errorf("RDMAVISOR_SOCKET=%q", got)
				}
				if len(cr.Mounts) != 1 || cr.Mounts[0].HostPath != "/run/rv/alloc/"+id || cr.Mounts[0].ContainerPath != ContainerSocketDir {
					t.Errorf("mounts %v, want /run/rv/alloc/%s at %s", cr.Mounts, id, ContainerSocketDir)
				}
				if fa.Allocs[id].VConns != tc.vconns[i] {
					t.Errorf("quota %d, want %d", fa.Allocs[id].VConns, tc.vconns[i])
				}
				wantCDI := 0
				if tc.cdi {
					wantCDI = 1
				}
				if len(cr.CdiDevices) != wantCDI || (tc.cdi && cr.CdiDevices[0].Name != "rdmavisor.io/vconn="+id) {
					t.Errorf("CDI devices %v (cdi %v)", cr.CdiDevices, tc.cdi)
				}
			}
		})
	}
}

func TestGetPreferredAllocation(t *testing.T) {
	s := &server{p: testPlugin(t, newFakeAgent("/x", 8), false)}
	rep, err := s.GetPreferredAllocation(context.Background(), &pluginapi.PreferredAllocationRequest{
		ContainerRequests: []*pluginapi.ContainerPreferredAllocationRequest{
			{AvailableDeviceIDs: ids(0, 2, 3), AllocationSize: 2},
			{AvailableDeviceIDs: ids(0, 1, 3), MustIncludeDeviceIDs: ids(3), AllocationSize: 2},
		}})
	if err != nil {
		t.Fatal(err)
	}
	want := [][]string{ids(2, 3), ids(0, 3)}
	for i, cr := range rep.ContainerResponses {
		if !slices.Equal(cr.DeviceIDs, want[i]) {
			t.Errorf("container %d: %v, want %v", i, cr.DeviceIDs, want[i])
		}
	}
}
