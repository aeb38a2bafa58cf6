package deviceplugin_test

import (
	"context"
	"errors"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"

	"github.com/rdmavisor/rdmavisor/internal/config"
	"github.com/rdmavisor/rdmavisor/internal/deviceplugin"
	"github.com/rdmavisor/rdmavisor/internal/poll"
)

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
