package deviceplugin_test

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/go-logr/logr/testr"
	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/goleak"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"

	"github.com/rdmavisor/rdmavisor/internal/admin"
	"github.com/rdmavisor/rdmavisor/internal/admin/admintest"
	"github.com/rdmavisor/rdmavisor/internal/agent/agenttest"
	"github.com/rdmavisor/rdmavisor/internal/config"
	"github.com/rdmavisor/rdmavisor/internal/deviceplugin"
	"github.com/rdmavisor/rdmavisor/internal/poll"
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
	if o.Agent != nil {
		o.Agent = withAdmin(o.Agent, cfg.AdminSocket)
	}
	cfg.VConnsPerNode = devices
	cfg.StateDir = stateDir
	o.Config = &cfg
	o.KubeletDir = dir
	o.PodResourcesSocket = filepath.Join(dir, "pod-resources.sock")
	o.Registerer = e.reg
	if o.HealthInterval == 0 {
		o.HealthInterval = 50 * time.Millisecond
	}
	if o.RetryInterval == 0 {
		o.RetryInterval = 100 * time.Millisecond
	}
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
		Agent: admintest.New(devices), HealthInterval: 50 * time.Millisecond, RetryInterval: time.Hour})
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
