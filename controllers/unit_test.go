package controllers

import (
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/klog/v2"

	"github.com/rdmavisor/rdmavisor/api/v1alpha1"
	"github.com/rdmavisor/rdmavisor/internal/config"
)

func TestAssess(t *testing.T) {
	now := time.Date(2026, 1, 1, 12, 0, 0, 0, time.UTC)
	const timeout = 90 * time.Second
	node := func(status metav1.ConditionStatus, age time.Duration, devices ...v1alpha1.RDMADevice) *v1alpha1.RDMANode {
		rn := &v1alpha1.RDMANode{}
		if status != "" {
			rn.Status.Conditions = []metav1.Condition{{Type: v1alpha1.ConditionNodeReady, Status: status, Reason: "R", Message: "m"}}
		}
		if age >= 0 {
			rn.Status.HeartbeatTime = &metav1.Time{Time: now.Add(-age)}
		}
		rn.Status.Devices = devices
		return rn
	}
	bad := v1alpha1.RDMADevice{Name: "mlx5_1", Health: v1alpha1.DeviceUnhealthy, Message: "port DOWN"}
	tests := []struct {
		name        string
		rn          *v1alpha1.RDMANode
		ready       bool
		pending     bool
		problem     string
		badDevices  int
		wantExpires time.Time
	}{
		{name: "no RDMANode yet", rn: nil, pending: true},
		{name: "no Ready condition", rn: node("", 0), pending: true},
		{name: "unknown", rn: node(metav1.ConditionUnknown, 0), pending: true},
		{name: "ready", rn: node(metav1.ConditionTrue, 10*time.Second), ready: true, wantExpires: now.Add(80 * time.Second)},
		{name: "not ready", rn: node(metav1.ConditionFalse, 0), problem: "R: m"},
		{name: "ready but heartbeat stale", rn: node(metav1.ConditionTrue, 91*time.Second), problem: "no heartbeat for more than 1m30s"},
		{name: "ready without heartbeat", rn: node(metav1.ConditionTrue, -1), problem: "no heartbeat"},
		{name: "ready with a bad device", rn: node(metav1.ConditionTrue, 0, bad), ready: true, badDevices: 1, wantExpires: now.Add(timeout)},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			rep := assess("n1", tt.rn, now, timeout)
			if rep.ready != tt.ready || rep.pending != tt.pending || !strings.HasPrefix(rep.problem, tt.problem) ||
				(tt.problem == "" && rep.problem != "") || len(rep.badDevices) != tt.badDevices || !rep.expires.Equal(tt.wantExpires) {
				t.Errorf("assess = %+v, want ready %v pending %v problem %q bad devices %d expires %v",
					rep, tt.ready, tt.pending, tt.problem, tt.badDevices, tt.wantExpires)
			}
			// A bad device says why, as its agent does.
			if tt.badDevices > 0 && rep.badDevices[0] != "mlx5_1 (port DOWN)" {
				t.Errorf("bad device %q, want %q", rep.badDevices[0], "mlx5_1 (port DOWN)")
			}
		})
	}
}

func TestRenderNodeAffinity(t *testing.T) {
	tests := []struct {
		name     string
		sel      *metav1.LabelSelector
		excluded []string
		// want is the term as "key op values" strings; nil: no affinity.
		want []string
	}{
		{name: "all nodes", sel: nil, want: nil},
		{name: "empty selector", sel: &metav1.LabelSelector{}, want: nil},
		{
			name: "labels sorted, then expressions",
			sel: &metav1.LabelSelector{
				MatchLabels:      map[string]string{"z": "1", "a": "2"},
				MatchExpressions: []metav1.LabelSelectorRequirement{{Key: "gpu", Operator: metav1.LabelSelectorOpDoesNotExist}},
			},
			want: []string{"a In [2]", "z In [1]", "gpu DoesNotExist []"},
		},
		{name: "exclusions only", excluded: []string{"n1", "n2"}, want: []string{"field metadata.name NotIn [n1 n2]"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			aff := renderNodeAffinity(tt.sel, tt.excluded)
			if tt.want == nil {
				if aff != nil {
					t.Fatalf("affinity %+v, want none", aff)
				}
				return
			}
			terms := aff.NodeAffinity.RequiredDuringSchedulingIgnoredDuringExecution.NodeSelectorTerms
			if len(terms) != 1 {
				t.Fatalf("%d terms, want 1 (terms are ORed)", len(terms))
			}
			var got []string
			for _, r := range terms[0].MatchExpressions {
				got = append(got, *r.Key+" "+string(*r.Operator)+" ["+strings.Join(r.Values, " ")+"]")
			}
			for _, r := range terms[0].MatchFields {
				got = append(got, "field "+*r.Key+" "+string(*r.Operator)+" ["+strings.Join(r.Values, " ")+"]")
			}
			if strings.Join(got, ",") != strings.Join(tt.want, ",") {
				t.Errorf("term %q, want %q", got, tt.want)
			}
		})
	}
}

func TestRenderConfig(t *testing.T) {
	q := resource.MustParse("128Mi")
	cpu := func(v string) corev1.ResourceList {
		return corev1.ResourceList{corev1.ResourceCPU: resource.MustParse(v)}
	}
	tests := []struct {
		name  string
		spec  v1alpha1.RDMAServiceSpec
		check func(*config.AgentConfig) bool
		err   string
	}{
		{
			name: "unset fields take the defaults",
			spec: v1alpha1.RDMAServiceSpec{},
			check: func(c *config.AgentConfig) bool {
				return c.Device.Provider == config.ProviderIBVerbs && c.QPsPerPeer == 2 && c.SocketUID == 0 && c.SocketGID == 0
			},
		},
		{
			name: "every field",
			spec: v1alpha1.RDMAServiceSpec{
				Device:    v1alpha1.DeviceSelector{Provider: v1alpha1.ProviderIBVerbs, Names: []string{"mlx5_0"}, Vendors: []string{"mellanox"}},
				Transport: v1alpha1.TransportRC, QPsPerPeer: ptr[int32](3), BufferPoolSize: &q, VConnsPerNode: ptr[int32](10),
				ResourceName: "rdmavisor.io/x", SocketGroup: ptr[int64](2000),
			},
			check: func(c *config.AgentConfig) bool {
				return c.Device.Names[0] == "mlx5_0" && c.Device.Vendors[0] == "mellanox" && c.Transport == config.TransportRC &&
					c.QPsPerPeer == 3 && c.BufferPoolBytes == 128<<20 && c.VConnsPerNode == 10 && c.ResourceName == "rdmavisor.io/x" &&
					c.SocketGID == 2000 && c.SocketUID == 0
			},
		},
		{
			name:  "no CPU limit: pollers left to the agent",
			spec:  v1alpha1.RDMAServiceSpec{Agent: v1alpha1.AgentSpec{Resources: &corev1.ResourceRequirements{Requests: cpu("4")}}},
			check: func(c *config.AgentConfig) bool { return c.Pollers == 0 },
		},
		{
			name:  "pollers from the CPU limit, whole cores",
			spec:  v1alpha1.RDMAServiceSpec{Agent: v1alpha1.AgentSpec{Resources: &corev1.ResourceRequirements{Limits: cpu("2500m")}}},
			check: func(c *config.AgentConfig) bool { return c.Pollers == 2 },
		},
		{
			name:  "at least one poller",
			spec:  v1alpha1.RDMAServiceSpec{Agent: v1alpha1.AgentSpec{Resources: &corev1.ResourceRequirements{Limits: cpu("500m")}}},
			check: func(c *config.AgentConfig) bool { return c.Pollers == 1 },
		},
		{
			name:  "at most the engine's pollers",
			spec:  v1alpha1.RDMAServiceSpec{Agent: v1alpha1.AgentSpec{Resources: &corev1.ResourceRequirements{Limits: cpu("256")}}},
			check: func(c *config.AgentConfig) bool { return c.Pollers == config.MaxPollers },
		},
		{
			// The schema forbids it; the renderer still refuses to write it.
			name: "invalid spec that bypassed the schema",
			spec: v1alpha1.RDMAServiceSpec{QPsPerPeer: ptr[int32](0)},
			err:  "qpsPerPeer",
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			svc := &v1alpha1.RDMAService{ObjectMeta: metav1.ObjectMeta{Name: "s"}, Spec: tt.spec}
			cfg, data, err := renderConfig(svc)
			if tt.err != "" {
				if err == nil || !strings.Contains(err.Error(), tt.err) {
					t.Fatalf("err %v, want one naming %s", err, tt.err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if !tt.check(cfg) || cfg.ServiceName != "s" {
				t.Errorf("config %+v", cfg)
			}
			if _, err := config.Load(data); err != nil {
				t.Errorf("rendered YAML does not load: %v", err)
			}
		})
	}
}

func TestTolerated(t *testing.T) {
	noSchedule := corev1.Taint{Key: "rdma", Value: "yes", Effect: corev1.TaintEffectNoSchedule}
	tests := []struct {
		name        string
		taints      []corev1.Taint
		tolerations []corev1.Toleration
		want        bool
	}{
		{"no taints", nil, nil, true},
		{"PreferNoSchedule is ignored", []corev1.Taint{{Key: "x", Effect: corev1.TaintEffectPreferNoSchedule}}, nil, true},
		{"untolerated NoSchedule", []corev1.Taint{noSchedule}, nil, false},
		{"tolerated by Exists", []corev1.Taint{noSchedule}, []corev1.Toleration{{Key: "rdma", Operator: corev1.TolerationOpExists}}, true},
		{"wrong value", []corev1.Taint{noSchedule}, []corev1.Toleration{{Key: "rdma", Value: "no", Operator: corev1.TolerationOpEqual}}, false},
		{"DaemonSet default tolerations", []corev1.Taint{{Key: corev1.TaintNodeUnschedulable, Effect: corev1.TaintEffectNoSchedule}}, daemonSetTolerations, true},
		{"not-ready NoSchedule is not tolerated by DaemonSets", []corev1.Taint{{Key: corev1.TaintNodeNotReady, Effect: corev1.TaintEffectNoSchedule}}, daemonSetTolerations, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := tolerated(klog.Background(), tt.taints, tt.tolerations); got != tt.want {
				t.Errorf("tolerated = %v, want %v", got, tt.want)
			}
		})
	}
}

func TestOlder(t *testing.T) {
	at := func(name string, sec int64) *v1alpha1.RDMAService {
		return &v1alpha1.RDMAService{ObjectMeta: metav1.ObjectMeta{Name: name, CreationTimestamp: metav1.Unix(sec, 0)}}
	}
	tests := []struct {
		a, b *v1alpha1.RDMAService
		want bool
	}{
		{at("z", 1), at("a", 2), true},
		{at("a", 2), at("z", 1), false},
		{at("a", 1), at("b", 1), true}, // same second: name decides
		{at("b", 1), at("a", 1), false},
	}
	for _, tt := range tests {
		if got := older(tt.a, tt.b); got != tt.want {
			t.Errorf("older(%s@%v, %s@%v) = %v", tt.a.Name, tt.a.CreationTimestamp, tt.b.Name, tt.b.CreationTimestamp, got)
		}
	}
}
