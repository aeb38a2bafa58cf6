package rdmanode

import (
	"context"
	"net/netip"
	"testing"
	"time"

	"github.com/go-logr/logr"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes/fake"
	"k8s.io/client-go/tools/cache"
)

func pod(name, node string, phase corev1.PodPhase, host bool, ips ...string) *corev1.Pod {
	p := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "ns", UID: types.UID("uid-" + name + "-" + node)},
		Spec: corev1.PodSpec{NodeName: node, HostNetwork: host}, Status: corev1.PodStatus{Phase: phase}}
	for _, ip := range ips {
		p.Status.PodIPs = append(p.Status.PodIPs, corev1.PodIP{IP: ip})
	}
	return p
}

// TestPodIPs: the node of a running pod's IPs (both families); none for
// an ended pod (its IP may be reused), a host-network pod (its IP is its
// node's) or an IP two nodes' pods hold; a deleted pod's IP goes, a new
// one comes, as the watch says.
func TestPodIPs(t *testing.T) {
	kube := fake.NewClientset(
		pod("a", "node-a", corev1.PodRunning, false, "10.244.0.5", "fd00::5"),
		pod("done", "node-a", corev1.PodSucceeded, false, "10.244.0.6"),
		pod("host", "node-b", corev1.PodRunning, true, "192.168.1.2"),
		pod("x1", "node-a", corev1.PodRunning, false, "10.244.0.7"),
		pod("x2", "node-b", corev1.PodPending, false, "10.244.0.7"),
	)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	p, err := NewPodIPs(ctx, kube, logr.Discard())
	if err != nil {
		t.Fatal(err)
	}
	if !cache.WaitForCacheSync(ctx.Done(), p.HasSynced) {
		t.Fatal("not synced")
	}
	for ip, want := range map[string]string{"10.244.0.5": "node-a", "fd00::5": "node-a", "::ffff:10.244.0.5": "node-a",
		"10.244.0.6": "", "192.168.1.2": "", "10.244.0.7": "", "10.244.9.9": ""} {
		node, ok := p.NodeOf(netip.MustParseAddr(ip))
		if node != want || ok != (want != "") {
			t.Errorf("NodeOf(%s) = %q, %v; want %q", ip, node, ok, want)
		}
	}
	if err := kube.CoreV1().Pods("ns").Delete(ctx, "a", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := kube.CoreV1().Pods("ns").Create(ctx, pod("b", "node-b", corev1.PodRunning, false, "10.244.0.5"), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(10 * time.Second)
	for {
		node, _ := p.NodeOf(netip.MustParseAddr("10.244.0.5"))
		if node == "node-b" {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("10.244.0.5 after its pod moved: on %q, want node-b", node)
		}
		time.Sleep(10 * time.Millisecond)
	}
}
