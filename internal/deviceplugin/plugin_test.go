package deviceplugin_test

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/go-logr/logr/testr"
	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/goleak"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"

	"github.com/rdmavisor/rdmavisor/internal/admin"
	"github.com/rdmavisor/rdmavisor/internal/agent/agenttest"
	"github.com/rdmavisor/rdmavisor/internal/config"
	"github.com/rdmavisor/rdmavisor/internal/deviceplugin"
	"github.com/rdmavisor/rdmavisor/internal/poll"
	"github.com/rdmavisor/rdmavisor/pkg/vconn"
)

// Every goroutine of the plugin, the fake kubelet and the agents ends.
func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// env is a plugin on node-a of two agents, with a fake kubelet.
type env struct {
	cl      *agenttest.Cluster
	dir     string // the kubelet's device-plugin directory
	kubelet *fakeKubelet
	pods    *fakePodResources
	reg     *prometheus.Registry
	reg0    *pluginapi.RegisterRequest // the first registration
	client  pluginapi.DevicePluginClient
	key     deviceplugin.Key // the node's key, made before the plugin starts
}

// id is the allocation id the plugin derives from devs.
func (e *env) id(devs []string) string { return deviceplugin.AllocationID(&e.key, devs) }

const devices = 8

// setup starts the agents, the fake kubelet and the plugin; before runs
// between the agents' start and the plugin's.
func setup(t *testing.T, o deviceplugin.Options, before func(*env)) *env {
	t.Helper()
	ao := agenttest.Options{}
	if testing.Verbose() {
		ao.Log = testr.New(t)
		o.Log = testr.New(t)
	}
	cl, err := agenttest.Start(ao)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := cl.Close(); err != nil {
			t.Errorf("closing the agents: %v", err)
		}
	})
	// Short: unix socket paths are limited to 107 bytes.
	dir, err := os.MkdirTemp("", "dp")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = os.RemoveAll(dir) })
	e := &env{cl: cl, dir: dir, reg: prometheus.NewRegistry()}
	// The key a plugin that ran before made: this one reads it.
	stateDir := filepath.Join(dir, "state")
	if e.key, _, err = deviceplugin.LoadOrCreateKey(filepath.Join(stateDir, deviceplugin.KeyFile)); err != nil {
		t.Fatal(err)
	}
	e.kubelet = startKubelet(t, dir)
	e.pods = startPodResources(t, filepath.Join(dir, "pod-resources.sock"))
	if before != nil {
		before(e)
	}
	cfg := *cl.Nodes[0].Config
	cfg.VConnsPerNode = devices
	cfg.StateDir = stateDir
	o.Config = &cfg
	o.KubeletDir = dir
	o.PodResourcesSocket = filepath.Join(dir, "pod-resources.sock")
	o.Registerer = e.reg
	o.HealthInterval = 50 * time.Millisecond
	o.RetryInterval = 100 * time.Millisecond
	if o.GCInterval == 0 {
		o.GCInterval = time.Hour
	}
	p, err := deviceplugin.New(o)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- p.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Run: %v", err)
		}
	})
	e.reg0 = e.kubelet.registration(t)
	e.client = pluginClient(t, dir, e.reg0.Endpoint)
	return e
}

func testCtx(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	t.Cleanup(cancel)
	return ctx
}

func ids(is ...int) []string {
	out := make([]string, len(is))
	for k, i := range is {
		out[k] = deviceplugin.DeviceID(i)
	}
	return out
}

func allocReq(reqs ...[]string) *pluginapi.AllocateRequest {
	r := &pluginapi.AllocateRequest{}
	for _, ids := range reqs {
		r.ContainerRequests = append(r.ContainerRequests, &pluginapi.ContainerAllocateRequest{DevicesIds: ids})
	}
	return r
}

// metric reads a gauge or counter of the plugin.
func (e *env) metric(t *testing.T, name string) float64 {
	t.Helper()
	mfs, err := e.reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
		v := 0.0
		for _, m := range mf.GetMetric() {
			v += m.GetGauge().GetValue() + m.GetCounter().GetValue()
		}
		return v
	}
	return 0
}

// allocations lists node-a's allocations, by id.
func (e *env) allocations(t *testing.T) map[string]admin.Allocation {
	t.Helper()
	ctx := testCtx(t)
	c, err := admin.Dial(ctx, e.cl.Nodes[0].Config.AdminSocket)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	als, err := c.ListAllocations(ctx)
	if err != nil {
		t.Fatal(err)
	}
	out := make(map[string]admin.Allocation, len(als))
	for _, al := range als {
		out[al.ID] = al
	}
	return out
}

func TestRegistrationAndHealth(t *testing.T) {
	e := setup(t, deviceplugin.Options{}, nil)
	r := e.reg0
	if r.Version != pluginapi.Version || r.ResourceName != "rdmavisor.io/vconn" ||
		!strings.HasPrefix(r.Endpoint, "rdmavisor.io_vconn-") || !strings.HasSuffix(r.Endpoint, ".sock") ||
		!r.Options.GetGetPreferredAllocationAvailable() || r.Options.GetPreStartRequired() {
		t.Errorf("registration %v", r)
	}
	ctx := testCtx(t)
	opts, err := e.client.GetDevicePluginOptions(ctx, &pluginapi.Empty{})
	if err != nil || !opts.GetPreferredAllocationAvailable || opts.PreStartRequired {
		t.Errorf("GetDevicePluginOptions = %v, %v", opts, err)
	}
	w := watch(t, e.client)
	w.waitAll(t, devices, pluginapi.Healthy)
	if got := e.metric(t, "rdmavisor_device_plugin_devices_advertised"); got != devices {
		t.Errorf("devices advertised %v, want %d", got, devices)
	}
	poll.Until(t, 15*time.Second, "the healthy metric counts every device", func() bool {
		return e.metric(t, "rdmavisor_device_plugin_devices_healthy") == devices
	})

	// The agent goes away: every device is Unhealthy; and recovers.
	if err := e.cl.Nodes[0].Stop(); err != nil {
		t.Fatal(err)
	}
	w.waitAll(t, devices, pluginapi.Unhealthy)
	poll.Until(t, 15*time.Second, "the healthy metric is 0", func() bool {
		return e.metric(t, "rdmavisor_device_plugin_devices_healthy") == 0
	})
	if err := e.cl.Nodes[0].Restart(); err != nil {
		t.Fatal(err)
	}
	w.waitAll(t, devices, pluginapi.Healthy)
	poll.Until(t, 15*time.Second, "the healthy metric recovers", func() bool {
		return e.metric(t, "rdmavisor_device_plugin_devices_healthy") == devices
	})
}

func TestAllocateWorks(t *testing.T) {
	e := setup(t, deviceplugin.Options{}, nil)
	ctx := testCtx(t)
	// The server: an allocation on node-b, listening on port 7000.
	sockB, err := e.cl.Nodes[1].Allocate(ctx, "server", 8)
	if err != nil {
		t.Fatal(err)
	}
	b, err := vconn.NewClient(ctx, vconn.Options{Socket: sockB})
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	ln, err := b.Listen(ctx, ":7000")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()

	for _, devs := range [][]string{ids(0), ids(3, 1, 2)} {
		t.Run(fmt.Sprint(len(devs)), func(t *testing.T) {
			k := len(devs)
			rep, err := e.client.Allocate(ctx, allocReq(devs))
			if err != nil {
				t.Fatal(err)
			}
			cr := rep.ContainerResponses[0]
			id := e.id(devs)
			if len(cr.Mounts) != 1 {
				t.Fatalf("mounts %v, want one", cr.Mounts)
			}
			m := cr.Mounts[0]
			if m.HostPath != filepath.Join(e.cl.Nodes[0].Config.SocketDir, "alloc", id) || m.ContainerPath != deviceplugin.ContainerSocketDir {
				t.Errorf("mount %v", m)
			}
			if cr.Envs[vconn.EnvVConns] != fmt.Sprint(k) || cr.Envs[vconn.EnvSocket] != m.ContainerPath+"/"+admin.SocketName {
				t.Errorf("env %v", cr.Envs)
			}
			if al := e.allocations(t)[id]; al.VConns != k {
				t.Errorf("allocation %s has %d vconns, want %d", id, al.VConns, k)
			}

			// The kubelet lists the pod's devices, the CNI plugin registers
			// it: the device plugin binds the allocation to it, so that
			// it dials as its pod.
			pod := fmt.Sprintf("client-%d", k)
			e.pods.set(pod, devs)
			if err := e.cl.Nodes[0].Agent.RegisterPod(admin.Pod{UID: "uid-" + pod, Namespace: "default", Name: pod,
				IPs: []string{fmt.Sprintf("10.244.0.%d", k)}}); err != nil {
				t.Fatal(err)
			}
			poll.Until(t, 15*time.Second, "the allocation bound to its pod", func() bool { return e.allocations(t)[id].Pod == "default/"+pod })

			// The pod's view: the socket the env names, inside the mount.
			sock := filepath.Join(m.HostPath, filepath.Base(cr.Envs[vconn.EnvSocket]))
			a, err := vconn.NewClient(ctx, vconn.Options{Socket: sock})
			if err != nil {
				t.Fatal(err)
			}
			defer a.Close()
			if q, err := a.Quota(ctx); err != nil || q != k {
				t.Errorf("quota %d, %v; want %d", q, err, k)
			}
			c, err := a.Dial(ctx, "node-b:7000")
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			s, err := ln.AcceptVConn()
			if err != nil {
				t.Fatal(err)
			}
			defer s.Close()
			msg := fmt.Sprintf("hello from %d devices", k)
			if err := c.SendMsg(ctx, []byte(msg)); err != nil {
				t.Fatal(err)
			}
			got, err := s.RecvMsg(ctx)
			if err != nil || string(got.Data) != msg {
				t.Fatalf("received %q, %v; want %q", got.Data, err, msg)
			}

			// A retried Allocate answers the same and allocates nothing more.
			n := len(e.allocations(t))
			rep2, err := e.client.Allocate(ctx, allocReq(devs))
			if err != nil {
				t.Fatal(err)
			}
			if rep2.ContainerResponses[0].Mounts[0].HostPath != m.HostPath || len(e.allocations(t)) != n {
				t.Errorf("retried Allocate: %v, %d allocations, want %d", rep2, len(e.allocations(t)), n)
			}
		})
	}
	poll.Until(t, 15*time.Second, "the allocated metric counts 4 devices", func() bool {
		return e.metric(t, "rdmavisor_device_plugin_devices_allocated") == 4
	})
}

func TestAllocateBadInput(t *testing.T) {
	e := setup(t, deviceplugin.Options{}, nil)
	ctx := testCtx(t)
	for name, req := range map[string]*pluginapi.AllocateRequest{
		"unknown device":          allocReq([]string{"vconn-0008"}),
		"foreign device":          allocReq([]string{"nvidia0"}),
		"more than advertised":    allocReq(ids(0, 1, 2, 3, 4, 5, 6, 7, 0)),
		"duplicate":               allocReq(ids(2, 2)),
		"one bad container":       allocReq(ids(0), []string{"vconn-9999"}),
		"no container requests":   allocReq(),
		"empty container request": allocReq(nil),
	} {
		t.Run(name, func(t *testing.T) {
			_, err := e.client.Allocate(ctx, req)
			if status.Code(err) != codes.InvalidArgument {
				t.Errorf("Allocate: %v, want InvalidArgument", err)
			}
			if als := e.allocations(t); len(als) != 0 {
				t.Errorf("allocations after a bad Allocate: %v", als)
			}
		})
	}
}

// TestStaleSockets: a plugin serves a socket of its own and removes those
// earlier plugins for its resource left (a killed one removes nothing), as
// this and earlier versions named them, and nothing else: not another
// plugin's, not a socket of another rdmavisor.io resource whose name starts
// with this one's (another service's plugin, rdmavisor.io/vconn-ib).
func TestStaleSockets(t *testing.T) {
	stale := []string{"rdmavisor.io_vconn.sock", "rdmavisor.io_vconn-1-old.sock", "rdmavisor.io_vconn-12-k2x9a-3.sock"}
	keepSockets := []string{"other.io_dev.sock", "rdmavisor.io_vconn-ib-12-k2x9a-3.sock", "rdmavisor.io_vconn-ib.sock",
		"rdmavisor.io_vconn-2.sock"}
	keep := append([]string{"rdmavisor.io_vconn-notes.txt"}, keepSockets...)
	e := setup(t, deviceplugin.Options{}, func(e *env) {
		for _, name := range stale {
			ln, err := net.Listen("unix", filepath.Join(e.dir, name))
			if err != nil {
				t.Fatal(err)
			}
			ln.(*net.UnixListener).SetUnlinkOnClose(false) // as a killed process leaves it
			_ = ln.Close()
		}
		for _, name := range keepSockets {
			ln, err := net.Listen("unix", filepath.Join(e.dir, name))
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { _ = ln.Close() })
		}
		if err := os.WriteFile(filepath.Join(e.dir, keep[0]), nil, 0o600); err != nil {
			t.Fatal(err)
		}
	})
	if slices.Contains(stale, e.reg0.Endpoint) {
		t.Fatalf("the plugin registered at an earlier plugin's socket %s", e.reg0.Endpoint)
	}
	for _, name := range stale {
		if _, err := os.Stat(filepath.Join(e.dir, name)); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("earlier plugin's socket %s left (stat: %v)", name, err)
		}
	}
	for _, name := range append(keep, e.reg0.Endpoint) {
		if _, err := os.Stat(filepath.Join(e.dir, name)); err != nil {
			t.Errorf("%s removed: %v", name, err)
		}
	}
}

// TestForeignResourceRefused: a plugin configured for another vendor's
// resource (an RDMAService's resourceName before the schema restricted it)
// does not start, so it neither takes the resource over at the kubelet nor
// removes that vendor's plugin socket, which is named as this plugin would
// name its own. Other plugins' sockets removed: 0.
func TestForeignResourceRefused(t *testing.T) {
	dir, err := os.MkdirTemp("", "dp")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = os.RemoveAll(dir) })
	theirs := []string{"nvidia.com_gpu.sock", "nvidia.com_gpu-1-old-1.sock"}
	for _, name := range theirs {
		ln, err := net.Listen("unix", filepath.Join(dir, name))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = ln.Close() })
	}
	key, _, err := deviceplugin.LoadOrCreateKey(filepath.Join(dir, "key"))
	if err != nil {
		t.Fatal(err)
	}
	cfg := config.Default()
	cfg.ResourceName = "nvidia.com/gpu"
	cfg.AdminSocket = filepath.Join(dir, "admin.sock")
	p, err := deviceplugin.New(deviceplugin.Options{Config: cfg, KubeletDir: dir, Key: &key,
		PodResourcesSocket: filepath.Join(dir, "pod-resources.sock"), RetryInterval: 50 * time.Millisecond})
	if err == nil {
		// What a plugin that starts does first: run it for a moment.
		ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
		err = p.Run(ctx)
		cancel()
		if err == nil {
			err = errors.New("New and Run accepted it")
		}
		t.Errorf("a plugin for nvidia.com/gpu: %v; want New to refuse it", err)
	} else if !strings.Contains(err.Error(), "not in the rdmavisor.io domain") {
		t.Errorf("New: %v, want a refusal naming the domain", err)
	}
	removed := 0
	for _, name := range theirs {
		if _, err := os.Stat(filepath.Join(dir, name)); err != nil {
			removed++
		}
	}
	if removed != 0 {
		t.Errorf("the other plugin's sockets removed: %d, want 0", removed)
	}
}

// TestReregister: the plugin registers again when the kubelet restarts or
// its socket goes, each time at a socket of its own (the kubelet keys a
// plugin by resource and socket), and the last one is removed.
func TestReregister(t *testing.T) {
	e := setup(t, deviceplugin.Options{}, nil)
	ctx := testCtx(t)

	// The kubelet restarts: its socket goes, and comes back.
	e.kubelet.stop()
	if err := os.Remove(filepath.Join(e.dir, "kubelet.sock")); err != nil && !errors.Is(err, os.ErrNotExist) {
		t.Fatal(err)
	}
	k2 := startKubelet(t, e.dir)
	r := k2.registration(t)
	if r.ResourceName != e.reg0.ResourceName || r.Endpoint == e.reg0.Endpoint {
		t.Errorf("registration after the kubelet restarted: %v, want a new socket (the first was %s)", r, e.reg0.Endpoint)
	}
	if _, err := os.Stat(filepath.Join(e.dir, e.reg0.Endpoint)); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("the first socket is still there (stat: %v)", err)
	}
	c := pluginClient(t, e.dir, r.Endpoint)
	if _, err := c.GetDevicePluginOptions(ctx, &pluginapi.Empty{}); err != nil {
		t.Errorf("the plugin does not answer after re-registering: %v", err)
	}

	// Someone removes the plugin's socket (a kubelet starting does).
	if err := os.Remove(filepath.Join(e.dir, r.Endpoint)); err != nil {
		t.Fatal(err)
	}
	r3 := k2.registration(t)
	if r3.Endpoint == r.Endpoint {
		t.Errorf("registered again at the socket that was removed: %s", r3.Endpoint)
	}
	w := watch(t, pluginClient(t, e.dir, r3.Endpoint))
	w.waitAll(t, devices, pluginapi.Healthy)
	poll.Until(t, 15*time.Second, "the registrations metric counts 3", func() bool {
		return e.metric(t, "rdmavisor_device_plugin_registrations_total") >= 3
	})
}

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

// readyAgent is an agent that is always ready and holds nothing.
type readyAgent struct{}

func (readyAgent) Status(context.Context) (admin.Status, error) {
	return admin.Status{Ready: true}, nil
}
func (readyAgent) CreateAllocation(_ context.Context, id string, k int) (admin.Allocation, error) {
	return admin.Allocation{ID: id, VConns: k}, nil
}
func (readyAgent) DeleteAllocation(context.Context, string) error              { return nil }
func (readyAgent) ListAllocations(context.Context) ([]admin.Allocation, error) { return nil, nil }
func (readyAgent) BindAllocation(context.Context, string, string) error        { return nil }

// The kubelet comes up after the plugin: registration is retried and
// succeeds at once when kubelet.sock appears; stopping the plugin leaves
// none of its goroutines behind.
func TestLateKubeletAndCleanStop(t *testing.T) {
	dir, err := os.MkdirTemp("", "dp")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = os.RemoveAll(dir) })
	pods := filepath.Join(dir, "pod-resources.sock")
	startPodResources(t, pods)
	ignore := goleak.IgnoreCurrent()

	cfg := config.Default()
	cfg.VConnsPerNode = devices
	cfg.AdminSocket = filepath.Join(dir, "agent", "admin.sock")
	cfg.StateDir = filepath.Join(dir, "state")
	reg := prometheus.NewRegistry()
	p, err := deviceplugin.New(deviceplugin.Options{Config: cfg, KubeletDir: dir, PodResourcesSocket: pods, Registerer: reg,
		Agent: readyAgent{}, HealthInterval: 50 * time.Millisecond, RetryInterval: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- p.Run(ctx) }()
	e := &env{reg: reg}
	poll.Until(t, 15*time.Second, "a registration fails", func() bool {
		return e.metric(t, "rdmavisor_device_plugin_registrations_total") >= 1
	})
	// RetryInterval is an hour: only kubelet.sock appearing retries.
	k := startKubelet(t, dir)
	r := k.registration(t)
	conn, err := grpc.NewClient("unix://"+filepath.Join(dir, r.Endpoint), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	w := watch(t, pluginapi.NewDevicePluginClient(conn))
	w.waitAll(t, devices, pluginapi.Healthy)

	cancel()
	if err := <-done; err != nil {
		t.Errorf("Run: %v", err)
	}
	if _, ok := <-w.updates; ok {
		// Drain: the stream ends when the plugin stops.
		for range w.updates {
		}
	}
	k.stop()
	_ = conn.Close()
	goleak.VerifyNone(t, ignore)
}
