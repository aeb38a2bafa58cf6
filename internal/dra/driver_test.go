package dra

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	oci "github.com/opencontainers/runtime-spec/specs-go"
	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/dynamic-resource-allocation/kubeletplugin"
	"k8s.io/dynamic-resource-allocation/resourceslice"
	"k8s.io/utils/ptr"
	"tags.cncf.io/container-device-interface/pkg/cdi"

	"github.com/rdmavisor/rdmavisor/internal/admin"
	"github.com/rdmavisor/rdmavisor/internal/rdmadev"
	"github.com/rdmavisor/rdmavisor/internal/rdmadev/rdmadevtest"
)

func testDriver(t *testing.T, a admin.Agent) *Driver {
	t.Helper()
	rails, err := rdmadev.List(rdmadevtest.TwoNUMA(t), rdmadev.Names)
	if err != nil {
		t.Fatal(err)
	}
	d, err := New(Options{NodeName: "node-a", SocketDir: "/run/rv", Agent: a, Rails: rails, CDISpecDir: t.TempDir(),
		KeyFile: filepath.Join(t.TempDir(), "allocation-id.key"), Version: "1.2.3"})
	if err != nil {
		t.Fatal(err)
	}
	return d
}

// result is an allocation result of the driver's device consuming k
// vconns (k 0: no consumed capacity).
func result(req string, k int64) resourceapi.DeviceRequestAllocationResult {
	r := resourceapi.DeviceRequestAllocationResult{Request: req, Driver: DefaultDriverName, Pool: "node-a", Device: "mlx5-1",
		ShareID: ptr.To(types.UID("5f1c0a52-0000-4000-8000-00000000000" + req[len(req)-1:]))}
	if k > 0 {
		r.ConsumedCapacity = map[resourceapi.QualifiedName]resource.Quantity{CapacityVConns: *resource.NewQuantity(k, resource.DecimalSI)}
	}
	return r
}

func claim(uid string, pods []string, results ...resourceapi.DeviceRequestAllocationResult) *resourceapi.ResourceClaim {
	c := &resourceapi.ResourceClaim{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "c-" + uid[9:13], UID: types.UID(uid)}}
	if results != nil {
		c.Status.Allocation = &resourceapi.AllocationResult{Devices: resourceapi.DeviceAllocationResult{Results: results}}
	}
	for _, p := range pods {
		c.Status.ReservedFor = append(c.Status.ReservedFor, resourceapi.ResourceClaimConsumerReference{Resource: "pods", Name: p, UID: types.UID("uid-" + p)})
	}
	return c
}

const uid1 = "0b0e4c8e-1111-4a51-9a8c-6a0f3d2b9e01"

// idOf is the id of the allocation of the claim of UID uid.
func (d *Driver) idOf(uid string) string { return d.allocationID(types.UID(uid)) }

// A prepared claim gets an agent allocation of the consumed vconns, bound
// to its pod, and a CDI device that brings the allocation's directory and
// environment; a retry finds the same; unprepare releases it all.
func TestPrepareUnprepare(t *testing.T) {
	fa := newFakeAgent(8)
	d := testDriver(t, fa)
	other := resourceapi.DeviceRequestAllocationResult{Request: "gpu", Driver: "gpu.example.com", Pool: "node-a", Device: "gpu-0"}
	c := claim(uid1, []string{"p"}, result("rdma1", 3), other, result("rdma2", 1))
	ctx := context.Background()
	for try := range 2 {
		res, err := d.PrepareResourceClaims(ctx, []*resourceapi.ResourceClaim{c})
		if err != nil || res[c.UID].Err != nil {
			t.Fatalf("try %d: %v, %v", try, err, res[c.UID].Err)
		}
		devs := res[c.UID].Devices
		if len(devs) != 2 {
			t.Fatalf("devices %+v, want the two of this driver", devs)
		}
		for i, req := range []string{"rdma1", "rdma2"} {
			dev := devs[i]
			if !slices.Equal(dev.Requests, []string{req}) || dev.PoolName != "node-a" || dev.DeviceName != "mlx5-1" || dev.ShareID == nil {
				t.Errorf("device %d: %+v", i, dev)
			}
		}
		// One allocation of what both requests consume, named once.
		if !slices.Equal(devs[0].CDIDeviceIDs, []string{CDIKind + "=" + d.idOf(uid1)}) || len(devs[1].CDIDeviceIDs) != 0 {
			t.Errorf("CDI devices %v and %v, want the allocation's once", devs[0].CDIDeviceIDs, devs[1].CDIDeviceIDs)
		}
		if al, ok := fa.Get(d.idOf(uid1)); !ok || al.VConns != 4 || al.Pod != "ns/p" {
			t.Errorf("allocation: %+v, %v; want 4 vconns for ns/p", al, ok)
		}
		if got := fa.IDs(); len(got) != 1 {
			t.Errorf("allocations %v, want 1", got)
		}
	}
	// The container runtime resolves the CDI device.
	cache, err := cdi.NewCache(cdi.WithSpecDirs(d.specs.Dir), cdi.WithAutoRefresh(false))
	if err != nil {
		t.Fatal(err)
	}
	spec := &oci.Spec{Process: &oci.Process{}}
	if _, err := cache.InjectDevices(spec, CDIKind+"="+d.idOf(uid1)); err != nil {
		t.Fatal(err)
	}
	if !slices.Contains(spec.Process.Env, "RDMAVISOR_VCONNS=4") || !slices.Contains(spec.Process.Env, "RDMAVISOR_SOCKET=/var/run/rdmavisor/vconn.sock") ||
		len(spec.Mounts) != 1 || spec.Mounts[0].Source != "/run/rv/alloc/"+d.idOf(uid1) || spec.Mounts[0].Destination != "/var/run/rdmavisor" {
		t.Errorf("container: env %v, mounts %+v", spec.Process.Env, spec.Mounts)
	}

	for try := range 2 {
		res, err := d.UnprepareResourceClaims(ctx, []kubeletplugin.NamespacedObject{{NamespacedName: types.NamespacedName{Namespace: "ns", Name: c.Name}, UID: c.UID}})
		if err != nil || res[c.UID] != nil {
			t.Fatalf("unprepare try %d: %v, %v", try, err, res[c.UID])
		}
		if got := fa.IDs(); len(got) != 0 {
			t.Errorf("allocations after unprepare: %v", got)
		}
		if names, _ := d.specs.Names(); len(names) != 0 {
			t.Errorf("specs after unprepare: %v", names)
		}
	}
}

// A claim that cannot be prepared fails alone, says why, and leaves
// nothing behind.
func TestPrepareBadClaims(t *testing.T) {
	const uid2, uid3, uid4, uid5 = "0b0e4c8e-2222-4a51-9a8c-6a0f3d2b9e01", "0b0e4c8e-3333-4a51-9a8c-6a0f3d2b9e01",
		"0b0e4c8e-4444-4a51-9a8c-6a0f3d2b9e01", "0b0e4c8e-5555-4a51-9a8c-6a0f3d2b9e01"
	fa := newFakeAgent(4)
	d := testDriver(t, fa)
	good := claim(uid1, []string{"p"}, result("r1", 1))
	claims := map[string]*resourceapi.ResourceClaim{
		"not allocated":          claim(uid2, []string{"p"}),
		"reserved for 2 pods":    claim(uid3, []string{"p", "q"}, result("r1", 1)),
		"consumes no capacity":   claim(uid4, []string{"p"}, result("r1", 0)),
		"over the agent's quota": claim(uid5, []string{"p"}, result("r1", 2), result("r2", 2)),
	}
	want := map[string]string{
		"not allocated":          "is not allocated",
		"reserved for 2 pods":    "reserved for 2 pods (ns/p, ns/q): an RDMAvisor allocation serves exactly one pod",
		"consumes no capacity":   `consumes no "vconns" capacity`,
		"over the agent's quota": "allocation " + d.idOf(uid5) + " of 4 vconns",
	}
	list := []*resourceapi.ResourceClaim{good}
	for _, c := range claims {
		list = append(list, c)
	}
	res, err := d.PrepareResourceClaims(context.Background(), list)
	if err != nil {
		t.Fatal(err)
	}
	if res[good.UID].Err != nil {
		t.Errorf("the good claim: %v", res[good.UID].Err)
	}
	for name, c := range claims {
		if err := res[c.UID].Err; err == nil || !strings.Contains(err.Error(), want[name]) {
			t.Errorf("%s: %v, want an error with %q", name, err, want[name])
		}
	}
	if got := fa.IDs(); !slices.Equal(got, []string{d.idOf(uid1)}) {
		t.Errorf("allocations %v, want only the good claim's", got)
	}
	if names, _ := d.specs.Names(); !slices.Equal(names, []string{d.idOf(uid1)}) {
		t.Errorf("specs %v, want only the good claim's", names)
	}
	if errors.Is(res[claims["over the agent's quota"].UID].Err, admin.ErrQuota) != true {
		t.Errorf("quota error does not match admin.ErrQuota: %v", res[claims["over the agent's quota"].UID].Err)
	}
}

// Sync publishes the node's pool once per change, re-creates the
// allocations a restarted agent lost, and deletes those no prepared
// claim records.
func TestSync(t *testing.T) {
	fa := newFakeAgent(8)
	d := testDriver(t, fa)
	var published []resourceslice.DriverResources
	publish := func(_ context.Context, r resourceslice.DriverResources) error {
		published = append(published, r)
		return nil
	}
	ctx := context.Background()
	c := claim(uid1, []string{"p"}, result("r1", 3))
	if res, _ := d.PrepareResourceClaims(ctx, []*resourceapi.ResourceClaim{c}); res[c.UID].Err != nil {
		t.Fatal(res[c.UID].Err)
	}
	for range 2 {
		if err := d.Sync(ctx, publish); err != nil {
			t.Fatal(err)
		}
	}
	if len(published) != 1 {
		t.Fatalf("published %d times, want once", len(published))
	}
	pool := published[0].Pools["node-a"]
	if len(pool.Slices) != 1 || len(pool.Slices[0].Devices) != 1 || pool.Slices[0].Devices[0].Name != "mlx5-1" {
		t.Fatalf("pool %+v", pool)
	}

	// The agent restarts (its allocations gone); a leaked allocation of a
	// crashed prepare and another component's appear.
	fa.Lock()
	fa.Allocs = map[string]admin.Allocation{"dra-leaked": {ID: "dra-leaked", VConns: 1}, "dp-1": {ID: "dp-1", VConns: 1}}
	fa.Capacity = 16 // a new capacity: published again
	fa.Unlock()
	if err := d.Sync(ctx, publish); err != nil {
		t.Fatal(err)
	}
	if got := fa.IDs(); !slices.Equal(got, []string{"dp-1", d.idOf(uid1)}) {
		t.Errorf("allocations after sync %v", got)
	}
	if al, _ := fa.Get(d.idOf(uid1)); al.VConns != 3 || al.Pod != "ns/p" {
		t.Errorf("re-created %+v, want 3 vconns for ns/p", al)
	}
	if len(published) != 2 {
		t.Fatalf("not published again with the new capacity: %d publications", len(published))
	}
	if v := published[1].Pools["node-a"].Slices[0].Devices[0].Capacity[CapacityVConns].Value; v.Value() != 16 {
		t.Errorf("not published again with the new capacity: %d publications", len(published))
	}

	// An agent that does not answer: an error, nothing published, devices
	// unhealthy.
	if r := d.healthReport(); len(r.Devices) != 1 || r.Devices[0].Health != kubeletplugin.HealthStatusHealthy {
		t.Errorf("health %+v, want healthy", r)
	}
	fa.Lock()
	fa.Down = true
	fa.Unlock()
	if err := d.Sync(ctx, publish); err == nil || !strings.Contains(err.Error(), "connection refused") {
		t.Errorf("Sync with the agent down: %v", err)
	}
	if r := d.healthReport(); len(r.Devices) != 1 || r.Devices[0].Health != kubeletplugin.HealthStatusUnhealthy || r.Devices[0].PoolName != "node-a" {
		t.Errorf("health %+v, want unhealthy", r)
	}
}

// A spec that cannot be written fails the claim and takes its new
// allocation back.
func TestPrepareSpecUnwritable(t *testing.T) {
	fa := newFakeAgent(8)
	d := testDriver(t, fa)
	if err := os.Remove(d.specs.Dir); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(d.specs.Dir, nil, 0o644); err != nil { // a file where the directory should be
		t.Fatal(err)
	}
	c := claim(uid1, []string{"p"}, result("r1", 2))
	res, err := d.PrepareResourceClaims(context.Background(), []*resourceapi.ResourceClaim{c})
	if err != nil || res[c.UID].Err == nil || !strings.Contains(res[c.UID].Err.Error(), "writing the spec") {
		t.Fatalf("prepare: %v, %v; want the claim's error", err, res[c.UID].Err)
	}
	if got := fa.IDs(); len(got) != 0 {
		t.Errorf("allocations left: %v", got)
	}
}

// With an agent serving two rails, the node's pool has a device a rail; a
// claim the scheduler gave rail 1's device gets an allocation bound to
// rail 1, recorded in its CDI spec, so that an agent that lost it has it
// re-created on rail 1; a claim of rail 0's device stays on rail 0.
func TestPrepareRails(t *testing.T) {
	fa := newFakeAgent(8)
	fa.Device, fa.Rails = "mlx5_0", []string{"mlx5_0", "mlx5_1"}
	d := testDriver(t, fa)
	var published []resourceslice.DriverResources
	publish := func(_ context.Context, r resourceslice.DriverResources) error {
		published = append(published, r)
		return nil
	}
	ctx := context.Background()
	if err := d.Sync(ctx, publish); err != nil {
		t.Fatal(err)
	}
	if devs := published[0].Pools["node-a"].Slices[0].Devices; len(devs) != 2 || devs[0].Name != "mlx5-0" || devs[1].Name != "mlx5-1" {
		t.Fatalf("devices %+v, want mlx5-0 and mlx5-1", devs)
	}
	const uid2 = "0b0e4c8e-2222-4a51-9a8c-6a0f3d2b9e02"
	on1 := claim(uid1, []string{"p"}, result("r1", 3)) // result names mlx5-1
	r0 := result("r1", 2)
	r0.Device = "mlx5-0"
	on0 := claim(uid2, []string{"q"}, r0)
	res, _ := d.PrepareResourceClaims(ctx, []*resourceapi.ResourceClaim{on1, on0})
	if res[on1.UID].Err != nil || res[on0.UID].Err != nil {
		t.Fatal(res[on1.UID].Err, res[on0.UID].Err)
	}
	check := func(when string) {
		t.Helper()
		fa.Lock()
		defer fa.Unlock()
		if rail, ok := fa.RailOf[d.idOf(uid1)]; !ok || rail != 1 {
			t.Errorf("%s: the claim of mlx5-1: rail %d (%v), want 1", when, rail, ok)
		}
		if _, ok := fa.RailOf[d.idOf(uid2)]; ok || len(fa.Allocs) != 2 {
			t.Errorf("%s: allocations %v on rails %v; want the claim of mlx5-0 on rail 0", when, fa.Allocs, fa.RailOf)
		}
	}
	check("prepared")
	fa.Lock()
	fa.Allocs, fa.RailOf = map[string]admin.Allocation{}, nil // the agent restarted
	fa.Unlock()
	if err := d.Sync(ctx, publish); err != nil {
		t.Fatal(err)
	}
	check("re-created")
}
