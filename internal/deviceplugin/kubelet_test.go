package deviceplugin_test

import (
	"context"
	"net"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"
	podresourcesv1 "k8s.io/kubelet/pkg/apis/podresources/v1"
)

// fakeKubelet is the kubelet's registration service on
// <dir>/kubelet.sock.
type fakeKubelet struct {
	pluginapi.UnimplementedRegistrationServer
	dir  string
	regs chan *pluginapi.RegisterRequest
	srv  *grpc.Server
	done chan struct{}
}

func startKubelet(t *testing.T, dir string) *fakeKubelet {
	t.Helper()
	ln, err := net.Listen("unix", filepath.Join(dir, "kubelet.sock"))
	if err != nil {
		t.Fatal(err)
	}
	k := &fakeKubelet{dir: dir, regs: make(chan *pluginapi.RegisterRequest, 16), srv: grpc.NewServer(), done: make(chan struct{})}
	pluginapi.RegisterRegistrationServer(k.srv, k)
	go func() {
		defer close(k.done)
		_ = k.srv.Serve(ln)
	}()
	t.Cleanup(k.stop)
	return k
}

// stop stops serving and removes the socket.
func (k *fakeKubelet) stop() {
	k.srv.Stop()
	<-k.done
}

func (k *fakeKubelet) Register(_ context.Context, r *pluginapi.RegisterRequest) (*pluginapi.Empty, error) {
	k.regs <- r
	return &pluginapi.Empty{}, nil
}

// registration waits for the next Register.
func (k *fakeKubelet) registration(t *testing.T) *pluginapi.RegisterRequest {
	t.Helper()
	select {
	case r := <-k.regs:
		return r
	case <-time.After(10 * time.Second):
		t.Fatal("no registration")
		return nil
	}
}

// pluginClient connects to the plugin's endpoint, as the kubelet does.
func pluginClient(t *testing.T, dir, endpoint string) pluginapi.DevicePluginClient {
	t.Helper()
	c, err := grpc.NewClient("unix://"+filepath.Join(dir, endpoint), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() })
	return pluginapi.NewDevicePluginClient(c)
}

// watcher follows a ListAndWatch stream.
type watcher struct {
	updates chan []*pluginapi.Device
}

func watch(t *testing.T, c pluginapi.DevicePluginClient) *watcher {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	stream, err := c.ListAndWatch(ctx, &pluginapi.Empty{}, grpc.WaitForReady(true))
	if err != nil {
		cancel()
		t.Fatal(err)
	}
	w := &watcher{updates: make(chan []*pluginapi.Device, 64)}
	var wg sync.WaitGroup
	wg.Go(func() {
		defer close(w.updates)
		for {
			rep, err := stream.Recv()
			if err != nil {
				return
			}
			w.updates <- rep.Devices
		}
	})
	t.Cleanup(func() { cancel(); wg.Wait() })
	return w
}

// waitAll waits until an update has n devices, all with health h.
func (w *watcher) waitAll(t *testing.T, n int, h string) {
	t.Helper()
	timeout := time.After(15 * time.Second)
	for {
		select {
		case devs, ok := <-w.updates:
			if !ok {
				t.Fatalf("ListAndWatch ended before %d devices were %s", n, h)
			}
			if len(devs) != n {
				continue
			}
			all := true
			for _, d := range devs {
				all = all && d.Health == h
			}
			if all {
				return
			}
		case <-timeout:
			t.Fatalf("devices never all %s", h)
		}
	}
}

// fakePodResources is the kubelet's pod-resources API.
type fakePodResources struct {
	podresourcesv1.UnimplementedPodResourcesListerServer
	mu   sync.Mutex
	pods map[string][]string // pod name -> device IDs of its one container
}

func startPodResources(t *testing.T, path string) *fakePodResources {
	t.Helper()
	ln, err := net.Listen("unix", path)
	if err != nil {
		t.Fatal(err)
	}
	f := &fakePodResources{pods: map[string][]string{}}
	srv := grpc.NewServer()
	podresourcesv1.RegisterPodResourcesListerServer(srv, f)
	done := make(chan struct{})
	go func() {
		defer close(done)
		_ = srv.Serve(ln)
	}()
	t.Cleanup(func() { srv.Stop(); <-done })
	return f
}

func (f *fakePodResources) set(pod string, ids []string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if ids == nil {
		delete(f.pods, pod)
		return
	}
	f.pods[pod] = ids
}

func (f *fakePodResources) List(context.Context, *podresourcesv1.ListPodResourcesRequest) (*podresourcesv1.ListPodResourcesResponse, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	rep := &podresourcesv1.ListPodResourcesResponse{}
	for name, ids := range f.pods {
		rep.PodResources = append(rep.PodResources, &podresourcesv1.PodResources{
			Name: name, Namespace: "default",
			Containers: []*podresourcesv1.ContainerResources{{Name: "app", Devices: []*podresourcesv1.ContainerDevices{
				{ResourceName: "example.com/gpu", DeviceIds: []string{"gpu-0"}},
				{ResourceName: "rdmavisor.io/vconn", DeviceIds: ids},
			}}},
		})
	}
	return rep, nil
}
