package kubectlplugin

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"io"
	"math/big"
	"net/http"
	"net/http/httptest"
	"os"
	"strings"
	"testing"
	"time"

	restclient "k8s.io/client-go/rest"
)

// scrapeTLS presents the kubeconfig's credentials, a bearer token or a
// client certificate, over TLS to a server whose certificate is its own;
// a refusal is an error with the agent's words.
func TestScrapeTLS(t *testing.T) {
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch {
		case r.URL.Path != "/metrics":
			http.NotFound(w, r)
		case r.Header.Get("Authorization") == "Bearer t0ken":
			io.WriteString(w, "rdmavisor_peers 0\n")
		case len(r.TLS.PeerCertificates) == 1 && r.TLS.PeerCertificates[0].Subject.CommonName == "alice":
			io.WriteString(w, "rdmavisor_peers 1\n")
		default:
			http.Error(w, "unauthorized: present a bearer token", http.StatusUnauthorized)
		}
	}))
	srv.TLS = &tls.Config{ClientAuth: tls.RequestClientCert}
	srv.StartTLS()
	defer srv.Close()
	addr := strings.TrimPrefix(srv.URL, "https://")
	ctx := context.Background()

	if b, err := scrapeTLS(ctx, &restclient.Config{BearerToken: "t0ken"}, addr); err != nil || string(b) != "rdmavisor_peers 0\n" {
		t.Errorf("with a token: %q %v", b, err)
	}
	cert, key := clientCert(t, "alice")
	if b, err := scrapeTLS(ctx, &restclient.Config{TLSClientConfig: restclient.TLSClientConfig{CertData: cert, KeyData: key}}, addr); err != nil || string(b) != "rdmavisor_peers 1\n" {
		t.Errorf("with a client certificate: %q %v", b, err)
	}
	_, err := scrapeTLS(ctx, &restclient.Config{BearerToken: "wrong"}, addr)
	if err == nil || !strings.Contains(err.Error(), "401") || !strings.Contains(err.Error(), "present a bearer token") {
		t.Errorf("refused: %v, want the status and the server's words", err)
	}
}

// clientCert is a self-signed client certificate of cn and its key, PEM.
func clientCert(t *testing.T, cn string) (cert, key []byte) {
	t.Helper()
	k, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: cn},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &k.PublicKey, k)
	if err != nil {
		t.Fatal(err)
	}
	kd, err := x509.MarshalECPrivateKey(k)
	if err != nil {
		t.Fatal(err)
	}
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: kd})
}

// The metrics port: the agent container's port named metrics, else the
// scrape annotation's, else 7472.
func TestMetricsPort(t *testing.T) {
	pod := agentPod("rdmavisor-agent-default-aaaaa", "node-a")
	pod.Spec.Containers[0].Ports[1].ContainerPort = 9090
	if p := metricsPort(pod); p != "9090" {
		t.Errorf("port %s, want 9090", p)
	}
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
