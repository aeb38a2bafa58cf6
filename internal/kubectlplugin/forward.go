package kubectlplugin

import (
	"bytes"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strconv"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/util/httpstream"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/portforward"
	"k8s.io/client-go/transport/spdy"
)

// ForwardSource scrapes through a port-forward to the agent pod (the API
// server's pods/portforward subresource, as `kubectl port-forward`): the
// agent serves /metrics over TLS only, to callers the cluster authorizes
// (internal/metricsauth), so the plugin presents the user's own
// credentials, a client certificate or a token, which the API server's
// pods/proxy would not pass on. The user needs create on pods/portforward
// in the agents' namespace and get on the non-resource URL /metrics.
type ForwardSource struct {
	Config *rest.Config
	Kube   kubernetes.Interface
}

// Metrics forwards a local port to the agent's metrics port for one GET.
func (s ForwardSource) Metrics(ctx context.Context, agent *corev1.Pod) ([]byte, error) {
	port := metricsPort(agent)
	local, stop, err := s.forward(ctx, agent, port)
	if err != nil {
		return nil, fmt.Errorf("forwarding a port to %s/%s:%s: %w", agent.Namespace, agent.Name, port, err)
	}
	// After the scrape's connection is closed (scrapeTLS closes it).
	defer stop()
	b, err := scrapeTLS(ctx, s.Config, "127.0.0.1:"+local)
	if err != nil {
		return nil, fmt.Errorf("scraping %s/%s:%s/metrics through a port-forward: %w", agent.Namespace, agent.Name, port, err)
	}
	return b, nil
}

// forward listens on a free port of 127.0.0.1 forwarded to the pod's
// port, and returns the local port once it is ready, and stop, which ends
// the forward and waits for it to end.
func (s ForwardSource) forward(ctx context.Context, pod *corev1.Pod, port string) (local string, stop func(), err error) {
	u := s.Kube.CoreV1().RESTClient().Post().Resource("pods").Namespace(pod.Namespace).Name(pod.Name).SubResource("portforward").URL()
	dialer, err := forwardDialer(s.Config, u)
	if err != nil {
		return "", nil, err
	}
	ctx, cancel := context.WithCancel(ctx)
	ready := make(chan struct{})
	var errOut bytes.Buffer
	fw, err := portforward.NewOnAddressesWithContext(ctx, dialer, []string{"127.0.0.1"}, []string{"0:" + port}, ready, io.Discard, &errOut)
	if err != nil {
		cancel()
		return "", nil, err
	}
	done := make(chan error, 1)
	go func() { done <- fw.ForwardPorts() }()
	stop = func() {
		cancel()
		<-done
	}
	select {
	case <-ready:
	case err := <-done:
		cancel()
		return "", nil, errors.Join(err, errorText(errOut.String()))
	case <-ctx.Done():
		stop()
		return "", nil, ctx.Err()
	}
	ports, err := fw.GetPorts()
	if err != nil || len(ports) != 1 {
		stop()
		return "", nil, fmt.Errorf("the forwarded port: %v %w", ports, err)
	}
	return strconv.Itoa(int(ports[0].Local)), stop, nil
}

// forwardDialer dials the port-forward as kubectl does: SPDY tunneled over
// a WebSocket, falling back to SPDY where the API server cannot upgrade.
func forwardDialer(cfg *rest.Config, u *url.URL) (httpstream.Dialer, error) {
	rt, upgrader, err := spdy.RoundTripperFor(cfg)
	if err != nil {
		return nil, err
	}
	direct := spdy.NewDialer(upgrader, &http.Client{Transport: rt}, http.MethodPost, u)
	tunnel, err := portforward.NewSPDYOverWebsocketDialer(u, cfg)
	if err != nil {
		return direct, nil
	}
	return portforward.NewFallbackDialer(tunnel, direct, func(err error) bool {
		return httpstream.IsUpgradeFailure(err) || httpstream.IsHTTPSProxyError(err)
	}), nil
}

// scrapeTLS GETs https://addr/metrics with cfg's credentials: its client
// certificate and key, or its token (a bearer token, a token file, an exec
// plugin's). The agent's certificate is its own, self-signed, and is not
// verified: the connection goes to the pod the API server's port-forward
// chose, through the API server, which verified both ends.
func scrapeTLS(ctx context.Context, cfg *rest.Config, addr string) ([]byte, error) {
	tc, err := rest.TLSConfigFor(cfg)
	if err != nil {
		return nil, err
	}
	if tc == nil {
		tc = &tls.Config{}
	}
	tc = tc.Clone()
	tc.InsecureSkipVerify = true //nolint:gosec // see above: the port-forward is the authenticated path
	tc.RootCAs, tc.ServerName = nil, ""
	rt, err := rest.HTTPWrappersForConfig(cfg, &http.Transport{TLSClientConfig: tc})
	if err != nil {
		return nil, err
	}
	defer func() {
		if t, ok := rt.(interface{ CloseIdleConnections() }); ok {
			t.CloseIdleConnections()
		}
	}()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "https://"+addr+"/metrics", nil)
	if err != nil {
		return nil, err
	}
	res, err := (&http.Client{Transport: rt}).Do(req)
	if err != nil {
		return nil, err
	}
	defer res.Body.Close()
	b, err := io.ReadAll(io.LimitReader(res.Body, maxMetrics))
	if err != nil {
		return nil, err
	}
	if res.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("%s: %s", res.Status, bytes.TrimSpace(b))
	}
	return b, nil
}

// maxMetrics bounds a scrape: an agent's metrics are far smaller.
const maxMetrics = 64 << 20

// errorText is the port-forward's error output as an error, if any.
func errorText(s string) error {
	if s == "" {
		return nil
	}
	return errors.New(s)
}
