package metricsauth

import (
	"crypto/tls"
	"errors"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/go-logr/logr/testr"
)

// TestListenServesBoth: on one port, the probes' paths over plain HTTP,
// /metrics only over TLS with credentials; a connection that sends
// nothing holds up no other; Close ends Serve.
func TestListenServesBoth(t *testing.T) {
	c := newCluster()
	c.tokens["good"] = prometheus
	g, err := New(t.Context(), Options{Kube: c.kube, Log: testr.New(t), Public: []string{"/healthz"}})
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	mux := http.NewServeMux()
	mux.HandleFunc("/healthz", func(w http.ResponseWriter, _ *http.Request) { io.WriteString(w, "ok\n") })
	mux.HandleFunc("/metrics", func(w http.ResponseWriter, _ *http.Request) { io.WriteString(w, "metric_total 1\n") })
	srv := &http.Server{Handler: g.Wrap(mux), ReadHeaderTimeout: 5 * time.Second}
	served := make(chan error, 1)
	go func() { served <- srv.Serve(g.Listen(ln)) }()
	addr := ln.Addr().String()

	// A client that connects and says nothing.
	idle, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer idle.Close()

	plain := &http.Client{Timeout: 5 * time.Second}
	if code, body := fetch(t, plain, "http://"+addr+"/healthz", ""); code != http.StatusOK || body != "ok\n" {
		t.Errorf("plain /healthz: %d %q, want 200 ok", code, body)
	}
	if code, body := fetch(t, plain, "http://"+addr+"/metrics", "good"); code != http.StatusBadRequest || !strings.Contains(body, "HTTPS only") {
		t.Errorf("plain /metrics: %d %q, want 400 saying HTTPS only", code, body)
	}
	secure := &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{TLSClientConfig: &tls.Config{InsecureSkipVerify: true}}}
	if code, body := fetch(t, secure, "https://"+addr+"/metrics", "good"); code != http.StatusOK || body != "metric_total 1\n" {
		t.Errorf("TLS /metrics with a token: %d %q, want 200 and the metrics", code, body)
	}
	if code, _ := fetch(t, secure, "https://"+addr+"/metrics", ""); code != http.StatusUnauthorized {
		t.Errorf("TLS /metrics without credentials: %d, want 401", code)
	}
	if code, _ := fetch(t, secure, "https://"+addr+"/healthz", ""); code != http.StatusOK {
		t.Errorf("TLS /healthz: %d, want 200", code)
	}
	if err := srv.Close(); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-served:
		if !errors.Is(err, http.ErrServerClosed) {
			t.Errorf("Serve: %v, want ErrServerClosed", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("Serve did not return after Close")
	}
}

// fetch GETs url with a bearer token unless it is "".
func fetch(t *testing.T, c *http.Client, url, token string) (int, string) {
	t.Helper()
	req, err := http.NewRequest(http.MethodGet, url, nil)
	if err != nil {
		t.Fatal(err)
	}
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	res, err := c.Do(req)
	if err != nil {
		t.Fatalf("GET %s: %v", url, err)
	}
	defer res.Body.Close()
	b, _ := io.ReadAll(res.Body)
	return res.StatusCode, string(b)
}
