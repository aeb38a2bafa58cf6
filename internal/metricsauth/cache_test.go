package metricsauth

import (
	"net/http"
	"testing"
	"time"

	authenticationv1 "k8s.io/api/authentication/v1"
	authorizationv1 "k8s.io/api/authorization/v1"
)

func TestAllowedDecisionCached(t *testing.T) {
	c := newCluster()
	c.tokens["good"] = prometheus
	f := start(t, c, Options{TTL: time.Minute})
	cl := f.client(t)
	reviews := func() (int32, int32) { return f.tokenReviews.Load(), f.sars.Load() }

	for range 2 {
		if res := f.get(t, cl, "/metrics", "good"); res.code != http.StatusOK {
			t.Fatalf("got %d, want 200", res.code)
		}
	}
	if tr, sar := reviews(); tr != 1 || sar != 1 {
		t.Fatalf("two requests with one token: %d token reviews, %d access reviews, want 1 and 1", tr, sar)
	}
	f.clock.Advance(59 * time.Second)
	f.get(t, cl, "/metrics", "good")
	if tr, sar := reviews(); tr != 1 || sar != 1 {
		t.Errorf("within TTL: %d token reviews, %d access reviews, want 1 and 1", tr, sar)
	}
	f.clock.Advance(time.Second)
	f.get(t, cl, "/metrics", "good")
	if tr, sar := reviews(); tr != 2 || sar != 2 {
		t.Errorf("after TTL: %d token reviews, %d access reviews, want 2 and 2", tr, sar)
	}
	// The path is part of the key: being allowed /metrics says nothing of /debug.
	f.get(t, cl, "/debug", "good")
	if sar := f.sars.Load(); sar != 3 {
		t.Errorf("another path: %d access reviews, want 3", sar)
	}
}

func TestDeniedDecisionCachedShortly(t *testing.T) {
	c := newCluster()
	c.tokens["bob"] = authenticationv1.UserInfo{Username: "bob"}
	c.setPolicy(func(authorizationv1.SubjectAccessReviewSpec) (bool, string, error) { return false, "", nil })
	f := start(t, c, Options{TTL: time.Hour, DeniedTTL: 10 * time.Second})
	cl := f.client(t)

	for range 2 {
		if res := f.get(t, cl, "/metrics", "bob"); res.code != http.StatusForbidden {
			t.Fatalf("got %d, want 403", res.code)
		}
	}
	if sar := f.sars.Load(); sar != 1 {
		t.Fatalf("two denied requests: %d access reviews, want 1", sar)
	}
	c.setPolicy(func(authorizationv1.SubjectAccessReviewSpec) (bool, string, error) { return true, "", nil })
	f.clock.Advance(9 * time.Second)
	if res := f.get(t, cl, "/metrics", "bob"); res.code != http.StatusForbidden {
		t.Errorf("within DeniedTTL: got %d, want the cached 403", res.code)
	}
	f.clock.Advance(time.Second)
	if res := f.get(t, cl, "/metrics", "bob"); res.code != http.StatusOK {
		t.Errorf("after DeniedTTL, now allowed: got %d, want 200", res.code)
	}
	if sar := f.sars.Load(); sar != 2 {
		t.Errorf("%d access reviews, want 2", sar)
	}
}

func TestUnauthenticatedTokenCachedShortly(t *testing.T) {
	f := start(t, newCluster(), Options{DeniedTTL: 10 * time.Second})
	cl := f.client(t)

	f.get(t, cl, "/metrics", "forged")
	if res := f.get(t, cl, "/metrics", "forged"); res.code != http.StatusUnauthorized {
		t.Fatalf("cached: got %d, want 401", res.code)
	}
	if tr := f.tokenReviews.Load(); tr != 1 {
		t.Errorf("two requests with a forged token: %d token reviews, want 1", tr)
	}
	f.clock.Advance(10 * time.Second)
	f.get(t, cl, "/metrics", "forged")
	if tr := f.tokenReviews.Load(); tr != 2 {
		t.Errorf("after DeniedTTL: %d token reviews, want 2", tr)
	}
}

func TestCacheEvictsOldest(t *testing.T) {
	c := newCache(2)
	now := time.Now()
	key := func(p string) cacheKey { return cacheKey{path: p, verb: "get"} }
	ok := decision{code: http.StatusOK}
	c.put(key("/a"), ok, now.Add(time.Minute))
	c.put(key("/b"), ok, now.Add(time.Minute))
	c.put(key("/c"), ok, now.Add(time.Minute))

	if _, hit := c.get(key("/a"), now); hit {
		t.Error("oldest entry kept beyond MaxCached")
	}
	for _, p := range []string{"/b", "/c"} {
		if _, hit := c.get(key(p), now); !hit {
			t.Errorf("%s evicted, want only the oldest gone", p)
		}
	}
	if n := c.len(); n != 2 {
		t.Errorf("%d entries, want 2", n)
	}
	if _, hit := c.get(key("/b"), now.Add(time.Minute)); hit {
		t.Error("entry returned at its expiry")
	}
	if n := c.len(); n != 1 {
		t.Errorf("%d entries after an expired get, want 1", n)
	}
}
