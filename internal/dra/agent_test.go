package dra

import (
	"context"
	"path/filepath"
	"strings"
	"testing"
	"time"

	oci "github.com/opencontainers/runtime-spec/specs-go"
	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/dynamic-resource-allocation/kubeletplugin"
	"k8s.io/dynamic-resource-allocation/resourceslice"
	"tags.cncf.io/container-device-interface/pkg/cdi"

	"github.com/rdmavisor/rdmavisor/internal/admin"
	"github.com/rdmavisor/rdmavisor/internal/agent/agenttest"
	"github.com/rdmavisor/rdmavisor/internal/deviceplugin"
	"github.com/rdmavisor/rdmavisor/internal/frame"
	"github.com/rdmavisor/rdmavisor/pkg/vconn"
)

// With real agents: the node's soft device is published, a prepared
// claim's container reaches the agent by what CDI gives it, with the
// consumed vconns as its quota, and talks to a pod on the other node; an
// agent restart loses the allocation and sync restores it; unprepare
// releases it.
func TestPrepareWithAgent(t *testing.T) {
	cl, err := agenttest.Start(agenttest.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := cl.Close(); err != nil {
			t.Errorf("closing the agents: %v", err)
		}
	})
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	node := cl.Nodes[0]
	d, err := New(Options{NodeName: node.Name, SocketDir: node.Config.SocketDir, Agent: deviceplugin.AdminAgent{Path: node.Config.AdminSocket},
		CDISpecDir: t.TempDir(), KeyFile: filepath.Join(t.TempDir(), "allocation-id.key"), Version: "1.2.3"})
	if err != nil {
		t.Fatal(err)
	}
	var pool resourceslice.Pool
	publish := func(_ context.Context, r resourceslice.DriverResources) error { pool = r.Pools[node.Name]; return nil }
	if err := d.Sync(ctx, publish); err != nil {
		t.Fatal(err)
	}
	if len(pool.Slices) != 1 || len(pool.Slices[0].Devices) != 1 {
		t.Fatalf("pool %+v", pool)
	}
	dev := pool.Slices[0].Devices[0]
	if dev.Name != "soft" || *dev.Attributes["transport"].StringValue != "UDP" || *dev.Attributes["gid"].StringValue == "" {
		t.Errorf("device %s %+v", dev.Name, dev.Attributes)
	}

	// A server on node-b.
	b, err := cl.Nodes[1].Client(ctx, "server", 8)
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	ln, err := b.Listen(ctx, ":7000")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()

	pod := admin.Pod{UID: "uid-p", Namespace: "ns", Name: "p", IPs: []string{"10.244.0.7"}}
	if err := node.Agent.RegisterPod(pod); err != nil { // as the CNI plugin's ADD
		t.Fatal(err)
	}
	c := claim(uid1, []string{"p"}, resourceapi.DeviceRequestAllocationResult{Request: "r", Driver: DefaultDriverName, Pool: node.Name, Device: "soft",
		ConsumedCapacity: map[resourceapi.QualifiedName]resource.Quantity{CapacityVConns: *resource.NewQuantity(3, resource.DecimalSI)}})
	res, err := d.PrepareResourceClaims(ctx, []*resourceapi.ResourceClaim{c})
	if err != nil || res[c.UID].Err != nil {
		t.Fatalf("prepare: %v, %v", err, res[c.UID].Err)
	}
	cdiID := res[c.UID].Devices[0].CDIDeviceIDs[0]

	// The container as the runtime makes it, and the pod's client in it.
	connect := func() *vconn.Client {
		t.Helper()
		cache, err := cdi.NewCache(cdi.WithSpecDirs(d.specs.Dir), cdi.WithAutoRefresh(false))
		if err != nil {
			t.Fatal(err)
		}
		spec := &oci.Spec{Process: &oci.Process{}}
		if _, err := cache.InjectDevices(spec, cdiID); err != nil {
			t.Fatal(err)
		}
		var sock string
		for _, e := range spec.Process.Env {
			if v, ok := strings.CutPrefix(e, frame.EnvSocket+"="); ok {
				sock = filepath.Join(spec.Mounts[0].Source, strings.TrimPrefix(v, spec.Mounts[0].Destination))
			}
		}
		a, err := vconn.NewClient(ctx, vconn.Options{Socket: sock})
		if err != nil {
			t.Fatalf("connecting at %s: %v", sock, err)
		}
		if q, err := a.Quota(ctx); err != nil || q != 3 {
			t.Errorf("quota %d, %v; want the 3 vconns consumed", q, err)
		}
		return a
	}
	talk := func(a *vconn.Client, msg string) {
		t.Helper()
		if err := agenttest.Exchange(ctx, a, ln, "node-b:7000", msg); err != nil {
			t.Fatal(err)
		}
	}
	a := connect()
	talk(a, "hello by DRA")
	a.Close()

	// The agent restarts: its allocations are gone until sync restores
	// them from the specs.
	if err := node.Restart(); err != nil {
		t.Fatal(err)
	}
	if err := node.Agent.RegisterPod(pod); err != nil {
		t.Fatal(err)
	}
	if als, err := (deviceplugin.AdminAgent{Path: node.Config.AdminSocket}).ListAllocations(ctx); err != nil || len(als) != 0 {
		t.Fatalf("the restarted agent has allocations %v, %v; want none", als, err)
	}
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		if err := d.Sync(ctx, publish); err == nil {
			break
		} else if time.Now().After(deadline) {
			t.Fatalf("sync after the agent's restart: %v", err)
		}
	}
	a = connect()
	talk(a, "hello again")
	a.Close()

	res2, err := d.UnprepareResourceClaims(ctx, []kubeletplugin.NamespacedObject{{NamespacedName: types.NamespacedName{Namespace: "ns", Name: c.Name}, UID: c.UID}})
	if err != nil || res2[c.UID] != nil {
		t.Fatalf("unprepare: %v, %v", err, res2[c.UID])
	}
	als, err := deviceplugin.AdminAgent{Path: node.Config.AdminSocket}.ListAllocations(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for _, al := range als {
		if strings.HasPrefix(al.ID, allocPrefix) {
			t.Errorf("allocation %s left after unprepare", al.ID)
		}
	}
}
