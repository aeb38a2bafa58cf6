package deviceplugin_test

import (
	"context"
	"os"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"github.com/go-logr/logr/testr"
	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"

	"github.com/rdmavisor/rdmavisor/internal/admin/admintest"
	"github.com/rdmavisor/rdmavisor/internal/config"
	"github.com/rdmavisor/rdmavisor/internal/deviceplugin"
	"github.com/rdmavisor/rdmavisor/internal/poll"
)

// railsAgent is a ready agent of two rails, holding nothing.
func railsAgent() *admintest.Agent {
	a := admintest.New(devices)
	a.Device, a.Rails = "mlx5_0", []string{"mlx5_0", "mlx5_1"}
	return a
}

// setDown says why rail 1 of a is down ("": up).
func setDown(a *admintest.Agent, why string) {
	a.Lock()
	defer a.Unlock()
	a.RailDown = []string{"", why}
}

// waitHealth waits until an update has exactly the healths want, device
// by device.
func (w *watcher) waitHealth(t *testing.T, want []string) {
	t.Helper()
	timeout := time.After(15 * time.Second)
	var last []string
	for {
		select {
		case devs, ok := <-w.updates:
			if !ok {
				t.Fatalf("ListAndWatch ended before the devices were %v", want)
			}
			last = last[:0]
			for _, d := range devs {
				last = append(last, d.Health)
			}
			if slices.Equal(last, want) {
				return
			}
		case <-timeout:
			t.Fatalf("devices never %v; last %v", want, last)
		}
	}
}

// An agent of two rails whose rail 1 goes down: the ListAndWatch stream
// sends rail 1's devices (the second half) Unhealthy and rail 0's
// Healthy; when the rail is up again, all Healthy.
func TestRailDownListAndWatch(t *testing.T) {
	dir, err := os.MkdirTemp("", "dp")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = os.RemoveAll(dir) })
	pods := filepath.Join(dir, "pod-resources.sock")
	startPodResources(t, pods)
	k := startKubelet(t, dir)
	t.Cleanup(k.stop)

	cfg := config.Default()
	cfg.VConnsPerNode = devices
	cfg.AdminSocket = filepath.Join(dir, "agent", "admin.sock")
	cfg.StateDir = filepath.Join(dir, "state")
	reg := prometheus.NewRegistry()
	agent := railsAgent()
	o := deviceplugin.Options{Config: cfg, KubeletDir: dir, PodResourcesSocket: pods, Registerer: reg,
		Agent: agent, HealthInterval: 20 * time.Millisecond, RetryInterval: 100 * time.Millisecond}
	if testing.Verbose() {
		o.Log = testr.New(t)
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
	r := k.registration(t)
	conn, err := grpc.NewClient("unix://"+filepath.Join(dir, r.Endpoint), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = conn.Close() })
	w := watch(t, pluginapi.NewDevicePluginClient(conn))
	H, U := pluginapi.Healthy, pluginapi.Unhealthy
	half := devices / 2
	w.waitHealth(t, slices.Repeat([]string{H}, devices))

	setDown(agent, "port DOWN (phys state Disabled)")
	w.waitHealth(t, append(slices.Repeat([]string{H}, half), slices.Repeat([]string{U}, half)...))
	e := &env{reg: reg}
	poll.Until(t, 15*time.Second, "the healthy metric counts rail 0's devices", func() bool {
		return e.metric(t, "rdmavisor_device_plugin_devices_healthy") == float64(half)
	})

	setDown(agent, "")
	w.waitHealth(t, slices.Repeat([]string{H}, devices))
	poll.Until(t, 15*time.Second, "the healthy metric counts every device", func() bool {
		return e.metric(t, "rdmavisor_device_plugin_devices_healthy") == devices
	})
}
