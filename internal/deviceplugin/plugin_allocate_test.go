package deviceplugin_test

import (
	"fmt"
	"path/filepath"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"

	"github.com/rdmavisor/rdmavisor/internal/admin"
	"github.com/rdmavisor/rdmavisor/internal/agent/agenttest"
	"github.com/rdmavisor/rdmavisor/internal/deviceplugin"
	"github.com/rdmavisor/rdmavisor/internal/poll"
	"github.com/rdmavisor/rdmavisor/pkg/vconn"
)

func TestAllocateWorks(t *testing.T) {
	e := setup(t, deviceplugin.Options{}, nil)
	ctx := testCtx(t)
	// The server: an allocation on node-b, listening on port 7000.
	b, err := e.cl.Nodes[1].Client(ctx, "server", 8)
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
			if err := agenttest.Exchange(ctx, a, ln, "node-b:7000", fmt.Sprintf("hello from %d devices", k)); err != nil {
				t.Fatal(err)
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
