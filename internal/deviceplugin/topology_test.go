package deviceplugin

import (
	"context"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"

	"github.com/rdmavisor/rdmavisor/internal/config"
	"github.com/rdmavisor/rdmavisor/internal/rdmadev"
	"github.com/rdmavisor/rdmavisor/internal/rdmadev/rdmadevtest"
)

// twoNUMAPlugin is a plugin of 8 devices served by both of the fake
// tree's rails (multi-rail, which the agent does not do yet):
// vconn-0000..0003 on mlx5_0 (NUMA node 0), vconn-0004..0007 on mlx5_1
// (node 1).
func twoNUMAPlugin(t *testing.T) *Plugin {
	t.Helper()
	rails, err := rdmadev.List(rdmadevtest.TwoNUMA(t), rdmadev.Names)
	if err != nil {
		t.Fatal(err)
	}
	cfg := config.Default()
	cfg.VConnsPerNode = 8
	p, err := New(Options{Config: cfg, Agent: newFakeAgent("/x", 8), Key: &testKey, Rails: rails})
	if err != nil {
		t.Fatal(err)
	}
	p.topo.numa = numaOf(8, rails)
	return p
}

// With two rails the devices have no topology until the agent names the
// one it serves them with; then they report its NUMA node, and the
// ListAndWatch streams are woken to send them again.
func TestTopologyFollowsTheAgent(t *testing.T) {
	rails, err := rdmadev.List(rdmadevtest.TwoNUMA(t), rdmadev.Names)
	if err != nil {
		t.Fatal(err)
	}
	cfg := config.Default()
	cfg.VConnsPerNode = 4
	fa := newFakeAgent("/x", 4)
	p, err := New(Options{Config: cfg, Agent: fa, Key: &testKey, Rails: rails})
	if err != nil {
		t.Fatal(err)
	}
	topologyOf := func() []int64 {
		var out []int64
		for _, d := range p.devices(true, nil) {
			if d.Topology == nil {
				out = append(out, -1)
				continue
			}
			out = append(out, d.Topology.Nodes[0].ID)
		}
		return out
	}
	if got := topologyOf(); !slices.Equal(got, []int64{-1, -1, -1, -1}) {
		t.Fatalf("before the agent answers: %v, want no topology", got)
	}
	ctx := context.Background()
	for _, tc := range []struct {
		device string
		want   []int64
		wake   bool
	}{
		{"", []int64{-1, -1, -1, -1}, false},
		{"soft-10.0.0.1:4791", []int64{-1, -1, -1, -1}, false},
		{"mlx5_1", []int64{1, 1, 1, 1}, true},
		{"mlx5_1", []int64{1, 1, 1, 1}, false},
		{"mlx5_0", []int64{0, 0, 0, 0}, true},
	} {
		fa.Lock()
		fa.Device = tc.device
		fa.Unlock()
		_, _, changed := p.health.get()
		p.updateHealth(ctx)
		if got := topologyOf(); !slices.Equal(got, tc.want) {
			t.Errorf("agent on %q: topology %v, want %v", tc.device, got, tc.want)
		}
		woken := false
		select {
		case <-changed:
			woken = true
		default:
		}
		// The first probe also changes the health (unknown to healthy).
		if first := tc.device == ""; woken != (tc.wake || first) {
			t.Errorf("agent on %q: streams woken %v, want %v", tc.device, woken, tc.wake)
		}
	}
}

// Each device reports its rail's NUMA node, read from sysfs.
func TestDevicesTopology(t *testing.T) {
	p := twoNUMAPlugin(t)
	devs := p.devices(true, nil)
	if len(devs) != 8 {
		t.Fatalf("%d devices, want 8", len(devs))
	}
	for i, d := range devs {
		want := int64(i / 4)
		if d.Topology == nil || len(d.Topology.Nodes) != 1 || d.Topology.Nodes[0].ID != want {
			t.Errorf("%s: topology %v, want NUMA node %d", d.ID, d.Topology, want)
		}
	}

	// No rails, or rails of unknown NUMA node: no topology at all.
	soft := rdmadevtest.RoCE()
	soft.NUMANode = "-1"
	root := t.TempDir()
	rdmadevtest.Write(t, root, soft)
	unknown, err := rdmadev.List(root, rdmadev.Names)
	if err != nil {
		t.Fatal(err)
	}
	for name, rails := range map[string][]rdmadev.Device{"no rails": nil, "NUMA node -1": unknown} {
		cfg := config.Default()
		cfg.VConnsPerNode = 4
		p, err := New(Options{Config: cfg, Agent: newFakeAgent("/x", 4), Key: &testKey, Rails: rails})
		if err != nil {
			t.Fatal(err)
		}
		for _, d := range p.devices(true, nil) {
			if d.Topology != nil {
				t.Errorf("%s: %s has topology %v", name, d.ID, d.Topology)
			}
		}
	}
}

// GetPreferredAllocation keeps a container on one NUMA node where one
// fits it.
func TestPreferredNUMA(t *testing.T) {
	s := &server{p: twoNUMAPlugin(t)}
	for _, tc := range []struct {
		name            string
		available, must []string
		size            int
		want            []string
	}{
		{"both fit: the lower node", ids(0, 1, 2, 3, 4, 5, 6, 7), nil, 3, ids(0, 1, 2)},
		{"only node 1 fits", ids(0, 1, 4, 5, 6), nil, 3, ids(4, 5, 6)},
		{"best fit: the fuller node", ids(0, 1, 2, 4, 5, 6, 7), nil, 3, ids(0, 1, 2)},
		{"best fit of the contiguous run on it", ids(1, 3, 4, 5, 6, 7), nil, 2, ids(1, 3)},
		{"the must-include device's node", ids(0, 1, 2, 3, 4, 5, 6, 7), ids(6), 2, ids(4, 6)},
		{"the must-include node spills over", ids(0, 1, 2, 3, 4, 7), ids(7), 3, ids(0, 4, 7)},
		{"must-include on two nodes", ids(0, 1, 2, 3, 4, 5, 6, 7), ids(3, 4), 3, ids(0, 3, 4)},
		{"no node fits: contiguous over both", ids(0, 1, 2, 3, 4, 5, 6, 7), nil, 6, ids(0, 1, 2, 3, 4, 5)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			rep, err := s.GetPreferredAllocation(context.Background(), &pluginapi.PreferredAllocationRequest{
				ContainerRequests: []*pluginapi.ContainerPreferredAllocationRequest{
					{AvailableDeviceIDs: tc.available, MustIncludeDeviceIDs: tc.must, AllocationSize: int32(tc.size)},
				}})
			if err != nil {
				t.Fatal(err)
			}
			if got := rep.ContainerResponses[0].DeviceIDs; !slices.Equal(got, tc.want) {
				t.Errorf("preferred %v, want %v", got, tc.want)
			}
		})
	}
}

// Any request gets exactly its size from what is available, with the
// must-include devices, NUMA or not.
func FuzzPreferredNUMA(f *testing.F) {
	f.Add(uint16(0xffff), uint16(0x0040), uint8(3))
	f.Add(uint16(0x00f3), uint16(0), uint8(2))
	f.Fuzz(func(t *testing.T, avail, must uint16, size uint8) {
		const n = 16
		numa := make([]int, n)
		for i := range numa {
			numa[i] = i * 3 / n // three nodes of unequal size
		}
		var av, mu []string
		for i := range n {
			if avail&(1<<i) != 0 || must&(1<<i) != 0 {
				av = append(av, DeviceID(i))
			}
			if must&(1<<i) != 0 {
				mu = append(mu, DeviceID(i))
			}
		}
		sz := int(size) % (len(av) + 1)
		if sz < len(mu) {
			sz = len(mu)
		}
		got := preferredNUMA(av, mu, sz, n, numa)
		if len(got) != sz {
			t.Fatalf("preferredNUMA(%v, %v, %d) = %v: %d devices", av, mu, sz, got, len(got))
		}
		for _, id := range mu {
			if !slices.Contains(got, id) {
				t.Fatalf("preferredNUMA(%v, %v, %d) = %v lacks %s", av, mu, sz, got, id)
			}
		}
		for _, id := range got {
			if !slices.Contains(av, id) {
				t.Fatalf("preferredNUMA(%v, %v, %d) = %v: %s is not available", av, mu, sz, got, id)
			}
		}
	})
}

// Rails reads the devices that may serve the vconns from sysfs: those the
// names accept, none for the soft provider; a malformed tree is an error.
func TestRails(t *testing.T) {
	root := rdmadevtest.TwoNUMA(t)
	for _, tc := range []struct {
		name string
		cfg  config.DeviceConfig
		want []string
	}{
		{"soft", config.DeviceConfig{Provider: config.ProviderSoft}, nil},
		{"any", config.DeviceConfig{Provider: config.ProviderIBVerbs}, []string{"mlx5_0", "mlx5_1"}},
		{"by name", config.DeviceConfig{Provider: config.ProviderIBVerbs, Names: []string{"mlx5_1"}}, []string{"mlx5_1"}},
		{"no match", config.DeviceConfig{Provider: config.ProviderIBVerbs, Names: []string{"rxe0"}}, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			rails, err := Rails(root, tc.cfg)
			if err != nil {
				t.Fatal(err)
			}
			var got []string
			for _, r := range rails {
				got = append(got, r.Name)
			}
			if !slices.Equal(got, tc.want) {
				t.Errorf("rails %v, want %v", got, tc.want)
			}
		})
	}
	if err := os.WriteFile(filepath.Join(root, "class", "infiniband", "mlx5_0", "node_guid"), []byte("x\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := Rails(root, config.DeviceConfig{Provider: config.ProviderIBVerbs}); err == nil || !strings.Contains(err.Error(), "node_guid") {
		t.Errorf("Rails of a malformed tree: %v", err)
	}
}

// With one rail the devices report its NUMA node before the agent
// answers.
func TestTopologyOneRail(t *testing.T) {
	rails, err := Rails(rdmadevtest.TwoNUMA(t), config.DeviceConfig{Provider: config.ProviderIBVerbs, Names: []string{"mlx5_1"}})
	if err != nil {
		t.Fatal(err)
	}
	cfg := config.Default()
	cfg.VConnsPerNode = 2
	p, err := New(Options{Config: cfg, Agent: newFakeAgent("/x", 2), Key: &testKey, Rails: rails})
	if err != nil {
		t.Fatal(err)
	}
	for _, d := range p.devices(true, nil) {
		if d.Topology == nil || d.Topology.Nodes[0].ID != 1 {
			t.Errorf("%s: topology %v, want NUMA node 1", d.ID, d.Topology)
		}
	}
}

// An agent serving both of the fake tree's devices as two rails
// (multi-rail): the advertised devices are split over them in blocks,
// each with its rail's NUMA node, the preferred allocation keeps a
// container on one node, and Allocate binds its allocation to the rail of
// its devices, so that allocations spread over the rails by NUMA node.
func TestRailsByNUMA(t *testing.T) {
	rails, err := rdmadev.List(rdmadevtest.TwoNUMA(t), rdmadev.Names)
	if err != nil {
		t.Fatal(err)
	}
	cfg := config.Default()
	cfg.VConnsPerNode = 8
	fa := newFakeAgent("/x", 8)
	fa.Device, fa.Rails = "mlx5_0", []string{"mlx5_0", "mlx5_1"}
	p, err := New(Options{Config: cfg, Agent: fa, Key: &testKey, Rails: rails})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	p.updateHealth(ctx)
	if got := p.topo.nodes(); !slices.Equal(got, []int{0, 0, 0, 0, 1, 1, 1, 1}) {
		t.Fatalf("NUMA nodes %v; want the first four on node 0, the rest on 1", got)
	}
	s := &server{p: p}
	pref, err := s.GetPreferredAllocation(ctx, &pluginapi.PreferredAllocationRequest{
		ContainerRequests: []*pluginapi.ContainerPreferredAllocationRequest{
			{AvailableDeviceIDs: ids(0, 1, 4, 5, 6), AllocationSize: 3}}})
	if err != nil {
		t.Fatal(err)
	}
	onNode1 := pref.ContainerResponses[0].DeviceIDs
	if !slices.Equal(onNode1, ids(4, 5, 6)) {
		t.Fatalf("preferred %v; want node 1's 4, 5, 6", onNode1)
	}
	if _, err := p.allocate(ctx, containers(onNode1, ids(0, 1), ids(3, 7))); err != nil {
		t.Fatal(err)
	}
	fa.Lock()
	defer fa.Unlock()
	want := map[string]int{
		AllocationID(&testKey, onNode1):   1, // bound to rail 1, mlx5_1
		AllocationID(&testKey, ids(3, 7)): 0, // one a rail: the lower
	}
	for id, rail := range want {
		if got, ok := fa.RailOf[id]; rail > 0 && (!ok || got != rail) {
			t.Errorf("allocation of %s: rail %d (%v); want %d", id, got, ok, rail)
		}
		if _, ok := fa.RailOf[id]; rail == 0 && ok {
			t.Errorf("allocation %s made through CreateRailAllocation; want rail 0's CreateAllocation", id)
		}
	}
	if _, ok := fa.RailOf[AllocationID(&testKey, ids(0, 1))]; ok || len(fa.Allocs) != 3 {
		t.Errorf("allocations %v, rails %v; want three, node 0's on rail 0", fa.Allocs, fa.RailOf)
	}
}
