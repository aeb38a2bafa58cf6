package agent_test

import (
	"crypto/tls"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/go-logr/logr/testr"
	authenticationv1 "k8s.io/api/authentication/v1"
	authorizationv1 "k8s.io/api/authorization/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"

	"github.com/rdmavisor/rdmavisor/internal/agent"
	"github.com/rdmavisor/rdmavisor/internal/metricsauth"
)

// TestMetricsGuard: with a MetricsGuard (Kubernetes mode), the agent
// serves the probes' paths over plain HTTP on its metrics address, and
// /metrics only over TLS to a caller the cluster authenticates and
// authorizes.
func TestMetricsGuard(t *testing.T) {
	kube := fake.NewClientset()
	kube.PrependReactor("create", "tokenreviews", func(a k8stesting.Action) (bool, runtime.Object, error) {
		tr := a.(k8stesting.CreateAction).GetObject().(*authenticationv1.TokenReview)
		tr.Status = authenticationv1.TokenReviewStatus{Authenticated: tr.Spec.Token == "reader", User: authenticationv1.UserInfo{Username: "prometheus"}}
		return true, tr, nil
	})
	kube.PrependReactor("create", "subjectaccessreviews", func(a k8stesting.Action) (bool, runtime.Object, error) {
		sar := a.(k8stesting.CreateAction).GetObject().(*authorizationv1.SubjectAccessReview)
		sar.Status.Allowed = sar.Spec.User == "prometheus" && sar.Spec.NonResourceAttributes.Path == "/metrics"
		return true, sar, nil
	})
	g, err := metricsauth.New(t.Context(), metricsauth.Options{Kube: kube, Log: testr.New(t), Public: []string{"/healthz", "/readyz"}})
	if err != nil {
		t.Fatal(err)
	}
	a, ml := standaloneAgent(t, "node-g", "127.0.0.4", func(o *agent.Options) { o.MetricsGuard = g })
	defer a.Close()
	addr := ml.Addr().String()
	plain := &http.Client{Timeout: 5 * time.Second}
	secure := &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{TLSClientConfig: &tls.Config{InsecureSkipVerify: true}}}
	for _, c := range []struct {
		client     *http.Client
		url, token string
		code       int
		body       string
	}{
		{plain, "http://" + addr + "/healthz", "", http.StatusOK, "ok"},
		{plain, "http://" + addr + "/readyz", "", http.StatusOK, "ok"},
		{plain, "http://" + addr + "/metrics", "reader", http.StatusBadRequest, "HTTPS only"},
		{secure, "https://" + addr + "/metrics", "", http.StatusUnauthorized, "bearer token"},
		{secure, "https://" + addr + "/metrics", "stranger", http.StatusUnauthorized, "bearer token"},
		{secure, "https://" + addr + "/metrics", "reader", http.StatusOK, "rdmavisor_vconn_quota"},
	} {
		req, err := http.NewRequest(http.MethodGet, c.url, nil)
		if err != nil {
			t.Fatal(err)
		}
		if c.token != "" {
			req.Header.Set("Authorization", "Bearer "+c.token)
		}
		res, err := c.client.Do(req)
		if err != nil {
			t.Fatalf("GET %s: %v", c.url, err)
		}
		b, _ := io.ReadAll(res.Body)
		res.Body.Close()
		if res.StatusCode != c.code || !strings.Contains(string(b), c.body) {
			t.Errorf("GET %s (token %q): %d %.200q, want %d and %q", c.url, c.token, res.StatusCode, b, c.code, c.body)
		}
	}
}
