package kubectlplugin

import (
	"bytes"
	"context"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
	corev1 "k8s.io/api/core/v1"
)

// MetricsSource reads an agent pod's /metrics, in Prometheus' text format.
type MetricsSource interface {
	Metrics(ctx context.Context, agent *corev1.Pod) ([]byte, error)
}

// metricsPort is the agent container's port named metrics, else the
// scrape annotation's, else the default.
func metricsPort(p *corev1.Pod) string {
	for _, c := range p.Spec.Containers {
		for _, cp := range c.Ports {
			if c.Name == agentContainer && cp.Name == metricsPortName {
				return strconv.Itoa(int(cp.ContainerPort))
			}
		}
	}
	if v := p.Annotations[annotationScrapePort]; v != "" {
		return v
	}
	return defaultMetricsPort
}

// The agent's series the plugin reads (internal/agent/metrics.go and
// metrics_tenant.go; docs/architecture.md, Metrics).
const (
	mPodOpen      = "rdmavisor_pod_vconns_open"
	mPodQuota     = "rdmavisor_pod_vconn_quota"
	mPodMsgsSent  = "rdmavisor_pod_messages_sent_total"
	mPodBytesSent = "rdmavisor_pod_sent_bytes_total"
	mPodMsgsRecv  = "rdmavisor_pod_messages_received_total"
	mPodBytesRecv = "rdmavisor_pod_received_bytes_total"
	mPodDropped   = "rdmavisor_pod_messages_dropped_total"
	mPodRefusals  = "rdmavisor_pod_refusals_total"
	mPeerVConns   = "rdmavisor_peer_vconns"
	mQPs          = "rdmavisor_qps"
	mRailUp       = "rdmavisor_rail_up"
)

// PodTraffic is one pod's per-pod series on one node's agent: its
// allocations' sums, counted since they were made.
type PodTraffic struct {
	Namespace        string            `json:"namespace"`
	Pod              string            `json:"pod"`
	Node             string            `json:"node"`
	VConnsOpen       int64             `json:"vconnsOpen"`
	VConnQuota       int64             `json:"vconnQuota"`
	MessagesSent     uint64            `json:"messagesSent"`
	BytesSent        uint64            `json:"bytesSent"`
	MessagesReceived uint64            `json:"messagesReceived"`
	BytesReceived    uint64            `json:"bytesReceived"`
	DroppedSent      uint64            `json:"droppedSent"`
	DroppedReceived  uint64            `json:"droppedReceived"`
	Refusals         map[string]uint64 `json:"refusals"`
}

// Bytes is what the pod sent and received.
func (p *PodTraffic) Bytes() uint64 { return p.BytesSent + p.BytesReceived }

// Messages is what the pod sent and received.
func (p *PodTraffic) Messages() uint64 { return p.MessagesSent + p.MessagesReceived }

// RefusalCount is every refusal, whatever its reason.
func (p *PodTraffic) RefusalCount() uint64 {
	var n uint64
	for _, v := range p.Refusals {
		n += v
	}
	return n
}

// PeerTraffic is what one node's agent holds toward a peer node on a rail.
type PeerTraffic struct {
	Node      string `json:"node"`
	Peer      string `json:"peer"`
	Rail      string `json:"rail"`
	VConns    int64  `json:"vconns"`
	RCQPs     int64  `json:"rcQPs"`
	UCQPs     int64  `json:"ucQPs"`
	IngressQP int64  `json:"ingressQPs"`
}

// agentMetrics is what one agent's /metrics says, or why it could not be read.
type agentMetrics struct {
	node  string
	pods  []*PodTraffic
	peers []*PeerTraffic
	// railsUp by rail: false while the rail's port is down.
	railsUp map[string]bool
	err     error
}

// parseMetrics reads the series of an agent on node.
func parseMetrics(node string, text []byte) (*agentMetrics, error) {
	p := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := p.TextToMetricFamilies(bytes.NewReader(text))
	if err != nil {
		return nil, fmt.Errorf("parsing the metrics of the agent on %s: %w", node, err)
	}
	am := &agentMetrics{node: node, railsUp: map[string]bool{}}
	pods := map[[2]string]*PodTraffic{}
	for name, f := range fams {
		for _, m := range f.GetMetric() {
			am.podSample(pods, name, m)
			am.peerSample(name, m)
			if name == mRailUp {
				am.railsUp[label(m, "rail")] = value(m) == 1
			}
		}
	}
	for _, t := range pods {
		am.pods = append(am.pods, t)
	}
	slices.SortFunc(am.pods, comparePods)
	slices.SortFunc(am.peers, func(a, b *PeerTraffic) int {
		return strings.Compare(a.Peer+"\x00"+a.Rail, b.Peer+"\x00"+b.Rail)
	})
	return am, nil
}

func comparePods(a, b *PodTraffic) int {
	if c := strings.Compare(a.Namespace, b.Namespace); c != 0 {
		return c
	}
	if c := strings.Compare(a.Pod, b.Pod); c != 0 {
		return c
	}
	return strings.Compare(a.Node, b.Node)
}

func (am *agentMetrics) podSample(pods map[[2]string]*PodTraffic, name string, m *dto.Metric) {
	if !strings.HasPrefix(name, "rdmavisor_pod_") {
		return
	}
	k := [2]string{label(m, "namespace"), label(m, "pod")}
	t := pods[k]
	if t == nil {
		t = &PodTraffic{Namespace: k[0], Pod: k[1], Node: am.node, Refusals: map[string]uint64{}}
		pods[k] = t
	}
	v := value(m)
	switch name {
	case mPodOpen:
		t.VConnsOpen = int64(v)
	case mPodQuota:
		t.VConnQuota = int64(v)
	case mPodMsgsSent:
		t.MessagesSent = uint64(v)
	case mPodBytesSent:
		t.BytesSent = uint64(v)
	case mPodMsgsRecv:
		t.MessagesReceived = uint64(v)
	case mPodBytesRecv:
		t.BytesReceived = uint64(v)
	case mPodDropped:
		if label(m, "direction") == "sent" {
			t.DroppedSent = uint64(v)
		} else {
			t.DroppedReceived = uint64(v)
		}
	case mPodRefusals:
		t.Refusals[label(m, "reason")] = uint64(v)
	}
}

func (am *agentMetrics) peerSample(name string, m *dto.Metric) {
	if name != mPeerVConns && name != mQPs {
		return
	}
	peer, rail := label(m, "peer"), label(m, "rail")
	var pt *PeerTraffic
	for _, p := range am.peers {
		if p.Peer == peer && p.Rail == rail {
			pt = p
		}
	}
	if pt == nil {
		pt = &PeerTraffic{Node: am.node, Peer: peer, Rail: rail}
		am.peers = append(am.peers, pt)
	}
	v := int64(value(m))
	switch {
	case name == mPeerVConns:
		pt.VConns = v
	case label(m, "type") == "rc":
		pt.RCQPs = v
	case label(m, "type") == "uc":
		pt.UCQPs = v
	case label(m, "type") == "ingress":
		pt.IngressQP = v
	}
}

func label(m *dto.Metric, name string) string {
	for _, l := range m.GetLabel() {
		if l.GetName() == name {
			return l.GetValue()
		}
	}
	return ""
}

func value(m *dto.Metric) float64 {
	switch {
	case m.GetCounter() != nil:
		return m.GetCounter().GetValue()
	case m.GetGauge() != nil:
		return m.GetGauge().GetValue()
	case m.GetUntyped() != nil:
		return m.GetUntyped().GetValue()
	}
	return 0
}

// scrapeOne reads one agent's metrics; a failure is kept in err.
func (c *Cluster) scrapeOne(ctx context.Context, node string, agent *corev1.Pod) *agentMetrics {
	text, err := c.Metrics.Metrics(ctx, agent)
	if err != nil {
		return &agentMetrics{node: node, err: err}
	}
	am, err := parseMetrics(node, text)
	if err != nil {
		return &agentMetrics{node: node, err: err}
	}
	return am
}

// scrapeAll reads every agent's metrics, a few at once, by node.
func (c *Cluster) scrapeAll(ctx context.Context, agents map[string]*corev1.Pod) map[string]*agentMetrics {
	out := make(map[string]*agentMetrics, len(agents))
	var mu sync.Mutex
	var wg sync.WaitGroup
	sem := make(chan struct{}, 8)
	for node, pod := range agents {
		wg.Go(func() {
			sem <- struct{}{}
			defer func() { <-sem }()
			am := c.scrapeOne(ctx, node, pod)
			mu.Lock()
			out[node] = am
			mu.Unlock()
		})
	}
	wg.Wait()
	return out
}

// scrapeAgents finds the agent pods and reads their metrics.
func (c *Cluster) scrapeAgents(ctx context.Context) (map[string]*agentMetrics, error) {
	agents, err := c.agentPods(ctx)
	if err != nil {
		return nil, err
	}
	return c.scrapeAll(ctx, agents), nil
}

// scrapeErrors are the agents that could not be read, sorted by node.
func scrapeErrors(ms map[string]*agentMetrics) []string {
	var out []string
	for node, m := range ms {
		if m.err != nil {
			out = append(out, fmt.Sprintf("%s: %v", node, m.err))
		}
	}
	slices.Sort(out)
	return out
}
