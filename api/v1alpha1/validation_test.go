package v1alpha1_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/yaml"

	"github.com/rdmavisor/rdmavisor/api/v1alpha1"
	"github.com/rdmavisor/rdmavisor/controllers/testenv"
)

var k8s client.Client

func TestMain(m *testing.M) { os.Exit(run(m)) }

func run(m *testing.M) int {
	env, cfg, err := testenv.Start()
	if err != nil {
		fmt.Fprintln(os.Stderr, "FAIL:", err)
		return 1
	}
	defer func() {
		if err := env.Stop(); err != nil {
			fmt.Fprintln(os.Stderr, "stopping envtest:", err)
		}
	}()
	if k8s, err = client.New(cfg, client.Options{Scheme: testenv.Scheme()}); err != nil {
		fmt.Fprintln(os.Stderr, "FAIL: creating client:", err)
		return 1
	}
	return m.Run()
}

func ctx(t *testing.T) context.Context {
	c, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	t.Cleanup(cancel)
	return c
}

func ptr[T any](v T) *T { return &v }

func quantity(s string) *resource.Quantity { q := resource.MustParse(s); return &q }

func resources(cpu, memory string) corev1.ResourceList {
	return corev1.ResourceList{corev1.ResourceCPU: resource.MustParse(cpu), corev1.ResourceMemory: resource.MustParse(memory)}
}

func TestRDMAServiceDefaults(t *testing.T) {
	svc := &v1alpha1.RDMAService{ObjectMeta: metav1.ObjectMeta{Name: "defaults"}}
	if err := k8s.Create(ctx(t), svc); err != nil {
		t.Fatalf("creating an RDMAService with an empty spec: %v", err)
	}
	t.Cleanup(func() { _ = k8s.Delete(context.Background(), svc) })
	s := svc.Spec
	if s.Device.Provider != v1alpha1.ProviderIBVerbs || s.Transport != v1alpha1.TransportAuto ||
		s.QPsPerPeer == nil || *s.QPsPerPeer != v1alpha1.DefaultQPsPerPeer ||
		s.VConnsPerNode == nil || *s.VConnsPerNode != v1alpha1.DefaultVConnsPerNode ||
		s.BufferPoolSize == nil || s.BufferPoolSize.Cmp(resource.MustParse(v1alpha1.DefaultBufferPoolSize)) != 0 ||
		s.ResourceName != v1alpha1.DefaultResourceName {
		t.Errorf("defaults not applied by the API server: %+v", s)
	}
}

func TestRDMAServiceValidation(t *testing.T) {
	tests := []struct {
		name   string
		mutate func(*v1alpha1.RDMAService)
		// want are substrings of the API server's message; none: accepted.
		want []string
	}{
		{name: "soft provider", mutate: func(s *v1alpha1.RDMAService) { s.Spec.Device.Provider = v1alpha1.ProviderSoft }},
		{name: "ibverbs with devices", mutate: func(s *v1alpha1.RDMAService) {
			s.Spec.Device = v1alpha1.DeviceSelector{Provider: v1alpha1.ProviderIBVerbs, Names: []string{"mlx5_0"}, Vendors: []string{"0x02c9"}}
		}},
		{name: "two rails of ibverbs", mutate: func(s *v1alpha1.RDMAService) {
			s.Spec.Device = v1alpha1.DeviceSelector{Provider: v1alpha1.ProviderIBVerbs, Names: []string{"mlx5_0", "mlx5_1"}, Rails: 2}
		}},
		{name: "buffer pool as a plain integer", mutate: func(s *v1alpha1.RDMAService) { s.Spec.BufferPoolSize = quantity("1048576") }},
		{name: "resource name of its own domain", mutate: func(s *v1alpha1.RDMAService) { s.Spec.ResourceName = "rdmavisor.io/vconn-ib" }},
		{name: "agent requests at the bounds, limits above", mutate: func(s *v1alpha1.RDMAService) {
			s.Spec.Agent.Resources = &corev1.ResourceRequirements{
				Requests: resources(v1alpha1.MaxAgentCPURequest, v1alpha1.MaxAgentMemoryRequest),
				Limits:   resources("32", "64Gi")}
		}},
		{name: "agent limits within the bounds, no requests", mutate: func(s *v1alpha1.RDMAService) {
			s.Spec.Agent.Resources = &corev1.ResourceRequirements{Limits: resources("3500m", "1Gi")}
		}},
		{name: "socket group 0", mutate: func(s *v1alpha1.RDMAService) { s.Spec.SocketGroup = ptr[int64](0) }},
		{name: "limits at their bounds", mutate: func(s *v1alpha1.RDMAService) {
			s.Spec.Limits = &v1alpha1.Limits{Sessions: ptr[int32](v1alpha1.MaxSessions), Listeners: ptr[int32](1),
				Regions: ptr[int32](v1alpha1.MaxRegions), RegionSize: quantity(v1alpha1.MaxRegionSize),
				QueuedSize: quantity(v1alpha1.MinQueuedSize), RegisteredSize: quantity(v1alpha1.MaxRegisteredSize),
				MessageRate: ptr[int32](v1alpha1.MaxMessageRate), ByteRate: quantity(v1alpha1.MaxByteRate)}
		}},
		{name: "limits at their other bounds", mutate: func(s *v1alpha1.RDMAService) {
			s.Spec.Limits = &v1alpha1.Limits{Sessions: ptr[int32](1), Listeners: ptr[int32](v1alpha1.MaxListeners),
				RegionSize: quantity(v1alpha1.MinRegionSize), QueuedSize: quantity(v1alpha1.MaxQueuedSize),
				RegisteredSize: quantity(v1alpha1.MinRegisteredSize), MessageRate: ptr[int32](0), ByteRate: quantity("0")}
		}},
		{name: "largest socket group", mutate: func(s *v1alpha1.RDMAService) { s.Spec.SocketGroup = ptr[int64](v1alpha1.MaxSocketGroup) }},
		{name: "valid selector expressions", mutate: func(s *v1alpha1.RDMAService) {
			s.Spec.NodeSelector = &metav1.LabelSelector{MatchExpressions: []metav1.LabelSelectorRequirement{
				{Key: "a", Operator: metav1.LabelSelectorOpIn, Values: []string{"x"}},
				{Key: "b", Operator: metav1.LabelSelectorOpExists},
			}}
		}},
		{
			name:   "qpsPerPeer 0",
			mutate: func(s *v1alpha1.RDMAService) { s.Spec.QPsPerPeer = ptr[int32](0) },
			want:   []string{"spec.qpsPerPeer", "should be greater than or equal to 1"},
		},
		{
			name:   "qpsPerPeer too big",
			mutate: func(s *v1alpha1.RDMAService) { s.Spec.QPsPerPeer = ptr[int32](65) },
			want:   []string{"spec.qpsPerPeer", "should be less than or equal to 64"},
		},
		{
			name:   "negative vconnsPerNode",
			mutate: func(s *v1alpha1.RDMAService) { s.Spec.VConnsPerNode = ptr[int32](-1) },
			want:   []string{"spec.vconnsPerNode", "should be greater than or equal to 1"},
		},
		{
			name:   "vconnsPerNode too big",
			mutate: func(s *v1alpha1.RDMAService) { s.Spec.VConnsPerNode = ptr[int32](65537) },
			want:   []string{"spec.vconnsPerNode", "should be less than or equal to 65536"},
		},
		{
			name:   "negative socket group",
			mutate: func(s *v1alpha1.RDMAService) { s.Spec.SocketGroup = ptr[int64](-1) },
			want:   []string{"spec.socketGroup", "should be greater than or equal to 0"},
		},
		{
			name:   "socket group past what a pod may have",
			mutate: func(s *v1alpha1.RDMAService) { s.Spec.SocketGroup = ptr[int64](v1alpha1.MaxSocketGroup + 1) },
			want:   []string{"spec.socketGroup", "should be less than or equal to 2147483647"},
		},
		{
			name:   "unknown transport",
			mutate: func(s *v1alpha1.RDMAService) { s.Spec.Transport = "tcp" },
			want:   []string{"spec.transport", `Unsupported value: "tcp"`, `"rc", "uc", "ud", "auto"`},
		},
		{
			name:   "unknown provider",
			mutate: func(s *v1alpha1.RDMAService) { s.Spec.Device.Provider = "efa" },
			want:   []string{"spec.device.provider", `Unsupported value: "efa"`},
		},
		{
			name:   "resource name without a domain",
			mutate: func(s *v1alpha1.RDMAService) { s.Spec.ResourceName = "vconn" },
			want:   []string{"spec.resourceName", "resourceName must be rdmavisor.io/ and a name, such as rdmavisor.io/vconn"},
		},
		{
			name:   "resource name in kubernetes.io",
			mutate: func(s *v1alpha1.RDMAService) { s.Spec.ResourceName = "rdma.kubernetes.io/vconn" },
			want:   []string{"spec.resourceName", "resourceName must be rdmavisor.io/ and a name"},
		},
		// The attack: the kubelet would hand the GPUs of every selected
		// node to the service's device plugin.
		{
			name:   "another vendor's resource",
			mutate: func(s *v1alpha1.RDMAService) { s.Spec.ResourceName = "nvidia.com/gpu" },
			want:   []string{"spec.resourceName", "a service may not take over another domain's resource"},
		},
		{
			name:   "resource name of another domain",
			mutate: func(s *v1alpha1.RDMAService) { s.Spec.ResourceName = "example.com/rdma-conn" },
			want:   []string{"spec.resourceName", "resourceName must be rdmavisor.io/ and a name"},
		},
		{
			name:   "resource name in a subdomain",
			mutate: func(s *v1alpha1.RDMAService) { s.Spec.ResourceName = "gpu.rdmavisor.io/vconn" },
			want:   []string{"spec.resourceName", "resourceName must be rdmavisor.io/ and a name"},
		},
		{
			name:   "resource name that only starts with the domain",
			mutate: func(s *v1alpha1.RDMAService) { s.Spec.ResourceName = "rdmavisor.io.evil.com/vconn" },
			want:   []string{"spec.resourceName", "resourceName must be rdmavisor.io/ and a name"},
		},
		// At system-node-critical, what the agent requests the scheduler
		// takes from tenant pods by preemption.
		{
			name: "agent CPU request past the bound",
			mutate: func(s *v1alpha1.RDMAService) {
				s.Spec.Agent.Resources = &corev1.ResourceRequirements{Requests: corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("4001m")}}
			},
			want: []string{"spec.agent.resources", "the agent may request at most 4 CPUs"},
		},
		{
			name: "agent CPU limit past the bound without a request",
			mutate: func(s *v1alpha1.RDMAService) {
				s.Spec.Agent.Resources = &corev1.ResourceRequirements{Limits: corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("64")}}
			},
			want: []string{"spec.agent.resources", "the agent may request at most 4 CPUs"},
		},
		{
			name: "agent memory request past the bound",
			mutate: func(s *v1alpha1.RDMAService) {
				s.Spec.Agent.Resources = &corev1.ResourceRequirements{Requests: corev1.ResourceList{corev1.ResourceMemory: resource.MustParse("8193Mi")}}
			},
			want: []string{"spec.agent.resources", "the agent may request at most 8Gi of memory"},
		},
		{
			name: "agent requests a GPU",
			mutate: func(s *v1alpha1.RDMAService) {
				s.Spec.Agent.Resources = &corev1.ResourceRequirements{Requests: corev1.ResourceList{"nvidia.com/gpu": resource.MustParse("1")}}
			},
			want: []string{"spec.agent.resources", "agent resources may name cpu and memory only"},
		},
		{
			name: "agent limits vconns",
			mutate: func(s *v1alpha1.RDMAService) {
				s.Spec.Agent.Resources = &corev1.ResourceRequirements{Limits: corev1.ResourceList{"rdmavisor.io/vconn": resource.MustParse("1")}}
			},
			want: []string{"spec.agent.resources", "agent resources may name cpu and memory only"},
		},
		{
			name: "agent claims",
			mutate: func(s *v1alpha1.RDMAService) {
				s.Spec.Agent.Resources = &corev1.ResourceRequirements{Claims: []corev1.ResourceClaim{{Name: "gpu"}}}
			},
			want: []string{"spec.agent.resources", "agent resources may name cpu and memory only"},
		},
		{
			name:   "soft provider with device names",
			mutate: func(s *v1alpha1.RDMAService) { s.Spec.Device.Names = []string{"mlx5_0"} },
			want:   []string{"spec.device", "cannot be set with provider soft"},
		},
		{
			name:   "soft provider with two rails",
			mutate: func(s *v1alpha1.RDMAService) { s.Spec.Device.Rails = 2 },
			want:   []string{"spec.device", "more than one rail needs provider ibverbs"},
		},
		{
			name: "two rails, one device name",
			mutate: func(s *v1alpha1.RDMAService) {
				s.Spec.Device = v1alpha1.DeviceSelector{Provider: v1alpha1.ProviderIBVerbs, Names: []string{"mlx5_0"}, Rails: 2}
			},
			want: []string{"spec.device", "as many names, one a rail"},
		},
		{
			name:   "seventeen rails",
			mutate: func(s *v1alpha1.RDMAService) { s.Spec.Device.Rails = 17 },
			want:   []string{"spec.device.rails", "less than or equal to 16"},
		},
		{
			name:   "buffer pool too small",
			mutate: func(s *v1alpha1.RDMAService) { s.Spec.BufferPoolSize = quantity("512Ki") },
			want:   []string{"spec.bufferPoolSize", "between 1Mi and 64Gi"},
		},
		{
			name:   "buffer pool too big",
			mutate: func(s *v1alpha1.RDMAService) { s.Spec.BufferPoolSize = quantity("65Gi") },
			want:   []string{"spec.bufferPoolSize", "between 1Mi and 64Gi"},
		},
		{
			name:   "buffer pool not whole bytes",
			mutate: func(s *v1alpha1.RDMAService) { s.Spec.BufferPoolSize = quantity("1500m") },
			want:   []string{"spec.bufferPoolSize", "whole number of bytes"},
		},
		{
			name:   "no sessions",
			mutate: func(s *v1alpha1.RDMAService) { s.Spec.Limits = &v1alpha1.Limits{Sessions: ptr[int32](0)} },
			want:   []string{"spec.limits.sessions", "greater than or equal to 1"},
		},
		{
			name: "too many sessions",
			mutate: func(s *v1alpha1.RDMAService) {
				s.Spec.Limits = &v1alpha1.Limits{Sessions: ptr[int32](v1alpha1.MaxSessions + 1)}
			},
			want: []string{"spec.limits.sessions", "less than or equal to 4096"},
		},
		{
			name:   "no listeners",
			mutate: func(s *v1alpha1.RDMAService) { s.Spec.Limits = &v1alpha1.Limits{Listeners: ptr[int32](0)} },
			want:   []string{"spec.limits.listeners", "greater than or equal to 1"},
		},
		{
			name: "too many listeners",
			mutate: func(s *v1alpha1.RDMAService) {
				s.Spec.Limits = &v1alpha1.Limits{Listeners: ptr[int32](v1alpha1.MaxListeners + 1)}
			},
			want: []string{"spec.limits.listeners", "less than or equal to 65535"},
		},
		{
			name:   "no regions",
			mutate: func(s *v1alpha1.RDMAService) { s.Spec.Limits = &v1alpha1.Limits{Regions: ptr[int32](0)} },
			want:   []string{"spec.limits.regions", "greater than or equal to 1"},
		},
		{
			name: "too many regions",
			mutate: func(s *v1alpha1.RDMAService) {
				s.Spec.Limits = &v1alpha1.Limits{Regions: ptr[int32](v1alpha1.MaxRegions + 1)}
			},
			want: []string{"spec.limits.regions", "less than or equal to 1048576"},
		},
		{
			name:   "no region bytes",
			mutate: func(s *v1alpha1.RDMAService) { s.Spec.Limits = &v1alpha1.Limits{RegionSize: quantity("0")} },
			want:   []string{"spec.limits.regionSize", "between 1 and 64Gi"},
		},
		{
			name:   "regions of 65Gi",
			mutate: func(s *v1alpha1.RDMAService) { s.Spec.Limits = &v1alpha1.Limits{RegionSize: quantity("65Gi")} },
			want:   []string{"spec.limits.regionSize", "between 1 and 64Gi"},
		},
		{
			name:   "queued bytes under a message",
			mutate: func(s *v1alpha1.RDMAService) { s.Spec.Limits = &v1alpha1.Limits{QueuedSize: quantity("65535")} },
			want:   []string{"spec.limits.queuedSize", "between 64Ki and 16Gi"},
		},
		{
			name:   "queued bytes past 16Gi",
			mutate: func(s *v1alpha1.RDMAService) { s.Spec.Limits = &v1alpha1.Limits{QueuedSize: quantity("17Gi")} },
			want:   []string{"spec.limits.queuedSize", "between 64Ki and 16Gi"},
		},
		{
			name:   "no registered memory",
			mutate: func(s *v1alpha1.RDMAService) { s.Spec.Limits = &v1alpha1.Limits{RegisteredSize: quantity("0")} },
			want:   []string{"spec.limits.registeredSize", "between 1 and 1Ti"},
		},
		{
			name:   "registered memory past 1Ti",
			mutate: func(s *v1alpha1.RDMAService) { s.Spec.Limits = &v1alpha1.Limits{RegisteredSize: quantity("1025Gi")} },
			want:   []string{"spec.limits.registeredSize", "between 1 and 1Ti"},
		},
		{
			name:   "a negative message rate",
			mutate: func(s *v1alpha1.RDMAService) { s.Spec.Limits = &v1alpha1.Limits{MessageRate: ptr[int32](-1)} },
			want:   []string{"spec.limits.messageRate", "greater than or equal to 0"},
		},
		{
			name: "a message rate past the bound",
			mutate: func(s *v1alpha1.RDMAService) {
				s.Spec.Limits = &v1alpha1.Limits{MessageRate: ptr[int32](v1alpha1.MaxMessageRate + 1)}
			},
			want: []string{"spec.limits.messageRate", "less than or equal to 100000000"},
		},
		{
			name:   "a negative byte rate",
			mutate: func(s *v1alpha1.RDMAService) { s.Spec.Limits = &v1alpha1.Limits{ByteRate: quantity("-1")} },
			want:   []string{"spec.limits.byteRate", "between 0 (unlimited) and 1Ti"},
		},
		{
			name:   "a byte rate past 1Ti",
			mutate: func(s *v1alpha1.RDMAService) { s.Spec.Limits = &v1alpha1.Limits{ByteRate: quantity("2Ti")} },
			want:   []string{"spec.limits.byteRate", "between 0 (unlimited) and 1Ti"},
		},
		{
			name:   "a fraction of a byte",
			mutate: func(s *v1alpha1.RDMAService) { s.Spec.Limits = &v1alpha1.Limits{RegionSize: quantity("1500m")} },
			want:   []string{"spec.limits.regionSize", "whole number of bytes"},
		},
		{
			name:   "image pull policy",
			mutate: func(s *v1alpha1.RDMAService) { s.Spec.Agent.ImagePullPolicy = "Sometimes" },
			want:   []string{"spec.agent.imagePullPolicy", `Unsupported value: "Sometimes"`},
		},
		{
			name: "selector operator",
			mutate: func(s *v1alpha1.RDMAService) {
				s.Spec.NodeSelector = &metav1.LabelSelector{MatchExpressions: []metav1.LabelSelectorRequirement{{Key: "a", Operator: "Gt", Values: []string{"1"}}}}
			},
			want: []string{"spec.nodeSelector", "operators must be In, NotIn, Exists or DoesNotExist"},
		},
		{
			name: "selector In without values",
			mutate: func(s *v1alpha1.RDMAService) {
				s.Spec.NodeSelector = &metav1.LabelSelector{MatchExpressions: []metav1.LabelSelectorRequirement{{Key: "a", Operator: metav1.LabelSelectorOpIn}}}
			},
			want: []string{"spec.nodeSelector", "In and NotIn need values"},
		},
		{
			name:   "name too long",
			mutate: func(s *v1alpha1.RDMAService) { s.Name = strings.Repeat("n", 41) },
			want:   []string{"metadata.name must be at most 40 characters"},
		},
	}
	for i, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			svc := &v1alpha1.RDMAService{
				ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("validation-%d", i)},
				Spec:       v1alpha1.RDMAServiceSpec{Device: v1alpha1.DeviceSelector{Provider: v1alpha1.ProviderSoft}},
			}
			tt.mutate(svc)
			err := k8s.Create(ctx(t), svc)
			if err == nil {
				_ = k8s.Delete(context.Background(), svc)
			}
			checkInvalid(t, err, tt.want)
		})
	}
}

// checkInvalid checks that err is nil when want is empty, else an Invalid
// error from the API server whose message holds every want.
func checkInvalid(t *testing.T, err error, want []string) {
	t.Helper()
	if len(want) == 0 {
		if err != nil {
			t.Fatalf("rejected a valid object: %v", err)
		}
		return
	}
	if err == nil {
		t.Fatalf("accepted an invalid object; want an error containing %q", want)
	}
	if !apierrors.IsInvalid(err) {
		t.Fatalf("error is %v (reason %s), want Invalid", err, apierrors.ReasonForError(err))
	}
	for _, w := range want {
		if !strings.Contains(err.Error(), w) {
			t.Errorf("message %q does not contain %q", err.Error(), w)
		}
	}
}

func TestRDMAServiceResourceNameImmutable(t *testing.T) {
	svc := &v1alpha1.RDMAService{ObjectMeta: metav1.ObjectMeta{Name: "immutable"}}
	if err := k8s.Create(ctx(t), svc); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = k8s.Delete(context.Background(), svc) })
	svc.Spec.QPsPerPeer = ptr[int32](8)
	if err := k8s.Update(ctx(t), svc); err != nil {
		t.Fatalf("updating a mutable field: %v", err)
	}
	svc.Spec.ResourceName = "rdmavisor.io/other"
	checkInvalid(t, k8s.Update(ctx(t), svc), []string{"spec.resourceName", "resourceName is immutable"})
}

func TestRDMANodeValidation(t *testing.T) {
	ready := metav1.Condition{Type: v1alpha1.ConditionNodeReady, Status: metav1.ConditionTrue, Reason: "Serving", LastTransitionTime: metav1.Now()}
	valid := func() v1alpha1.RDMANodeStatus {
		return v1alpha1.RDMANodeStatus{
			Conditions: []metav1.Condition{ready},
			Devices: []v1alpha1.RDMADevice{{Name: "soft0", Vendor: "rdmavisor", Provider: v1alpha1.ProviderSoft,
				GID: "10.0.0.1", NUMANode: ptr[int32](-1), Health: v1alpha1.DeviceHealthy}},
			VConnsOpen: 3, VConnCapacity: 8, QPsInUse: 2,
			Address:       &v1alpha1.AgentAddress{IP: "10.0.0.1", ControlPort: 7471},
			HeartbeatTime: ptr(metav1.Now()),
		}
	}
	tests := []struct {
		name   string
		mutate func(*v1alpha1.RDMANodeStatus)
		want   []string
	}{
		{name: "valid", mutate: func(*v1alpha1.RDMANodeStatus) {}},
		{name: "IPv6 address and GID", mutate: func(s *v1alpha1.RDMANodeStatus) { s.Address.IP, s.Devices[0].GID = "fd00::1", "fe80::2:c903:1:1234" }},
		{name: "IPv4-mapped GID", mutate: func(s *v1alpha1.RDMANodeStatus) { s.Devices[0].GID = "::ffff:10.0.0.1" }, want: []string{"an IPv4-mapped GID as its IPv4 address"}},
		{name: "bad IP", mutate: func(s *v1alpha1.RDMANodeStatus) { s.Address.IP = "node-1" }, want: []string{"status.address.ip", "ip must be an IP address"}},
		{name: "port 0", mutate: func(s *v1alpha1.RDMANodeStatus) { s.Address.ControlPort = 0 }, want: []string{"status.address.controlPort", "greater than or equal to 1"}},
		{name: "bad GID", mutate: func(s *v1alpha1.RDMANodeStatus) { s.Devices[0].GID = "fe80::zz" }, want: []string{"status.devices[0].gid", "gid must be written as an IP address"}},
		{name: "bad health", mutate: func(s *v1alpha1.RDMANodeStatus) { s.Devices[0].Health = "Broken" }, want: []string{`Unsupported value: "Broken"`}},
		{name: "NUMA below -1", mutate: func(s *v1alpha1.RDMANodeStatus) { s.Devices[0].NUMANode = ptr[int32](-2) }, want: []string{"numaNode"}},
		{name: "more open than capacity", mutate: func(s *v1alpha1.RDMANodeStatus) { s.VConnsOpen = 9 }, want: []string{"vconnsOpen cannot exceed vconnCapacity"}},
		{name: "negative QPs", mutate: func(s *v1alpha1.RDMANodeStatus) { s.QPsInUse = -1 }, want: []string{"status.qpsInUse", "greater than or equal to 0"}},
		{name: "duplicate device", mutate: func(s *v1alpha1.RDMANodeStatus) { s.Devices = append(s.Devices, s.Devices[0]) }, want: []string{"Duplicate value"}},
	}
	for i, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			n := &v1alpha1.RDMANode{ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("node-%d", i)}, Spec: v1alpha1.RDMANodeSpec{ServiceName: "svc"}}
			if err := k8s.Create(ctx(t), n); err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { _ = k8s.Delete(context.Background(), n) })
			n.Status = valid()
			tt.mutate(&n.Status)
			checkInvalid(t, k8s.Status().Update(ctx(t), n), tt.want)
		})
	}

	t.Run("serviceName is immutable", func(t *testing.T) {
		n := &v1alpha1.RDMANode{ObjectMeta: metav1.ObjectMeta{Name: "immutable"}, Spec: v1alpha1.RDMANodeSpec{ServiceName: "svc"}}
		if err := k8s.Create(ctx(t), n); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = k8s.Delete(context.Background(), n) })
		n.Spec.ServiceName = "other"
		checkInvalid(t, k8s.Update(ctx(t), n), []string{"spec.serviceName", "serviceName is immutable"})
	})
}

// TestSamples applies every sample, so they stay valid.
func TestSamples(t *testing.T) {
	files, err := filepath.Glob(filepath.Join(testenv.RepoRoot(), "config", "samples", "*.yaml"))
	if err != nil || len(files) < 2 {
		t.Fatalf("want at least 2 samples, got %v (%v)", files, err)
	}
	var soft bool
	for _, f := range files {
		t.Run(filepath.Base(f), func(t *testing.T) {
			data, err := os.ReadFile(f)
			if err != nil {
				t.Fatal(err)
			}
			u := &unstructured.Unstructured{}
			if err := yaml.UnmarshalStrict(data, &u.Object); err != nil {
				t.Fatal(err)
			}
			if u.GetKind() != "RDMAService" && u.GetNamespace() == "" {
				// A namespaced sample (the ResourceClaimTemplate) goes
				// where kubectl apply would put it.
				u.SetNamespace("default")
			}
			if err := k8s.Create(ctx(t), u); err != nil {
				t.Fatalf("sample rejected: %v", err)
			}
			t.Cleanup(func() { _ = k8s.Delete(context.Background(), u) })
			if u.GetKind() != "RDMAService" {
				return
			}
			var svc v1alpha1.RDMAService
			if err := k8s.Get(ctx(t), client.ObjectKeyFromObject(u), &svc); err != nil {
				t.Fatal(err)
			}
			soft = soft || svc.Spec.Device.Provider == v1alpha1.ProviderSoft
		})
	}
	if !soft {
		t.Error("no sample uses provider soft")
	}
}

// TestTolerationsRoundTrip guards the embedded core types in the schema.
func TestTolerationsRoundTrip(t *testing.T) {
	svc := &v1alpha1.RDMAService{ObjectMeta: metav1.ObjectMeta{Name: "tolerations"}, Spec: v1alpha1.RDMAServiceSpec{
		Tolerations: []corev1.Toleration{{Key: "rdma", Operator: corev1.TolerationOpExists, Effect: corev1.TaintEffectNoSchedule}},
		Agent:       v1alpha1.AgentSpec{Resources: &corev1.ResourceRequirements{Requests: corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("100m")}}},
	}}
	if err := k8s.Create(ctx(t), svc); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = k8s.Delete(context.Background(), svc) })
	var got v1alpha1.RDMAService
	if err := k8s.Get(ctx(t), client.ObjectKeyFromObject(svc), &got); err != nil {
		t.Fatal(err)
	}
	if len(got.Spec.Tolerations) != 1 || got.Spec.Tolerations[0].Key != "rdma" || got.Spec.Agent.Resources.Requests.Cpu().MilliValue() != 100 {
		t.Errorf("spec did not survive the API server: %+v", got.Spec)
	}
}
