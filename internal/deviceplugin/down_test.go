package deviceplugin

import (
	"context"
	"slices"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"

	"github.com/rdmavisor/rdmavisor/internal/admin/admintest"
	"github.com/rdmavisor/rdmavisor/internal/config"
)

// twoRails is a plugin of 8 devices over an agent of two rails (no
// topology: the fake's devices are not in sysfs): vconn-0000..0003 on
// rail 0, vconn-0004..0007 on rail 1.
func twoRails(t *testing.T) (*Plugin, *admintest.Agent) {
	t.Helper()
	cfg := config.Default()
	cfg.VConnsPerNode = 8
	fa := newFakeAgent("/x", 8)
	fa.Device, fa.Rails = "mlx5_0", []string{"mlx5_0", "mlx5_1"}
	p, err := New(Options{Config: cfg, Agent: fa, Key: &testKey})
	if err != nil {
		t.Fatal(err)
	}
	return p, fa
}

// healthOf is the health of each device as ListAndWatch sends it now.
func healthOf(p *Plugin) []string {
	healthy, down, _ := p.health.get()
	var out []string
	for _, d := range p.devices(healthy, down) {
		out = append(out, d.Health)
	}
	return out
}

// gaugeValue reads a gauge.
func gaugeValue(t *testing.T, g prometheus.Gauge) float64 {
	t.Helper()
	var m dto.Metric
	if err := g.Write(&m); err != nil {
		t.Fatal(err)
	}
	return m.GetGauge().GetValue()
}

func repeat(h string, k int) []string { return slices.Repeat([]string{h}, k) }

// A rail the agent says is down makes its devices Unhealthy, and only
// them, waking the streams; back up, they are Healthy again. An agent not
// ready makes them all Unhealthy whatever its rails.
func TestRailDownDevicesUnhealthy(t *testing.T) {
	p, fa := twoRails(t)
	ctx := context.Background()
	set := func(down []string, ready bool) (woken bool) {
		t.Helper()
		fa.Lock()
		fa.RailDown, fa.Ready = down, ready
		fa.Unlock()
		_, _, changed := p.health.get()
		p.updateHealth(ctx)
		select {
		case <-changed:
			return true
		default:
			return false
		}
	}
	H, U := pluginapi.Healthy, pluginapi.Unhealthy
	for _, tc := range []struct {
		name    string
		down    []string
		ready   bool
		want    []string
		healthy float64 // the devices_healthy gauge
		woken   bool
	}{
		{"both up", nil, true, repeat(H, 8), 8, true},
		{"rail 1 down", []string{"", "port DOWN"}, true, append(repeat(H, 4), repeat(U, 4)...), 4, true},
		{"rail 1 still down", []string{"", "port DOWN"}, true, append(repeat(H, 4), repeat(U, 4)...), 4, false},
		{"rail 1 gone", []string{"", "device gone"}, true, append(repeat(H, 4), repeat(U, 4)...), 4, true},
		{"agent not ready", []string{"", "device gone"}, false, repeat(U, 8), 0, true},
		{"agent ready, rail 0 down too", []string{"port INIT", "device gone"}, true, repeat(U, 8), 0, true},
		{"both back", nil, true, repeat(H, 8), 8, true},
	} {
		woken := set(tc.down, tc.ready)
		if got := healthOf(p); !slices.Equal(got, tc.want) {
			t.Errorf("%s: health %v, want %v", tc.name, got, tc.want)
		}
		if woken != tc.woken {
			t.Errorf("%s: streams woken %v, want %v", tc.name, woken, tc.woken)
		}
		if got := gaugeValue(t, p.metrics.healthy); got != tc.healthy {
			t.Errorf("%s: devices_healthy %v, want %v", tc.name, got, tc.healthy)
		}
	}
	// An agent that stops answering says nothing of its rails: what they
	// were is kept for when it answers again.
	set([]string{"", "port DOWN"}, true)
	fa.Lock()
	fa.Down = true
	fa.Unlock()
	p.updateHealth(ctx)
	if _, down, _ := p.health.get(); !slices.Equal(down, []string{"", "port DOWN"}) {
		t.Errorf("agent gone: rails down %q, want rail 1's kept", down)
	}
}

// The preferred allocation never takes a device of a rail that is down,
// even when the kubelet still offers it: it answers fewer devices, and the
// kubelet fills the rest from what it has.
func TestPreferredSkipsDownRail(t *testing.T) {
	p, fa := twoRails(t)
	fa.RailDown = []string{"", "port DOWN"}
	ctx := context.Background()
	p.updateHealth(ctx)
	s := &server{p: p}
	for _, tc := range []struct {
		available, must []string
		size            int
		want            []string
	}{
		{ids(2, 3, 4, 5, 6), nil, 3, ids(2, 3)},
		{ids(0, 1, 2, 4), nil, 2, ids(0, 1)},
		{ids(4, 5), nil, 1, nil},
		{ids(1, 5), ids(5), 2, ids(1, 5)}, // a must-include device stays
	} {
		rep, err := s.GetPreferredAllocation(ctx, &pluginapi.PreferredAllocationRequest{ContainerRequests: []*pluginapi.ContainerPreferredAllocationRequest{
			{AvailableDeviceIDs: tc.available, MustIncludeDeviceIDs: tc.must, AllocationSize: int32(tc.size)}}})
		if err != nil {
			t.Fatal(err)
		}
		if got := rep.ContainerResponses[0].DeviceIDs; !slices.Equal(got, tc.want) {
			t.Errorf("available %v, must %v, size %d: preferred %v, want %v", tc.available, tc.must, tc.size, got, tc.want)
		}
	}
}

// Allocate binds a container to a rail that is up whenever one of its
// devices is on one, even where most are on the rail that is down; given
// only devices of a rail that is down, it fails with the agent's refusal
// and the rail's reason, and holds nothing.
func TestAllocateAvoidsDownRail(t *testing.T) {
	p, fa := twoRails(t)
	ctx := context.Background()
	p.updateHealth(ctx)
	if _, err := p.allocate(ctx, containers(ids(3, 4, 5))); err != nil {
		t.Fatal(err)
	}
	if rail := fa.RailOf[AllocationID(&testKey, ids(3, 4, 5))]; rail != 1 {
		t.Errorf("both rails up: rail %d, want 1 (most devices)", rail)
	}

	fa.Lock()
	fa.RailDown = []string{"", "port DOWN"}
	fa.Unlock()
	p.updateHealth(ctx)
	mixed := ids(2, 6, 7)
	if _, err := p.allocate(ctx, containers(mixed)); err != nil {
		t.Fatalf("devices on both rails, rail 1 down: %v", err)
	}
	if rail, ok := fa.RailOf[AllocationID(&testKey, mixed)]; ok {
		t.Errorf("devices on both rails, rail 1 down: bound to rail %d, want 0", rail)
	}

	before := fa.IDs()
	_, err := p.allocate(ctx, containers(ids(0), ids(6, 7)))
	if status.Code(err) != codes.FailedPrecondition || !strings.Contains(err.Error(), "rail 1 is down (port DOWN)") {
		t.Fatalf("devices of the rail that is down only: %v; want FailedPrecondition naming rail 1 and its reason", err)
	}
	if got := fa.IDs(); !slices.Equal(got, before) {
		t.Errorf("allocations %v after the refused Allocate, want %v (the first container's rolled back)", got, before)
	}
}

// railOf prefers a rail that is up among the devices' rails.
func TestRailOfDown(t *testing.T) {
	topo := newTopology(8, nil)
	topo.learn([]string{"a", "b"})
	for _, tc := range []struct {
		ids  []string
		down []string
		want int
	}{
		{ids(4, 5, 0), nil, 1},
		{ids(4, 5, 0), []string{"", "x"}, 0},
		{ids(0, 1, 4), []string{"x", ""}, 1},
		{ids(4, 5), []string{"", "x"}, 1}, // no rail up: the agent refuses
		{ids(0, 4), []string{"x", "x"}, 0},
	} {
		if got := topo.railOf(tc.ids, tc.down); got != tc.want {
			t.Errorf("railOf(%v, down %q) = %d, want %d", tc.ids, tc.down, got, tc.want)
		}
	}
	if got := railDevices(1, 2, 8); got != "vconn-0004..vconn-0007" {
		t.Errorf("railDevices(1, 2, 8) = %q", got)
	}
	if got := railDevices(1, 2, 1); got != "none" {
		t.Errorf("railDevices(1, 2, 1) = %q", got)
	}
}
