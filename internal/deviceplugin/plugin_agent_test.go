package deviceplugin_test

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"sync/atomic"
	"testing"
	"time"

	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"

	"github.com/rdmavisor/rdmavisor/internal/admin"
	"github.com/rdmavisor/rdmavisor/internal/deviceplugin"
	"github.com/rdmavisor/rdmavisor/internal/poll"
	"github.com/rdmavisor/rdmavisor/pkg/vconn"
)

func TestGarbageCollection(t *testing.T) {
	ctx := testCtx(t)
	var stale string
	e := setup(t, deviceplugin.Options{GCInterval: 50 * time.Millisecond, GCGrace: time.Millisecond}, func(e *env) {
		// Left by an earlier plugin whose pod is gone, and one the device
		// plugin did not make.
		stale = e.id(ids(5))
		for _, id := range []string{stale, "other"} {
			if _, err := e.cl.Nodes[0].Allocate(ctx, id, 1); err != nil {
				t.Fatal(err)
			}
		}
	})
	poll.Until(t, 15*time.Second, "the stale allocation is collected at start", func() bool {
		_, ok := e.allocations(t)[stale]
		return !ok
	})
	if _, ok := e.allocations(t)["other"]; !ok {
		t.Fatal("collected an allocation the device plugin did not make")
	}

	// Listed before Allocate (the kubelet lists them after), so that a
	// GCGrace of 1ms cannot collect them in between.
	podA, podB := ids(0), ids(1, 2)
	e.pods.set("a", podA)
	e.pods.set("b", podB)
	if _, err := e.client.Allocate(ctx, allocReq(podA)); err != nil {
		t.Fatal(err)
	}
	if _, err := e.client.Allocate(ctx, allocReq(podB)); err != nil {
		t.Fatal(err)
	}
	idA, idB := e.id(podA), e.id(podB)
	time.Sleep(300 * time.Millisecond) // several passes
	have := e.allocations(t)
	for _, id := range []string{idA, idB, "other"} {
		if _, ok := have[id]; !ok {
			t.Fatalf("allocation %s of a live pod collected; have %v", id, have)
		}
	}

	e.pods.set("a", nil)
	poll.Until(t, 15*time.Second, "pod a's allocation is collected", func() bool {
		_, ok := e.allocations(t)[idA]
		return !ok
	})
	time.Sleep(200 * time.Millisecond)
	got := e.allocations(t)
	keys := make([]string, 0, len(got))
	for id := range got {
		keys = append(keys, id)
	}
	slices.Sort(keys)
	if want := slices.Sorted(slices.Values([]string{idB, "other"})); !slices.Equal(keys, want) {
		t.Errorf("allocations %v, want %v", keys, want)
	}
	// The counters move just after the agent lets the allocation go.
	poll.Until(t, 15*time.Second, "2 allocations collected, 2 devices allocated", func() bool {
		return e.metric(t, "rdmavisor_device_plugin_allocations_collected_total") == 2 &&
			e.metric(t, "rdmavisor_device_plugin_devices_allocated") == 2
	})
}

// A restarted agent has lost its allocations: the plugin re-creates those
// of running pods as soon as the agent is healthy again.
func TestAgentRestartRecreatesAllocations(t *testing.T) {
	e := setup(t, deviceplugin.Options{GCInterval: time.Hour}, nil)
	ctx := testCtx(t)
	devs := ids(4, 5, 6)
	rep, err := e.client.Allocate(ctx, allocReq(devs))
	if err != nil {
		t.Fatal(err)
	}
	e.pods.set("a", devs) // the kubelet records the devices after Allocate
	id := e.id(devs)
	w := watch(t, e.client)
	w.waitAll(t, devices, pluginapi.Healthy)
	if err := e.cl.Nodes[0].Restart(); err != nil {
		t.Fatal(err)
	}
	// The counter moves after the agent holds the allocation again (and
	// the plugin bound it): wait for both.
	poll.Until(t, 15*time.Second, "the allocation is re-created", func() bool {
		return e.allocations(t)[id].VConns == len(devs) &&
			e.metric(t, "rdmavisor_device_plugin_allocations_recreated_total") > 0
	})
	m := rep.ContainerResponses[0].Mounts[0]
	a, err := vconn.NewClient(ctx, vconn.Options{Socket: filepath.Join(m.HostPath, admin.SocketName)})
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	if q, err := a.Quota(ctx); err != nil || q != len(devs) {
		t.Errorf("quota %d, %v; want %d", q, err, len(devs))
	}
	if got := e.metric(t, "rdmavisor_device_plugin_allocations_recreated_total"); got != 1 {
		t.Errorf("re-created %v, want 1", got)
	}
}

// An agent that restarts is probed again within moments until it is
// ready, not at the next HealthInterval: its pods' sockets are missing
// until the plugin re-creates their allocations, which it does once the
// agent says ready.
func TestRestartedAgentProbedUntilReady(t *testing.T) {
	slow := &slowReady{}
	ctx := testCtx(t)
	devs := ids(1, 2)
	var id string
	// A running pod's allocation, made before this plugin (an Allocate
	// would ask for passes of its own for a while after).
	e := setup(t, deviceplugin.Options{GCInterval: time.Hour, HealthInterval: time.Hour, RetryInterval: time.Hour, Agent: slow}, func(e *env) {
		e.pods.set("a", devs)
		id = e.id(devs)
		if _, err := e.cl.Nodes[0].Allocate(ctx, id, len(devs)); err != nil {
			t.Fatal(err)
		}
	})
	poll.Until(t, 5*time.Second, "the plugin healthy", func() bool {
		return e.metric(t, "rdmavisor_device_plugin_devices_healthy") == devices
	})
	// Not ready for its first 300 ms back: the probe its admin socket's
	// creation makes finds it not ready.
	slow.notReadyFor(300 * time.Millisecond)
	if err := e.cl.Nodes[0].Restart(); err != nil {
		t.Fatal(err)
	}
	poll.Until(t, 5*time.Second, "the allocation re-created, long before the next HealthInterval", func() bool {
		return e.allocations(t)[id].VConns == len(devs)
	})
}

// slowReady is the admin socket's agent, which says it is not ready until
// a time set: a restarted agent whose engine is still starting.
type slowReady struct {
	admin.Agent
	until atomic.Int64 // unix nanoseconds
}

func (s *slowReady) notReadyFor(d time.Duration) { s.until.Store(time.Now().Add(d).UnixNano()) }

func (s *slowReady) Status(ctx context.Context) (admin.Status, error) {
	st, err := s.Agent.Status(ctx)
	if err == nil && s.starting() {
		st.Ready = false
	}
	return st, err
}

// ListAllocations fails while the agent starts, as an admin socket that
// exists before its server serves: the collection pass its creation asks
// for finds nothing to re-create from.
func (s *slowReady) ListAllocations(ctx context.Context) ([]admin.Allocation, error) {
	if s.starting() {
		return nil, errors.New("the agent is starting")
	}
	return s.Agent.ListAllocations(ctx)
}

func (s *slowReady) starting() bool { return time.Now().UnixNano() < s.until.Load() }

// withAdmin gives a wrapping agent of the tests its admin socket.
func withAdmin(a admin.Agent, sock string) admin.Agent {
	if s, ok := a.(*slowReady); ok && s.Agent == nil {
		s.Agent = deviceplugin.AdminAgent{Path: sock}
	}
	return a
}

// The directory of a device plugin allocation that neither the agent nor
// a running pod has (its pod went while the agent was down) is removed by
// a collection pass; a running pod's is kept (its allocation re-created
// there), and what the device plugin did not make is left alone.
func TestGarbageCollectionRemovesOrphanDirectories(t *testing.T) {
	ctx := testCtx(t)
	devs := ids(3)
	var alloc, orphan, held, other string
	e := setup(t, deviceplugin.Options{GCInterval: time.Hour}, func(e *env) {
		alloc = filepath.Join(e.cl.Nodes[0].Config.SocketDir, "alloc")
		held = filepath.Join(alloc, e.id(devs))
		e.pods.set("a", devs)
		orphan = filepath.Join(alloc, e.id(ids(7)))
		other = filepath.Join(alloc, "host-service")
		for _, d := range []string{orphan, other} {
			if err := os.MkdirAll(d, 0o755); err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(filepath.Join(d, admin.SocketName), nil, 0o600); err != nil {
				t.Fatal(err)
			}
		}
	})
	poll.Until(t, 15*time.Second, "the orphan's directory removed, the running pod's allocation re-created", func() bool {
		_, err := os.Stat(orphan)
		return errors.Is(err, os.ErrNotExist) && e.allocations(t)[filepath.Base(held)].VConns == len(devs)
	})
	for _, d := range []string{held, other} {
		if _, err := os.Stat(d); err != nil {
			t.Errorf("%s: %v, want it kept", d, err)
		}
	}
	a, err := vconn.NewClient(ctx, vconn.Options{Socket: filepath.Join(held, admin.SocketName)})
	if err != nil {
		t.Fatalf("the running pod's socket: %v", err)
	}
	a.Close()
}
