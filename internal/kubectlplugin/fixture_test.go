package kubectlplugin

import (
	"bytes"
	"context"
	"fmt"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	eventsv1 "k8s.io/api/events/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes/fake"
	"k8s.io/client-go/tools/clientcmd"
	crfake "sigs.k8s.io/controller-runtime/pkg/client/fake"

	"github.com/rdmavisor/rdmavisor/api/v1alpha1"
)

const agentNS = "rdmavisor-system"

// fixture is a two-node cluster: an RDMAService, two RDMANodes, an agent
// pod on each node, an echo client on node-a and its server on node-b, the
// client's VConnsAllocated Event, and each agent's metrics text. Tests
// change it before calling cluster.
type fixture struct {
	svc     *v1alpha1.RDMAService
	nodes   map[string]*v1alpha1.RDMANode
	agents  map[string]*corev1.Pod
	tenants []*corev1.Pod
	events  []*eventsv1.Event
	metrics map[string]*agentText // by node
}

// agentText is an agent's /metrics: its pods' series and its peers'.
type agentText struct {
	pods  []*PodTraffic
	peers []*PeerTraffic
	rails map[string]int // rail → rdmavisor_rail_up
	err   error
}

func newFixture() *fixture {
	cond := func(t string) metav1.Condition {
		return metav1.Condition{Type: t, Status: metav1.ConditionTrue, Reason: "Serving"}
	}
	f := &fixture{
		svc: &v1alpha1.RDMAService{ObjectMeta: metav1.ObjectMeta{Name: "default"},
			Spec: v1alpha1.RDMAServiceSpec{ResourceName: "rdmavisor.io/vconn", Limits: &v1alpha1.Limits{
				Sessions: new(int32(4)), ByteRate: new(resource.MustParse("100Mi"))}},
			Status: v1alpha1.RDMAServiceStatus{
				Conditions: []metav1.Condition{cond(v1alpha1.ConditionReady),
					{Type: v1alpha1.ConditionProgressing, Status: metav1.ConditionFalse, Reason: "Complete"},
					{Type: v1alpha1.ConditionDegraded, Status: metav1.ConditionFalse, Reason: "Healthy"}},
				DesiredNodes: 2, ReadyNodes: 2, Nodes: "2/2", VConnCapacity: 2048, VConnsAllocated: 10, VConnsInUse: 2}},
		nodes:   map[string]*v1alpha1.RDMANode{},
		agents:  map[string]*corev1.Pod{},
		metrics: map[string]*agentText{},
	}
	for i, n := range []string{"node-a", "node-b"} {
		f.nodes[n] = &v1alpha1.RDMANode{ObjectMeta: metav1.ObjectMeta{Name: n},
			Spec: v1alpha1.RDMANodeSpec{ServiceName: "default"},
			Status: v1alpha1.RDMANodeStatus{
				Conditions:    []metav1.Condition{cond(v1alpha1.ConditionNodeReady), cond(v1alpha1.ConditionDeviceReady), cond(v1alpha1.ConditionPeersReachable)},
				Devices:       []v1alpha1.RDMADevice{{Name: "mlx5_0", Provider: v1alpha1.ProviderIBVerbs, Health: v1alpha1.DeviceHealthy}},
				Address:       &v1alpha1.AgentAddress{IP: fmt.Sprintf("192.168.0.%d", i+1), ControlPort: 7471},
				VConnCapacity: 1024, VConnsAllocated: []int32{2, 8}[i], VConnsOpen: 1}}
		f.agents[n] = agentPod("rdmavisor-agent-default-"+[]string{"aaaaa", "bbbbb"}[i], n)
	}
	f.tenants = []*corev1.Pod{
		tenantPod("echo-client", "node-a", "10.0.0.10", 2),
		tenantPod("echo-server", "node-b", "10.0.1.20", 8),
	}
	f.events = []*eventsv1.Event{{
		ObjectMeta: metav1.ObjectMeta{Name: "echo-client.1", Namespace: "default"},
		Regarding:  corev1.ObjectReference{Kind: "Pod", Namespace: "default", Name: "echo-client", UID: "uid-echo-client"},
		Reason:     "VConnsAllocated", Note: "2 vconns allocated by the RDMAvisor agent on node-a (allocation a1)",
		Type: corev1.EventTypeNormal, Action: "Allocate", ReportingController: "rdmavisor.io/agent",
	}}
	f.metrics["node-a"] = &agentText{
		pods: []*PodTraffic{{Namespace: "default", Pod: "echo-client", VConnsOpen: 1, VConnQuota: 2,
			MessagesSent: 1000, BytesSent: 4096000, MessagesReceived: 1000, BytesReceived: 4096000}},
		peers: []*PeerTraffic{{Peer: "node-b", Rail: "0", VConns: 1, RCQPs: 2, IngressQP: 2}},
		rails: map[string]int{"0": 1},
	}
	f.metrics["node-b"] = &agentText{
		pods: []*PodTraffic{
			{Namespace: "default", Pod: "echo-server", VConnsOpen: 1, VConnQuota: 8,
				MessagesSent: 1000, BytesSent: 4096000, MessagesReceived: 1000, BytesReceived: 4096000},
			{Namespace: "", Pod: "", VConnQuota: 4},
			{Namespace: "team-b", Pod: "batch-0", VConnQuota: 4, Refusals: map[string]uint64{"refused": 3, "quota": 1}},
		},
		peers: []*PeerTraffic{{Peer: "node-a", Rail: "0", VConns: 1, RCQPs: 2, IngressQP: 2}},
		rails: map[string]int{"0": 1},
	}
	return f
}

func agentPod(name, node string) *corev1.Pod {
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: agentNS,
			Labels: map[string]string{labelName: agentAppName, labelService: "default"}},
		Spec: corev1.PodSpec{NodeName: node, HostNetwork: true, Containers: []corev1.Container{{Name: "agent",
			Ports: []corev1.ContainerPort{{Name: "control", ContainerPort: 7471}, {Name: "metrics", ContainerPort: 7472}}}}},
		Status: corev1.PodStatus{Phase: corev1.PodRunning,
			Conditions: []corev1.PodCondition{{Type: corev1.PodReady, Status: corev1.ConditionTrue}}},
	}
}

func tenantPod(name, node, ip string, vconns int64) *corev1.Pod {
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "default", UID: types.UID("uid-" + name)},
		Spec: corev1.PodSpec{NodeName: node, Containers: []corev1.Container{{Name: "echo",
			Resources: corev1.ResourceRequirements{Limits: corev1.ResourceList{"rdmavisor.io/vconn": *resource.NewQuantity(vconns, resource.DecimalSI)}}}}},
		Status: corev1.PodStatus{Phase: corev1.PodRunning, PodIP: ip, PodIPs: []corev1.PodIP{{IP: ip}},
			Conditions: []corev1.PodCondition{{Type: corev1.PodReady, Status: corev1.ConditionTrue}}},
	}
}

// text writes the series as the agent does (names and labels of
// internal/agent/metrics.go and metrics_tenant.go).
func (a *agentText) text() string {
	var b strings.Builder
	typ := func(name, kind string) { fmt.Fprintf(&b, "# HELP %s help\n# TYPE %s %s\n", name, name, kind) }
	typ("rdmavisor_peers", "gauge")
	fmt.Fprintf(&b, "rdmavisor_peers %d\n", len(a.peers))
	typ(mQPs, "gauge")
	for _, p := range a.peers {
		for _, q := range []struct {
			t string
			n int64
		}{{"ingress", p.IngressQP}, {"rc", p.RCQPs}, {"uc", p.UCQPs}} {
			fmt.Fprintf(&b, "%s{peer=%q,rail=%q,type=%q} %d\n", mQPs, p.Peer, p.Rail, q.t, q.n)
		}
	}
	typ(mPeerVConns, "gauge")
	for _, p := range a.peers {
		fmt.Fprintf(&b, "%s{peer=%q,rail=%q} %d\n", mPeerVConns, p.Peer, p.Rail, p.VConns)
	}
	typ(mRailUp, "gauge")
	for r, up := range a.rails {
		fmt.Fprintf(&b, "%s{device=\"mlx5_%s\",rail=%q} %d\n", mRailUp, r, r, up)
	}
	series := []struct {
		name, kind string
		v          func(*PodTraffic) uint64
	}{
		{mPodOpen, "gauge", func(p *PodTraffic) uint64 { return uint64(p.VConnsOpen) }},
		{mPodQuota, "gauge", func(p *PodTraffic) uint64 { return uint64(p.VConnQuota) }},
		{mPodMsgsSent, "counter", func(p *PodTraffic) uint64 { return p.MessagesSent }},
		{mPodBytesSent, "counter", func(p *PodTraffic) uint64 { return p.BytesSent }},
		{mPodMsgsRecv, "counter", func(p *PodTraffic) uint64 { return p.MessagesReceived }},
		{mPodBytesRecv, "counter", func(p *PodTraffic) uint64 { return p.BytesReceived }},
	}
	for _, s := range series {
		typ(s.name, s.kind)
		for _, p := range a.pods {
			fmt.Fprintf(&b, "%s{namespace=%q,pod=%q} %d\n", s.name, p.Namespace, p.Pod, s.v(p))
		}
	}
	typ(mPodDropped, "counter")
	for _, p := range a.pods {
		fmt.Fprintf(&b, "%s{direction=\"received\",namespace=%q,pod=%q} %d\n", mPodDropped, p.Namespace, p.Pod, p.DroppedReceived)
		fmt.Fprintf(&b, "%s{direction=\"sent\",namespace=%q,pod=%q} %d\n", mPodDropped, p.Namespace, p.Pod, p.DroppedSent)
	}
	typ(mPodRefusals, "counter")
	for _, p := range a.pods {
		for _, r := range []string{"address_in_use", "limit", "quota", "refused"} {
			fmt.Fprintf(&b, "%s{namespace=%q,pod=%q,reason=%q} %d\n", mPodRefusals, p.Namespace, p.Pod, r, p.Refusals[r])
		}
	}
	return b.String()
}

// fakeMetrics serves each agent pod's text by its node.
type fakeMetrics struct{ f *fixture }

func (m fakeMetrics) Metrics(_ context.Context, agent *corev1.Pod) ([]byte, error) {
	a := m.f.metrics[agent.Spec.NodeName]
	if a == nil {
		return nil, fmt.Errorf("no agent metrics on %s", agent.Spec.NodeName)
	}
	if a.err != nil {
		return nil, a.err
	}
	return []byte(a.text()), nil
}

// cluster is the fixture behind fake clients.
func (f *fixture) cluster(t *testing.T) *Cluster {
	t.Helper()
	scheme := runtime.NewScheme()
	if err := v1alpha1.AddToScheme(scheme); err != nil {
		t.Fatal(err)
	}
	crs := crfake.NewClientBuilder().WithScheme(scheme).WithObjects(f.svc)
	for _, n := range f.nodes {
		crs.WithObjects(n)
	}
	var objs []runtime.Object
	for _, p := range f.agents {
		objs = append(objs, p)
	}
	for _, p := range f.tenants {
		objs = append(objs, p)
	}
	for _, e := range f.events {
		objs = append(objs, e)
	}
	return &Cluster{Kube: fake.NewClientset(objs...), CRs: crs.Build(), Metrics: fakeMetrics{f}}
}

// run runs the plugin's command line against the fixture: its exit
// status, stdout and stderr.
func (f *fixture) run(t *testing.T, args ...string) (code int, stdout, stderr string) {
	t.Helper()
	c := f.cluster(t)
	var out, errOut bytes.Buffer
	connect := func(_ clientcmd.ClientConfig, ns string) (*Cluster, error) {
		c.AgentNamespace = ns
		return c, nil
	}
	code = Run(context.Background(), args, &out, &errOut, connect)
	return code, out.String(), errOut.String()
}
