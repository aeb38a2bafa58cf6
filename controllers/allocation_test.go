package controllers

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	authorizationv1 "k8s.io/api/authorization/v1"
	corev1 "k8s.io/api/core/v1"
	resourcev1 "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/util/retry"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/rdmavisor/rdmavisor/api/v1alpha1"
	"github.com/rdmavisor/rdmavisor/internal/dra"
	"github.com/rdmavisor/rdmavisor/internal/poll"
)

// TestRuntimeCDI: the runtimes that apply CDI devices, as node status names
// them.
func TestRuntimeCDI(t *testing.T) {
	for v, want := range map[string]bool{
		"containerd://1.7.35": true, "containerd://v1.7.0": true, "containerd://2.1.4": true,
		"containerd://1.6.20~ds1": false, "containerd://1.6.20": false,
		"cri-o://1.23.0": true, "cri-o://1.22.5": false,
		"docker://27.0.1": false, "containerd://": false, "containerd": false, "": false,
	} {
		if got := runtimeCDI(v); got != want {
			t.Errorf("runtimeCDI(%q) = %v, want %v", v, got, want)
		}
	}
}

// setRuntime reports node's container runtime, as its kubelet would.
func setRuntime(t *testing.T, node, version string) {
	t.Helper()
	n := &corev1.Node{}
	if err := k8s.Get(testCtx(t), client.ObjectKey{Name: node}, n); err != nil {
		t.Fatal(err)
	}
	n.Status.NodeInfo.ContainerRuntimeVersion = version
	if err := k8s.Status().Update(testCtx(t), n); err != nil {
		t.Fatalf("reporting %s's runtime: %v", node, err)
	}
}

// podShape is what allocation decides in the agent pods: their containers,
// the device plugin's command, and the host paths mounted.
func podShape(t *testing.T, service string) (containers []string, pluginCommand []string, hostPaths []string, err error) {
	t.Helper()
	ds := &appsv1.DaemonSet{}
	if err := k8s.Get(testCtx(t), client.ObjectKey{Namespace: testNamespace, Name: objectName(&v1alpha1.RDMAService{ObjectMeta: metav1.ObjectMeta{Name: service}})}, ds); err != nil {
		return nil, nil, nil, err
	}
	spec := ds.Spec.Template.Spec
	for _, c := range spec.Containers {
		containers = append(containers, c.Name)
		if c.Name == "device-plugin" {
			pluginCommand = c.Command
		}
	}
	for _, v := range spec.Volumes {
		if v.HostPath != nil {
			hostPaths = append(hostPaths, v.HostPath.Path)
		}
	}
	return containers, pluginCommand, hostPaths, nil
}

// TestAllocation: spec.allocation chooses the device plugin, the DRA
// driver or both in the agent pods, with the host paths each needs; the
// device plugin delivers by CDI once every node's runtime applies it; the
// agents' role lets the driver publish its ResourceSlices.
func TestAllocation(t *testing.T) {
	createNodes(t, map[string]string{"alloc": "true"}, "alloc-1", "alloc-2")
	setRuntime(t, "alloc-1", "containerd://1.7.35")
	setRuntime(t, "alloc-2", "containerd://1.6.20~ds1")
	createService(t, newService("alloc", "alloc"))

	if got := getService(t, "alloc").Spec.Allocation; got != v1alpha1.AllocationDevicePlugin {
		t.Errorf("default allocation %q, want %q", got, v1alpha1.AllocationDevicePlugin)
	}
	shape := func(wantContainers []string, wantCDI bool, wantPaths, wantNoPaths []string) func() error {
		return func() error {
			containers, cmd, paths, err := podShape(t, "alloc")
			if err != nil {
				return err
			}
			if !slices.Equal(containers, wantContainers) {
				return fmt.Errorf("containers %v, want %v", containers, wantContainers)
			}
			if got := slices.Contains(cmd, "--cdi"); got != wantCDI {
				return fmt.Errorf("device plugin command %q: --cdi %v, want %v", cmd, got, wantCDI)
			}
			for _, p := range wantPaths {
				if !slices.Contains(paths, p) {
					return fmt.Errorf("host paths %v lack %s", paths, p)
				}
			}
			for _, p := range wantNoPaths {
				if slices.Contains(paths, p) {
					return fmt.Errorf("host paths %v hold %s", paths, p)
				}
			}
			return nil
		}
	}
	if want := "/var/lib/kubelet/plugins/" + dra.DefaultDriverName; hostDRAPluginDir != want {
		t.Fatalf("the DRA driver's directory is %s, the driver's is %s", hostDRAPluginDir, want)
	}
	draPaths := []string{hostPluginsRegistryDir, hostDRAPluginDir, hostCDIDir}
	poll.UntilNil(t, 30*time.Second, "device plugin only, no CDI (alloc-2 runs containerd 1.6)",
		shape([]string{"agent", "device-plugin"}, false, []string{hostDevicePluginDir}, draPaths))

	setRuntime(t, "alloc-2", "containerd://1.7.35")
	poll.UntilNil(t, 30*time.Second, "the device plugin delivers by CDI", shape([]string{"agent", "device-plugin"}, true,
		[]string{hostDevicePluginDir, hostCDIDir}, []string{hostPluginsRegistryDir, hostDRAPluginDir}))

	updateService(t, "alloc", func(s *v1alpha1.RDMAService) { s.Spec.Allocation = v1alpha1.AllocationDRA })
	poll.UntilNil(t, 30*time.Second, "the DRA driver instead", shape([]string{"agent", "dra-driver"}, false, draPaths, nil))
	ds := getDaemonSet(t, "alloc")
	for _, c := range ds.Spec.Template.Spec.Containers {
		if c.Name != "dra-driver" {
			continue
		}
		if c.Command[0] != "dra-driver" || len(c.Env) != 1 || c.Env[0].Name != "NODE_NAME" {
			t.Errorf("dra-driver command %q env %v, want dra-driver with NODE_NAME", c.Command, c.Env)
		}
		var mounts []string
		for _, m := range c.VolumeMounts {
			mounts = append(mounts, m.MountPath)
		}
		for _, p := range append(draPaths, "/var/run/rdmavisor") {
			if !slices.Contains(mounts, p) {
				t.Errorf("dra-driver mounts %v, lacks %s", mounts, p)
			}
		}
	}

	updateService(t, "alloc", func(s *v1alpha1.RDMAService) { s.Spec.Allocation = v1alpha1.AllocationBoth })
	poll.UntilNil(t, 30*time.Second, "both", shape([]string{"agent", "device-plugin", "dra-driver"}, true, append(draPaths, hostDevicePluginDir), nil))

	// The schema refuses another value. The controller writes the status meanwhile, so an
	// update may first meet a conflict; only the schema's answer counts.
	err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
		svc := getService(t, "alloc")
		svc.Spec.Allocation = "Claims"
		return k8s.Update(testCtx(t), svc)
	})
	if err == nil || !strings.Contains(err.Error(), "DevicePlugin") {
		t.Errorf("allocation Claims: %v, want refused naming the choices", err)
	}

	// What the driver does, with the agents' service account.
	user := agentUserPrefix(testNamespace) + "alloc"
	for _, a := range []authorizationv1.ResourceAttributes{
		{Group: "resource.k8s.io", Resource: "resourceslices", Verb: "create"},
		{Group: "resource.k8s.io", Resource: "resourceslices", Verb: "update"},
		{Group: "resource.k8s.io", Resource: "resourceslices", Verb: "delete"},
		{Group: "resource.k8s.io", Resource: "resourceslices", Verb: "watch"},
		{Group: "resource.k8s.io", Resource: "resourceclaims", Verb: "get", Namespace: "tenant"},
		{Group: "", Resource: "nodes", Verb: "get", Name: "alloc-1"},
	} {
		poll.UntilNil(t, 30*time.Second, fmt.Sprintf("the agents may %s %s", a.Verb, a.Resource), func() error {
			sar := &authorizationv1.SubjectAccessReview{Spec: authorizationv1.SubjectAccessReviewSpec{
				User: user, Groups: []string{"system:serviceaccounts"}, ResourceAttributes: &a}}
			if err := k8s.Create(testCtx(t), sar); err != nil {
				return err
			}
			if !sar.Status.Allowed {
				return fmt.Errorf("denied: %s", sar.Status.Reason)
			}
			return nil
		})
	}
	// But not claims' writes, which are the scheduler's.
	sar := &authorizationv1.SubjectAccessReview{Spec: authorizationv1.SubjectAccessReviewSpec{User: user,
		ResourceAttributes: &authorizationv1.ResourceAttributes{Group: "resource.k8s.io", Resource: "resourceclaims", Verb: "update", Namespace: "tenant"}}}
	if err := k8s.Create(testCtx(t), sar); err != nil || sar.Status.Allowed {
		t.Errorf("the agents may update claims: %v %+v", err, sar.Status)
	}
}

func resourceSlice(name, node string) *resourcev1.ResourceSlice {
	return &resourcev1.ResourceSlice{ObjectMeta: metav1.ObjectMeta{Name: name}, Spec: resourcev1.ResourceSliceSpec{
		Driver: "rdmavisor.io", NodeName: new(node),
		Pool:    resourcev1.ResourcePool{Name: node, ResourceSliceCount: 1},
		Devices: []resourcev1.Device{{Name: "soft-0"}},
	}}
}

// TestAgentMayWriteOnlyItsOwnResourceSlices: the DRA driver in an agent pod
// publishes its node's slice with the agents' service account, and the
// agent slice policy keeps it off other nodes' slices, as NodeRestriction
// keeps a kubelet.
func TestAgentMayWriteOnlyItsOwnResourceSlices(t *testing.T) {
	createNodes(t, map[string]string{"slices": "true"}, "slice-1", "slice-2")
	createService(t, newService("slices", "slices"))
	agent := agentClient(t, "slices", "slice-1")
	ctx := testCtx(t)
	other := resourceSlice("slice-2-rdmavisor", "slice-2")
	if err := k8s.Create(ctx, other); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = k8s.Delete(context.Background(), other) })

	// Its own: create, update, delete (the binding and the policy take
	// effect a moment after they are made).
	own := resourceSlice("slice-1-rdmavisor", "slice-1")
	poll.UntilNil(t, 30*time.Second, "the agent creates its node's slice", func() error { return agent.Create(ctx, own.DeepCopy()) })
	t.Cleanup(func() { _ = k8s.Delete(context.Background(), own) })
	got := &resourcev1.ResourceSlice{}
	if err := agent.Get(ctx, client.ObjectKeyFromObject(own), got); err != nil {
		t.Fatal(err)
	}
	got.Spec.Devices = append(got.Spec.Devices, resourcev1.Device{Name: "soft-1"})
	if err := agent.Update(ctx, got); err != nil {
		t.Errorf("updating its own slice: %v", err)
	}
	if err := agent.Delete(ctx, got); err != nil {
		t.Errorf("deleting its own slice: %v", err)
	}

	for _, tc := range []struct {
		name string
		do   func(client.Client) error
		want string
	}{
		{"create another node's slice", func(c client.Client) error { return c.Create(ctx, resourceSlice("evil", "slice-2")) },
			"may write only ResourceSlices of node slice-1"},
		{"update another node's slice", func(c client.Client) error {
			s := &resourcev1.ResourceSlice{}
			if err := c.Get(ctx, client.ObjectKeyFromObject(other), s); err != nil {
				return err
			}
			s.Spec.Devices = nil
			s.Spec.Devices = append(s.Spec.Devices, resourcev1.Device{Name: "evil"})
			return c.Update(ctx, s)
		}, "may write only ResourceSlices of node slice-1"},
		{"delete another node's slice", func(c client.Client) error { return c.Delete(ctx, other.DeepCopy()) },
			"may write only ResourceSlices of node slice-1"},
		{"a token bound to no node", func(client.Client) error {
			return agentClient(t, "slices", "").Create(ctx, resourceSlice("nowhere", "slice-1"))
		}, "its token names no node"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if err := wantForbidden(tc.do(agent), tc.want); err != nil {
				t.Error(err)
			}
		})
	}
	if err := k8s.Get(ctx, client.ObjectKeyFromObject(other), &resourcev1.ResourceSlice{}); err != nil {
		t.Errorf("the other node's slice: %v", err)
	}
}
