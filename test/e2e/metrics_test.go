//go:build e2e

package e2e

import (
	"crypto/tls"
	"fmt"
	"io"
	"net"
	"net/http"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"time"

	authenticationv1 "k8s.io/api/authentication/v1"
	authorizationv1 "k8s.io/api/authorization/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// metricsMoved scrapes the client's node's agent pod's metrics, as
// Prometheus would from its scrape annotations (over HTTPS, with a
// ServiceAccount's token the agent has the API server review), after the
// echo pods ran:
// the agent counts the client's messages and bytes both ways and its
// allocation, and the device plugin the allocation it made; the server's
// agent the same from its side. Then the operator's, authenticated.
func (e *env) metricsMoved() {
	for _, node := range []string{e.clientNode(), e.serverNode()} {
		e.agentMetricsMoved(node)
	}
	e.operatorMetrics()
}

func (e *env) agentMetricsMoved(node string) {
	pod := e.agentPod(node)
	ann := pod.Annotations
	if ann["prometheus.io/scrape"] != "true" || ann["prometheus.io/path"] != "/metrics" || ann["prometheus.io/scheme"] != "https" {
		e.t.Fatalf("agent pod scrape annotations: %v", ann)
	}
	// Over TLS to whom the cluster authorizes only; the probes' paths
	// stay plain HTTP for the kubelet.
	addr := net.JoinHostPort(pod.Status.PodIP, ann["prometheus.io/port"])
	if code, body := e.get("https://"+addr+"/metrics", ""); code != http.StatusUnauthorized {
		e.t.Errorf("the agent's /metrics without credentials: %d, want 401: %.200s", code, body)
	}
	if code, body := e.get("http://"+addr+"/metrics", e.readerToken()); code != http.StatusBadRequest || !strings.Contains(body, "HTTPS only") {
		e.t.Errorf("the agent's /metrics over plain HTTP: %d, want 400 (HTTPS only): %.200s", code, body)
	}
	if code, _ := e.get("http://"+addr+"/readyz", ""); code != http.StatusOK {
		e.t.Errorf("the agent's /readyz over plain HTTP: %d, want 200", code)
	}
	agent := e.scrape(pod.Name, ann["prometheus.io/port"])
	const msgs, size = 1000, 4096 // what exchange sent, and the server echoed
	for _, c := range []struct {
		metric string
		min    float64
	}{
		{"rdmavisor_messages_sent_total", msgs},
		{"rdmavisor_messages_received_total", msgs},
		{"rdmavisor_sent_bytes_total", msgs * size},
		{"rdmavisor_received_bytes_total", msgs * size},
		{"rdmavisor_doorbells_total", 1},
		{"rdmavisor_poller_busy_seconds_total", 1e-9},
	} {
		if got := agent.sum(c.metric); got < c.min {
			e.t.Errorf("%s = %v, want at least %v", c.metric, got, c.min)
		}
	}
	if got := agent.sum(`rdmavisor_allocations`); got != 1 {
		e.t.Errorf("rdmavisor_allocations on %s = %v, want 1 (the echo server's or client's)", node, got)
	}
	if got := agent.sum(`rdmavisor_vconn_quota{kind="capacity"}`); got != float64(e.capacity) {
		e.t.Errorf(`rdmavisor_vconn_quota{kind="capacity"} = %v, want %d`, got, e.capacity)
	}
	if got := agent.sum(`rdmavisor_qps`); got < 1 {
		e.t.Errorf("rdmavisor_qps = %v: the vconns share no QP", got)
	}
	e.t.Logf("agent on %s: %v messages, %v bytes sent; %v messages, %v bytes received; %v retransmissions, %v credit stalls",
		node, agent.sum("rdmavisor_messages_sent_total"), agent.sum("rdmavisor_sent_bytes_total"),
		agent.sum("rdmavisor_messages_received_total"), agent.sum("rdmavisor_received_bytes_total"),
		agent.sum("rdmavisor_retransmissions_total"), agent.sum("rdmavisor_credit_stalls_total"))

	plugin := e.scrape(pod.Name, containerPort(pod.Spec.Containers, "device-plugin", "plugin-metrics"))
	if got := plugin.sum(`rdmavisor_device_plugin_allocate_requests_total{result="ok"}`); got < 1 {
		e.t.Errorf(`device plugin on %s: allocate_requests_total{result="ok"} = %v, want at least 1`, node, got)
	}
}

// operatorMetrics: the operator serves its metrics over HTTPS to a
// ServiceAccount bound to the chart's metrics-reader ClusterRole, and
// refuses a request without a token: its TokenReviews and
// SubjectAccessReviews work with the RBAC the chart grants. The suite runs
// on the node, which reaches pod IPs.
func (e *env) operatorMetrics() {
	leader, _ := e.operatorLeader()
	op, err := e.kube.CoreV1().Pods(namespace).Get(e.ctx, leader, metav1.GetOptions{})
	if err != nil || op.Status.PodIP == "" {
		e.t.Fatalf("operator pod %s: %v %v", leader, op, err)
	}
	url := "https://" + net.JoinHostPort(op.Status.PodIP, containerPort(op.Spec.Containers, "operator", "metrics")) + "/metrics"
	token := e.readerToken()
	if code, body := e.get(url, ""); code != http.StatusUnauthorized {
		e.t.Errorf("GET %s without a token: %d, want 401: %.200s", url, code, body)
	}
	e.eventually("the operator serves its metrics to the reader", time.Minute, func() (bool, string) {
		code, body := e.get(url, token)
		return code == http.StatusOK && strings.Contains(body, "controller_runtime_reconcile_total"), fmt.Sprintf("%d: %.300s", code, body)
	})
}

// scraper is the suite's Prometheus: a ServiceAccount bound to the
// chart's metrics reader ClusterRole (get on the non-resource URL
// /metrics), made at the first scrape, and a token of it.
type scraper struct {
	mu    sync.Mutex
	token string
}

// readerToken is the scraper's token, once the API server authorizes it
// to get /metrics (RBAC takes a moment to reach the authorizer's cache,
// and the agents cache a refusal for 10 s).
func (e *env) readerToken() string {
	e.t.Helper()
	e.scraper.mu.Lock()
	defer e.scraper.mu.Unlock()
	if e.scraper.token != "" {
		return e.scraper.token
	}
	const ns, name = "default", "rdmavisor-e2e-scraper"
	sa := &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns}}
	crb := &rbacv1.ClusterRoleBinding{ObjectMeta: metav1.ObjectMeta{Name: name},
		RoleRef:  rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: release + "-operator-metrics-reader"},
		Subjects: []rbacv1.Subject{{Kind: "ServiceAccount", Name: name, Namespace: ns}}}
	if _, err := e.kube.CoreV1().ServiceAccounts(ns).Create(e.ctx, sa, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		e.t.Fatal(err)
	}
	if _, err := e.kube.RbacV1().ClusterRoleBindings().Create(e.ctx, crb, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		e.t.Fatal(err)
	}
	tr, err := e.kube.CoreV1().ServiceAccounts(ns).CreateToken(e.ctx, name, &authenticationv1.TokenRequest{}, metav1.CreateOptions{})
	if err != nil {
		e.t.Fatal(err)
	}
	user := "system:serviceaccount:" + ns + ":" + name
	e.eventually(user+" may get /metrics", time.Minute, func() (bool, string) {
		r, err := e.kube.AuthorizationV1().SubjectAccessReviews().Create(e.ctx, &authorizationv1.SubjectAccessReview{Spec: authorizationv1.SubjectAccessReviewSpec{
			User: user, NonResourceAttributes: &authorizationv1.NonResourceAttributes{Path: "/metrics", Verb: "get"}}}, metav1.CreateOptions{})
		return err == nil && r.Status.Allowed, fmt.Sprintf("%v %+v", err, r)
	})
	e.scraper.token = tr.Status.Token
	return e.scraper.token
}

// get GETs url with a bearer token (none if ""), trusting any
// certificate: the operator's and the agents' are their own self-signed
// ones, and what is checked here is who may read.
func (e *env) get(url, token string) (int, string) {
	hc := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{TLSClientConfig: &tls.Config{InsecureSkipVerify: true}}}
	req, err := http.NewRequestWithContext(e.ctx, http.MethodGet, url, nil)
	if err != nil {
		e.t.Fatal(err)
	}
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	resp, err := hc.Do(req)
	if err != nil {
		return 0, err.Error()
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

// samples are the lines of a Prometheus text exposition, by series
// (name{labels} as exposed).
type samples map[string]float64

var sampleLine = regexp.MustCompile(`^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{[^}]*\})? ([^ ]+)`)

// sum adds the samples of a metric; a selector with labels,
// name{l="v"}, adds those whose labels include every one given.
func (s samples) sum(selector string) float64 {
	name, labels, _ := strings.Cut(selector, "{")
	want := strings.Split(strings.TrimSuffix(labels, "}"), ",")
	total := 0.0
	for series, v := range s {
		n, l, _ := strings.Cut(series, "{")
		if n != name {
			continue
		}
		ok := true
		for _, w := range want {
			if w != "" && !strings.Contains(","+strings.TrimSuffix(l, "}")+",", ","+w+",") {
				ok = false
			}
		}
		if ok {
			total += v
		}
	}
	return total
}

// scrape GETs /metrics of an agent pod's port over HTTPS with the
// scraper's token, as Prometheus does from the scrape annotations: the
// agent pods run in the host's network, which the suite reaches.
func (e *env) scrape(pod, port string) samples {
	e.t.Helper()
	s, err := e.tryScrape(pod, port)
	if err != nil {
		e.t.Fatal(err)
	}
	return s
}

// tryScrape is scrape for a step that waits: a pod whose kubelet restarts
// may not answer for a moment.
func (e *env) tryScrape(pod, port string) (samples, error) {
	p, err := e.kube.CoreV1().Pods(namespace).Get(e.ctx, pod, metav1.GetOptions{})
	if err != nil {
		return nil, fmt.Errorf("scraping %s:%s: %w", pod, port, err)
	}
	code, body := e.get("https://"+net.JoinHostPort(p.Status.PodIP, port)+"/metrics", e.readerToken())
	if code != http.StatusOK {
		return nil, fmt.Errorf("scraping %s:%s: %d: %.300s", pod, port, code, body)
	}
	s := samples{}
	for line := range strings.Lines(string(body)) {
		m := sampleLine.FindStringSubmatch(strings.TrimSpace(line))
		if m == nil {
			continue
		}
		v, err := strconv.ParseFloat(m[3], 64)
		if err != nil {
			return nil, fmt.Errorf("scraping %s:%s: %q: %w", pod, port, line, err)
		}
		s[m[1]+m[2]] = v
	}
	if len(s) == 0 {
		return nil, fmt.Errorf("scraping %s:%s: no samples in\n%s", pod, port, body)
	}
	return s, nil
}

func containerPort(cs []corev1.Container, container, name string) string {
	for _, c := range cs {
		if c.Name != container {
			continue
		}
		for _, p := range c.Ports {
			if p.Name == name {
				return fmt.Sprint(p.ContainerPort)
			}
		}
	}
	return ""
}
