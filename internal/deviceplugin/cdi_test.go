package deviceplugin

import (
	"context"
	"os"
	"path/filepath"
	"slices"
	"testing"
	"time"

	oci "github.com/opencontainers/runtime-spec/specs-go"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"tags.cncf.io/container-device-interface/pkg/cdi"
)

// inject applies CDI devices to an empty container as a runtime's CDI
// cache does.
func inject(t *testing.T, dir string, devices ...string) (*oci.Spec, error) {
	t.Helper()
	cache, err := cdi.NewCache(cdi.WithSpecDirs(dir), cdi.WithAutoRefresh(false))
	if err != nil {
		t.Fatal(err)
	}
	spec := &oci.Spec{Process: &oci.Process{}}
	_, err = cache.InjectDevices(spec, devices...)
	return spec, err
}

// With CDI, a container's CDI device brings exactly the environment and
// mount of the Allocate response, from the spec Allocate wrote.
func TestAllocateWritesCDISpec(t *testing.T) {
	fa := newFakeAgent("/run/rv", 8)
	p := testPlugin(t, fa, true)
	rep, err := (&server{p: p}).Allocate(context.Background(), containers(ids(0, 1)))
	if err != nil {
		t.Fatal(err)
	}
	cr := rep.ContainerResponses[0]
	if len(cr.CdiDevices) != 1 {
		t.Fatalf("CDI devices %v", cr.CdiDevices)
	}
	spec, err := inject(t, p.opts.CDISpecDir, cr.CdiDevices[0].Name)
	if err != nil {
		t.Fatalf("the runtime cannot resolve %s: %v", cr.CdiDevices[0].Name, err)
	}
	var want []string
	for k, v := range cr.Envs {
		want = append(want, k+"="+v)
	}
	if got := spec.Process.Env; !slices.Equal(slices.Sorted(slices.Values(got)), slices.Sorted(slices.Values(want))) {
		t.Errorf("CDI env %v, want the response's %v", got, want)
	}
	if len(spec.Mounts) != 1 || spec.Mounts[0].Source != cr.Mounts[0].HostPath || spec.Mounts[0].Destination != cr.Mounts[0].ContainerPath ||
		!slices.Contains(spec.Mounts[0].Options, "ro") {
		t.Errorf("CDI mounts %+v, want the response's %v read-only", spec.Mounts, cr.Mounts)
	}
}

// A spec that cannot be written fails Allocate and leaves no allocation;
// a failed Allocate removes the specs it wrote.
func TestAllocateCDIFailures(t *testing.T) {
	fa := newFakeAgent("/run/rv", 8)
	p := testPlugin(t, fa, true)
	dir := p.opts.CDISpecDir
	if err := os.Remove(dir); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(dir, nil, 0o644); err != nil { // a file where the directory should be
		t.Fatal(err)
	}
	if _, err := (&server{p: p}).Allocate(context.Background(), containers(ids(0))); status.Code(err) != codes.Internal {
		t.Fatalf("Allocate with an unwritable spec directory: %v, want Internal", err)
	}
	if got := fa.IDs(); len(got) != 0 {
		t.Errorf("allocations left: %v", got)
	}

	fa = newFakeAgent("/run/rv", 2)
	p = testPlugin(t, fa, true)
	if _, err := (&server{p: p}).Allocate(context.Background(), containers(ids(0), ids(1, 2))); status.Code(err) != codes.ResourceExhausted {
		t.Fatalf("Allocate over quota: %v", err)
	}
	if names, err := p.cdi.Names(); err != nil || len(names) != 0 {
		t.Errorf("specs left by a failed Allocate: %v, %v", names, err)
	}
}

// Collection removes the spec of an allocation it deletes and of one
// the agent no longer has, writes the missing spec of a live one, and
// keeps a spec Allocate wrote within GCGrace.
func TestCollectSyncsCDISpecs(t *testing.T) {
	live, gone, fresh := ids(0, 1), ids(2), ids(3)
	liveID, goneID, freshID := AllocationID(&testKey, live), AllocationID(&testKey, gone), AllocationID(&testKey, fresh)
	fa := newFakeAgent("/run/rv", 8)
	p := testPlugin(t, fa, true)
	p.opts.PodResources = &fakePods{held: [][]string{live}}
	s := &server{p: p}
	for _, c := range [][]string{live, gone, fresh} {
		if _, err := s.Allocate(context.Background(), containers(c)); err != nil {
			t.Fatal(err)
		}
	}
	// The live allocation's spec was lost (tmpfs wiped); the gone one is
	// no longer recent; a stray spec of an allocation the agent never had.
	if err := p.cdi.Remove(liveID); err != nil {
		t.Fatal(err)
	}
	if err := p.cdi.Write("dp-stray", edits(p.containerResponse("dp-stray", 1))); err != nil {
		t.Fatal(err)
	}
	p.mu.Lock()
	p.created[goneID] = time.Now().Add(-2 * p.opts.GCGrace)
	p.created[liveID] = time.Now().Add(-2 * p.opts.GCGrace)
	p.mu.Unlock()
	deleted, err := p.collect(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(deleted, []string{goneID}) {
		t.Errorf("deleted %v, want %s", deleted, goneID)
	}
	want := slices.Sorted(slices.Values([]string{liveID, freshID}))
	if names, err := p.cdi.Names(); err != nil || !slices.Equal(names, want) {
		t.Errorf("specs after collection %v, %v; want %v", names, err, want)
	}
	if _, err := inject(t, p.opts.CDISpecDir, p.cdi.Device(liveID)); err != nil {
		t.Errorf("the rewritten spec does not resolve: %v", err)
	}
	if _, ok := fa.Allocs[goneID]; ok {
		t.Error("the gone allocation is still in the agent")
	}
	if _, err := os.Stat(filepath.Join(p.opts.CDISpecDir, "rdmavisor.io-vconn_dp-stray.json")); !os.IsNotExist(err) {
		t.Errorf("stray spec: %v", err)
	}
}
