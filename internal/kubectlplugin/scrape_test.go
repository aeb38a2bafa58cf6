package kubectlplugin

import (
	"context"
	"io"
	"os"
	"strings"
	"testing"

	"k8s.io/client-go/kubernetes/fake"
	restclient "k8s.io/client-go/rest"
	clienttesting "k8s.io/client-go/testing"
)

type rawResponse []byte

func (r rawResponse) DoRaw(context.Context) ([]byte, error) { return r, nil }
func (r rawResponse) Stream(context.Context) (io.ReadCloser, error) {
	return io.NopCloser(strings.NewReader(string(r))), nil
}

// ProxySource GETs /metrics on the agent container's port named metrics,
// through the pods/proxy subresource.
func TestProxySource(t *testing.T) {
	kube := fake.NewClientset()
	var got clienttesting.ProxyGetAction
	kube.AddProxyReactor("pods", func(a clienttesting.Action) (bool, restclient.ResponseWrapper, error) {
		got = a.(clienttesting.ProxyGetAction)
		return true, rawResponse("rdmavisor_peers 0\n"), nil
	})
	pod := agentPod("rdmavisor-agent-default-aaaaa", "node-a")
	pod.Spec.Containers[0].Ports[1].ContainerPort = 9090
	b, err := ProxySource{Kube: kube}.Metrics(context.Background(), pod)
	if err != nil || string(b) != "rdmavisor_peers 0\n" {
		t.Fatalf("%q %v", b, err)
	}
	if got.GetNamespace() != agentNS || got.GetName() != pod.Name || got.GetScheme() != "http" || got.GetPort() != "9090" || got.GetPath() != "/metrics" {
		t.Errorf("proxied %s/%s %s:%s%s", got.GetNamespace(), got.GetName(), got.GetScheme(), got.GetPort(), got.GetPath())
	}
	// No port named metrics: the scrape annotation's, else 7472.
	pod.Spec.Containers[0].Ports = nil
	if p := metricsPort(pod); p != "7472" {
		t.Errorf("port %s, want 7472", p)
	}
	pod.Annotations = map[string]string{"prometheus.io/port": "7480"}
	if p := metricsPort(pod); p != "7480" {
		t.Errorf("port %s, want 7480", p)
	}
}

// The series and labels the plugin reads are the agent's: a rename there
// fails here.
func TestSeriesAreTheAgents(t *testing.T) {
	var src strings.Builder
	for _, f := range []string{"../agent/metrics.go", "../agent/metrics_tenant.go", "../agent/tenant.go"} {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		src.Write(b)
	}
	for _, s := range []string{mPodOpen, mPodQuota, mPodMsgsSent, mPodBytesSent, mPodMsgsRecv, mPodBytesRecv, mPodDropped,
		mPodRefusals, mPeerVConns, mQPs, mRailUp, "namespace", "pod", "direction", "reason", "peer", "rail", "type",
		"sent", "ingress", "rc", "uc", "quota", "limit", "refused", "address_in_use"} {
		if !strings.Contains(src.String(), `"`+s+`"`) {
			t.Errorf("%q is not in the agent's metrics code", s)
		}
	}
	var render []byte
	for _, f := range []string{"../../controllers/rdmaservice_render.go", "../../controllers/rdmaservice_render_daemonset.go"} {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		render = append(render, b...)
	}
	for _, s := range []string{labelName, labelService, agentAppName, `WithName("metrics")`, annotationScrapePort} {
		if !strings.Contains(string(render), s) {
			t.Errorf("%q is not in the operator's rendering of the agent pods", s)
		}
	}
}

func TestParseMetrics(t *testing.T) {
	text := `# TYPE rdmavisor_pod_vconns_open gauge
rdmavisor_pod_vconns_open{namespace="a",pod="p"} 3
# TYPE rdmavisor_pod_refusals_total counter
rdmavisor_pod_refusals_total{namespace="a",pod="p",reason="limit"} 2
# TYPE rdmavisor_qps gauge
rdmavisor_qps{peer="n2",rail="1",type="uc"} 5
# TYPE rdmavisor_rail_up gauge
rdmavisor_rail_up{device="d",rail="1"} 0
`
	m, err := parseMetrics("n1", []byte(text))
	if err != nil {
		t.Fatal(err)
	}
	if len(m.pods) != 1 || m.pods[0].VConnsOpen != 3 || m.pods[0].Refusals["limit"] != 2 || m.pods[0].Node != "n1" {
		t.Errorf("pods %+v", m.pods[0])
	}
	if len(m.peers) != 1 || *m.peers[0] != (PeerTraffic{Node: "n1", Peer: "n2", Rail: "1", UCQPs: 5}) {
		t.Errorf("peers %+v", m.peers)
	}
	if up, ok := m.railsUp["1"]; !ok || up {
		t.Errorf("rails %v", m.railsUp)
	}
	if _, err := parseMetrics("n1", []byte("not metrics {")); err == nil {
		t.Error("parsed garbage")
	}
}
