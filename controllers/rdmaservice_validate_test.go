package controllers

import (
	"strings"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"

	"github.com/rdmavisor/rdmavisor/api/v1alpha1"
	"github.com/rdmavisor/rdmavisor/controllers/testenv"
)

// TestOperatorRefusesUnsafeSpec: the operator runs no agents for a service
// whose spec would harm the nodes' other tenants, even when the API server
// stored it (before the schema had the rule; validation ratcheting keeps an
// unchanged field): another vendor's resourceName, which the agents'
// device plugin would take over, agent requests that preempt tenant
// pods at the agent's priority, or limits past the agent's bounds, which
// its agents would refuse to start with. The agents' DaemonSet an older operator
// rendered is deleted, and Ready and Degraded say why. DaemonSets left:
// 0 (1 for the valid spec). The API server's refusal of the same specs is
// api/v1alpha1's TestRDMAServiceValidation; this is the operator's own
// check, on a fake client since the API server would refuse the objects.
func TestOperatorRefusesUnsafeSpec(t *testing.T) {
	cpu := func(v string) corev1.ResourceList {
		return corev1.ResourceList{corev1.ResourceCPU: resource.MustParse(v)}
	}
	i32 := func(v int32) *int32 { return &v }
	q := func(v string) *resource.Quantity { r := resource.MustParse(v); return &r }
	tests := []struct {
		name   string
		mutate func(*v1alpha1.RDMAServiceSpec)
		want   string // in the Ready condition's message; empty: the spec is fine
	}{
		{name: "own resource, bounded requests", mutate: func(s *v1alpha1.RDMAServiceSpec) {
			s.ResourceName = "rdmavisor.io/vconn-soft"
			s.Agent.Resources = &corev1.ResourceRequirements{Requests: cpu(v1alpha1.MaxAgentCPURequest), Limits: cpu("32")}
		}},
		{name: "another vendor's resource", mutate: func(s *v1alpha1.RDMAServiceSpec) { s.ResourceName = "nvidia.com/gpu" },
			want: `spec.resourceName "nvidia.com/gpu" is not rdmavisor.io/<name>`},
		{name: "a subdomain", mutate: func(s *v1alpha1.RDMAServiceSpec) { s.ResourceName = "gpu.rdmavisor.io/x" },
			want: "is not rdmavisor.io/<name>"},
		{name: "64 CPUs requested", mutate: func(s *v1alpha1.RDMAServiceSpec) {
			s.Agent.Resources = &corev1.ResourceRequirements{Requests: cpu("64")}
		}, want: "the agent requests 64 of cpu, more than 4"},
		{name: "a memory limit without a request", mutate: func(s *v1alpha1.RDMAServiceSpec) {
			s.Agent.Resources = &corev1.ResourceRequirements{Limits: corev1.ResourceList{corev1.ResourceMemory: resource.MustParse("64Gi")}}
		}, want: "the agent requests 64Gi of memory, more than 8Gi"},
		{name: "a GPU requested", mutate: func(s *v1alpha1.RDMAServiceSpec) {
			s.Agent.Resources = &corev1.ResourceRequirements{Requests: corev1.ResourceList{"nvidia.com/gpu": resource.MustParse("1")}}
		}, want: "names nvidia.com/gpu: only cpu and memory"},
		{name: "limits at their bounds", mutate: func(s *v1alpha1.RDMAServiceSpec) {
			s.Limits = &v1alpha1.Limits{Sessions: i32(v1alpha1.MaxSessions), Listeners: i32(1), Regions: i32(v1alpha1.MaxRegions),
				RegionSize: q(v1alpha1.MaxRegionSize), QueuedSize: q(v1alpha1.MinQueuedSize), RegisteredSize: q(v1alpha1.MaxRegisteredSize),
				MessageRate: i32(v1alpha1.MaxMessageRate), ByteRate: q("0")}
		}},
		{name: "no listeners", mutate: func(s *v1alpha1.RDMAServiceSpec) { s.Limits = &v1alpha1.Limits{Listeners: i32(0)} },
			want: "spec.limits.listeners must be between 1 and 65535, got 0"},
		{name: "too many sessions", mutate: func(s *v1alpha1.RDMAServiceSpec) { s.Limits = &v1alpha1.Limits{Sessions: i32(4097)} },
			want: "spec.limits.sessions must be between 1 and 4096, got 4097"},
		{name: "too many regions", mutate: func(s *v1alpha1.RDMAServiceSpec) { s.Limits = &v1alpha1.Limits{Regions: i32(1<<20 + 1)} },
			want: "spec.limits.regions must be between 1 and 1048576"},
		{name: "a negative message rate", mutate: func(s *v1alpha1.RDMAServiceSpec) { s.Limits = &v1alpha1.Limits{MessageRate: i32(-1)} },
			want: "spec.limits.messageRate must be between 0 and 100000000, got -1"},
		{name: "regions of 65Gi", mutate: func(s *v1alpha1.RDMAServiceSpec) { s.Limits = &v1alpha1.Limits{RegionSize: q("65Gi")} },
			want: "spec.limits.regionSize must be a whole number of bytes between 1 and 64Gi, got 65Gi"},
		{name: "queued bytes under a message", mutate: func(s *v1alpha1.RDMAServiceSpec) { s.Limits = &v1alpha1.Limits{QueuedSize: q("32Ki")} },
			want: "spec.limits.queuedSize must be a whole number of bytes between 64Ki and 16Gi, got 32Ki"},
		{name: "no registered memory", mutate: func(s *v1alpha1.RDMAServiceSpec) { s.Limits = &v1alpha1.Limits{RegisteredSize: q("0")} },
			want: "spec.limits.registeredSize must be a whole number of bytes between 1 and 1Ti, got 0"},
		{name: "a fraction of a byte a second", mutate: func(s *v1alpha1.RDMAServiceSpec) { s.Limits = &v1alpha1.Limits{ByteRate: q("1500m")} },
			want: "spec.limits.byteRate must be a whole number of bytes between 0 and 1Ti, got 1500m"},
		{name: "a byte rate past 1Ti", mutate: func(s *v1alpha1.RDMAServiceSpec) { s.Limits = &v1alpha1.Limits{ByteRate: q("2Ti")} },
			want: "spec.limits.byteRate must be a whole number of bytes between 0 and 1Ti, got 2Ti"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			svc := newService("unsafe", "unsafe")
			svc.UID, svc.Finalizers = "uid-unsafe", []string{Finalizer}
			tt.mutate(&svc.Spec)
			node := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "unsafe-node", Labels: map[string]string{"unsafe": "true"}}}
			// What an operator before the rule rendered for the service.
			old := &appsv1.DaemonSet{ObjectMeta: metav1.ObjectMeta{Name: objectName(svc), Namespace: testNamespace,
				Labels: commonLabels(svc)}}
			c := fake.NewClientBuilder().WithScheme(testenv.Scheme()).
				WithObjects(svc, node, old).
				WithStatusSubresource(&v1alpha1.RDMAService{}).
				WithIndex(&v1alpha1.RDMANode{}, indexServiceName, func(o client.Object) []string {
					return []string{o.(*v1alpha1.RDMANode).Spec.ServiceName}
				}).Build()
			r := New(c, testNamespace, testImage)
			if _, err := r.Reconcile(testCtx(t), ctrl.Request{NamespacedName: client.ObjectKeyFromObject(svc)}); err != nil && tt.want == "" {
				t.Fatalf("Reconcile: %v", err)
			}
			var ds appsv1.DaemonSetList
			if err := c.List(testCtx(t), &ds, client.InNamespace(testNamespace)); err != nil {
				t.Fatal(err)
			}
			got := &v1alpha1.RDMAService{}
			if err := c.Get(testCtx(t), client.ObjectKeyFromObject(svc), got); err != nil {
				t.Fatal(err)
			}
			ready := meta.FindStatusCondition(got.Status.Conditions, v1alpha1.ConditionReady)
			degraded := meta.FindStatusCondition(got.Status.Conditions, v1alpha1.ConditionDegraded)
			if tt.want == "" {
				if len(ds.Items) != 1 || ready == nil || ready.Reason == ReasonInvalidSpec {
					t.Fatalf("valid spec: DaemonSets %d, Ready %+v; want 1 and not %s", len(ds.Items), ready, ReasonInvalidSpec)
				}
				return
			}
			if len(ds.Items) != 0 {
				t.Errorf("DaemonSets left: %d, want 0", len(ds.Items))
			}
			if ready == nil || ready.Status != metav1.ConditionFalse || ready.Reason != ReasonInvalidSpec || !strings.Contains(ready.Message, tt.want) {
				t.Errorf("Ready %+v, want False %s with %q", ready, ReasonInvalidSpec, tt.want)
			}
			if degraded == nil || degraded.Status != metav1.ConditionTrue || degraded.Reason != ReasonInvalidSpec {
				t.Errorf("Degraded %+v, want True %s", degraded, ReasonInvalidSpec)
			}
		})
	}
}

// TestRenderAgentPriority: the agents run at the priority the request
// bounds are made for, with the requests the spec asks (within them).
func TestRenderAgentPriority(t *testing.T) {
	svc := newService("prio", "prio")
	svc.Spec.Agent.Resources = &corev1.ResourceRequirements{
		Requests: corev1.ResourceList{corev1.ResourceCPU: resource.MustParse(v1alpha1.MaxAgentCPURequest)},
		Limits:   corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("16")}}
	if err := validateSpec(&svc.Spec); err != nil {
		t.Fatalf("requests at the bound: %v", err)
	}
	cfg, data, err := renderConfig(svc)
	if err != nil {
		t.Fatal(err)
	}
	pod := renderDaemonSet(svc, testNamespace, testImage, cfg, data, nil, false).Spec.Template.Spec
	if pod.PriorityClassName == nil || *pod.PriorityClassName != "system-node-critical" {
		t.Errorf("priority class %v, want system-node-critical", pod.PriorityClassName)
	}
	for _, c := range pod.Containers {
		if *c.Name != "agent" {
			continue
		}
		if req := (*c.Resources.Requests)[corev1.ResourceCPU]; req.Cmp(resource.MustParse(v1alpha1.MaxAgentCPURequest)) != 0 {
			t.Errorf("agent CPU request %s, want %s", req.String(), v1alpha1.MaxAgentCPURequest)
		}
	}
}
