package metricsauth

import (
	"errors"
	"net/http"
	"reflect"
	"strings"
	"testing"

	authenticationv1 "k8s.io/api/authentication/v1"
	authorizationv1 "k8s.io/api/authorization/v1"
)

// prometheus is the ServiceAccount a token stands for in these tests.
var prometheus = authenticationv1.UserInfo{
	Username: "system:serviceaccount:monitoring:prometheus",
	UID:      "uid-1",
	Groups:   []string{"system:serviceaccounts", "system:serviceaccounts:monitoring"},
	Extra:    map[string]authenticationv1.ExtraValue{"authentication.kubernetes.io/pod-name": {"prometheus-0"}},
}

func TestTokenAllowed(t *testing.T) {
	c := newCluster()
	c.tokens["good"] = prometheus
	f := start(t, c, Options{})

	res := f.get(t, f.client(t), "/metrics", "good")
	if res.code != http.StatusOK || res.body != "metric_total 1\n" {
		t.Fatalf("got %d %q, want 200 and the handler's body", res.code, res.body)
	}
	want := authorizationv1.SubjectAccessReviewSpec{
		User:                  prometheus.Username,
		UID:                   prometheus.UID,
		Groups:                prometheus.Groups,
		Extra:                 map[string]authorizationv1.ExtraValue{"authentication.kubernetes.io/pod-name": {"prometheus-0"}},
		NonResourceAttributes: &authorizationv1.NonResourceAttributes{Path: "/metrics", Verb: "get"},
	}
	if got := c.sar(); !reflect.DeepEqual(got, want) {
		t.Errorf("SubjectAccessReview spec:\n got %+v\nwant %+v", got, want)
	}
}

func TestTokenUnknown(t *testing.T) {
	f := start(t, newCluster(), Options{})

	res := f.get(t, f.client(t), "/metrics", "forged")
	if res.code != http.StatusUnauthorized {
		t.Fatalf("got %d, want 401", res.code)
	}
	if f.served.Load() != 0 || f.sars.Load() != 0 {
		t.Errorf("handler served %d, %d access reviews: want none for an unauthenticated token", f.served.Load(), f.sars.Load())
	}
}

func TestForbidden(t *testing.T) {
	c := newCluster()
	c.tokens["bob"] = authenticationv1.UserInfo{Username: "bob"}
	c.setPolicy(func(authorizationv1.SubjectAccessReviewSpec) (bool, string, error) {
		return false, "no RBAC policy matched", nil
	})
	f := start(t, c, Options{})

	res := f.get(t, f.client(t), "/metrics", "bob")
	if res.code != http.StatusForbidden {
		t.Fatalf("got %d, want 403", res.code)
	}
	want := `forbidden: user "bob" may not get /metrics: no RBAC policy matched`
	if !strings.Contains(res.body, want) {
		t.Errorf("body %q does not say %q", res.body, want)
	}
	if f.served.Load() != 0 {
		t.Error("handler served a forbidden request")
	}
}

func TestReviewErrorsAreNotAllowed(t *testing.T) {
	c := newCluster()
	c.tokens["good"] = prometheus
	c.setPolicy(func(authorizationv1.SubjectAccessReviewSpec) (bool, string, error) {
		return false, "", errors.New("etcdserver: request timed out")
	})
	f := start(t, c, Options{})
	cl := f.client(t)

	for range 2 {
		if res := f.get(t, cl, "/metrics", "good"); res.code != http.StatusInternalServerError {
			t.Fatalf("access review failing: got %d, want 500", res.code)
		}
	}
	if f.sars.Load() != 2 {
		t.Errorf("%d access reviews for two requests: an error must not be cached", f.sars.Load())
	}
	c.mu.Lock()
	c.tokErr = errors.New("connection refused")
	c.mu.Unlock()
	if res := f.get(t, cl, "/metrics", "other"); res.code != http.StatusInternalServerError {
		t.Errorf("token review failing: got %d, want 500", res.code)
	}
	if f.served.Load() != 0 {
		t.Error("handler served a request that could not be authorized")
	}
}

func TestNoCredentials(t *testing.T) {
	f := start(t, newCluster(), Options{})

	res := f.get(t, f.client(t), "/metrics", "")
	if res.code != http.StatusUnauthorized {
		t.Fatalf("got %d, want 401", res.code)
	}
	if h := res.header.Get("WWW-Authenticate"); !strings.HasPrefix(h, "Bearer") {
		t.Errorf("WWW-Authenticate %q, want a Bearer challenge", h)
	}
	if !strings.Contains(res.body, "Bearer") || !strings.Contains(res.body, "client certificate") {
		t.Errorf("body %q does not say what is needed", res.body)
	}
	if n := f.tokenReviews.Load() + f.sars.Load(); n != 0 {
		t.Errorf("%d reviews for a request without credentials", n)
	}
}

func TestPublicPaths(t *testing.T) {
	f := start(t, newCluster(), Options{Public: []string{"/healthz", "/readyz"}})
	cl := f.client(t)

	for _, p := range []string{"/healthz", "/readyz"} {
		if res := f.get(t, cl, p, ""); res.code != http.StatusOK {
			t.Errorf("%s without credentials: got %d, want 200", p, res.code)
		}
	}
	if res := f.get(t, cl, "/healthz/x", ""); res.code != http.StatusUnauthorized {
		t.Errorf("/healthz/x without credentials: got %d, want 401 (only exact paths are public)", res.code)
	}
	if res := f.get(t, cl, "/metrics", ""); res.code != http.StatusUnauthorized {
		t.Errorf("/metrics without credentials: got %d, want 401", res.code)
	}
}

func TestNewRequiresKube(t *testing.T) {
	if _, err := New(t.Context(), Options{}); err == nil {
		t.Fatal("New without Kube: no error")
	}
}
