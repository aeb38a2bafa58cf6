package dra

import (
	"context"
	"strings"
	"testing"

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/dynamic-resource-allocation/kubeletplugin"
	"k8s.io/dynamic-resource-allocation/resourceslice"

	"github.com/rdmavisor/rdmavisor/internal/admin"
)

// A rail the agent reports down leaves the node's ResourceSlice (published
// again without it) but stays in the health report, Unhealthy with the
// agent's reason; a claim on it is refused with the rail and the reason,
// and a lost allocation on it waits. Back up, the device is published
// again and Healthy, and the claim prepares. With every rail down the
// pool is published empty.
func TestRailDown(t *testing.T) {
	fa := newFakeAgent(8)
	fa.Device, fa.Rails = "mlx5_0", []string{"mlx5_0", "mlx5_1"}
	d := testDriver(t, fa)
	var published [][]string // the device names of each publication
	publish := func(_ context.Context, r resourceslice.DriverResources) error {
		var names []string
		for _, dev := range r.Pools["node-a"].Slices[0].Devices {
			names = append(names, dev.Name)
		}
		published = append(published, names)
		return nil
	}
	ctx := context.Background()
	sync := func(down ...string) {
		t.Helper()
		fa.Lock()
		fa.RailDown = down
		fa.Unlock()
		if err := d.Sync(ctx, publish); err != nil {
			t.Fatalf("Sync, rails down %q: %v", down, err)
		}
	}
	// health is each device's health and message, by name.
	health := func() map[string]string {
		out := map[string]string{}
		for _, h := range d.healthReport().Devices {
			out[h.DeviceName] = string(h.Health) + " " + h.Message
		}
		return out
	}
	last := func() string { return strings.Join(published[len(published)-1], ",") }
	healthy := string(kubeletplugin.HealthStatusHealthy) + " "

	sync()
	if len(published) != 1 || last() != "mlx5-0,mlx5-1" {
		t.Fatalf("published %v, want mlx5-0 and mlx5-1 once", published)
	}
	// A pod holds rail 1's device before it goes down.
	held := claim(uid1, []string{"p"}, result("r1", 2))
	if res, _ := d.PrepareResourceClaims(ctx, []*resourceapi.ResourceClaim{held}); res[held.UID].Err != nil {
		t.Fatal(res[held.UID].Err)
	}

	sync("", "port DOWN")
	if len(published) != 2 || last() != "mlx5-0" {
		t.Fatalf("rail 1 down: published %v, want mlx5-0 alone, again", published)
	}
	h := health()
	if len(h) != 2 || h["mlx5-0"] != healthy || h["mlx5-1"] != "Unhealthy rail 1 (mlx5_1) is down: port DOWN" {
		t.Errorf("rail 1 down: health %q", h)
	}
	sync("", "device gone") // another reason: the same slice, the new reason
	if len(published) != 2 {
		t.Errorf("rail 1 down for another reason: published again, %v", published)
	}
	if h := health(); h["mlx5-1"] != "Unhealthy rail 1 (mlx5_1) is down: device gone" {
		t.Errorf("rail 1 down for another reason: health %q", h)
	}

	// A claim the scheduler gave rail 1's device before it left the slice.
	const uid2 = "0b0e4c8e-2222-4a51-9a8c-6a0f3d2b9e02"
	late := claim(uid2, []string{"q"}, result("r1", 1))
	res, _ := d.PrepareResourceClaims(ctx, []*resourceapi.ResourceClaim{late})
	if err := res[late.UID].Err; err == nil || !strings.Contains(err.Error(), "device mlx5-1 (rail 1, mlx5_1) is down: device gone") {
		t.Errorf("prepare on the rail that is down: %v; want an error naming the device, rail and reason", err)
	}
	if _, ok := fa.Get(d.idOf(uid2)); ok {
		t.Error("prepare on the rail that is down made an allocation")
	}

	// The agent loses the held claim's allocation while its rail is down:
	// Sync says so, and re-creates it once the rail is up.
	fa.Lock()
	fa.Allocs = map[string]admin.Allocation{}
	fa.Unlock()
	if err := d.Sync(ctx, publish); err == nil || !strings.Contains(err.Error(), "rail 1 is down (device gone)") {
		t.Errorf("Sync with a lost allocation on the rail that is down: %v", err)
	}

	sync()
	if len(published) != 3 || last() != "mlx5-0,mlx5-1" {
		t.Fatalf("rail 1 up: published %v, want both again", published)
	}
	if h := health(); h["mlx5-0"] != healthy || h["mlx5-1"] != healthy {
		t.Errorf("rail 1 up: health %q", h)
	}
	if al, ok := fa.Get(d.idOf(uid1)); !ok || al.Pod != "ns/p" || fa.RailOf[d.idOf(uid1)] != 1 {
		t.Errorf("rail 1 up: the held claim's allocation %+v (%v), want it re-created on rail 1", al, ok)
	}
	if res, _ := d.PrepareResourceClaims(ctx, []*resourceapi.ResourceClaim{late}); res[late.UID].Err != nil {
		t.Errorf("prepare with rail 1 up: %v", res[late.UID].Err)
	}

	sync("port DOWN", "port DOWN")
	if len(published) != 4 || last() != "" {
		t.Errorf("every rail down: published %v, want an empty pool", published)
	}
	if h := health(); len(h) != 2 || !strings.HasPrefix(h["mlx5-0"], "Unhealthy rail 0") || !strings.HasPrefix(h["mlx5-1"], "Unhealthy rail 1") {
		t.Errorf("every rail down: health %q", h)
	}
}

// Endpoints keeps a rail that is down, with its reason, one rail or
// several.
func TestEndpointsDown(t *testing.T) {
	st := admin.Status{Device: "mlx5_0", Capacity: 8,
		Rails: []admin.Rail{{Device: "mlx5_0"}, {Device: "mlx5_1", Down: "port DOWN"}}}
	if got := Endpoints(st, nil); len(got) != 2 || got[0].Down != "" || got[1].Down != "port DOWN" || got[1].VConns != 4 {
		t.Errorf("two rails, rail 1 down: %+v", got)
	}
	st.Rails = st.Rails[1:]
	st.Rails[0].Device = "mlx5_0"
	if got := Endpoints(st, nil); len(got) != 1 || got[0].Down != "port DOWN" || got[0].VConns != 8 {
		t.Errorf("one rail, down: %+v", got)
	}
}
