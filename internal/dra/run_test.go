package dra

import (
	"context"
	"os"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/fake"
	"k8s.io/dynamic-resource-allocation/kubeletplugin"
)

// Run registers the plugin's sockets and publishes the node's pool as a
// ResourceSlice through the API.
func TestRunPublishes(t *testing.T) {
	dir, err := os.MkdirTemp("", "dra") // short: a socket path has 108 bytes
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	// The controller makes the Node the slices' owner.
	kube := fake.NewClientset(&corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "node-a", UID: "node-a-uid"}})
	d := testDriver(t, newFakeAgent(8))
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		done <- d.Run(ctx, kube, kubeletplugin.RegistrarDirectoryPath(dir), kubeletplugin.PluginDataDirectoryPath(dir))
	}()
	deadline := time.Now().Add(20 * time.Second)
	for {
		slices, err := kube.ResourceV1().ResourceSlices().List(ctx, metav1.ListOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if len(slices.Items) == 1 {
			s := slices.Items[0]
			if s.Spec.Driver != DefaultDriverName || s.Spec.Pool.Name != "node-a" || s.Spec.NodeName == nil || *s.Spec.NodeName != "node-a" ||
				len(s.Spec.Devices) != 1 || s.Spec.Devices[0].Name != "mlx5-1" {
				t.Errorf("slice %+v", s.Spec)
			}
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("no ResourceSlice published")
		}
		time.Sleep(50 * time.Millisecond)
	}
	for _, sock := range []string{DefaultDriverName + "-reg.sock", "dra.sock"} {
		if fi, err := os.Stat(dir + "/" + sock); err != nil || fi.Mode()&os.ModeSocket == 0 {
			t.Errorf("socket %s: %v", sock, err)
		}
	}
	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
}
