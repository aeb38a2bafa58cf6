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
	if r := fetch(t, plain, "http://"+addr+"/healthz", ""); r.code != http.StatusOK || r.body != "ok\n" {
		t.Errorf("plain /healthz: %d %q, want 200 ok", r.code, r.body)
	}
	if r := fetch(t, plain, "http://"+addr+"/metrics", "good"); r.code != http.StatusBadRequest || !strings.Contains(r.body, "HTTPS only") {
		t.Errorf("plain /metrics: %d %q, want 400 saying HTTPS only", r.code, r.body)
	}
	secure := &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{TLSClientConfig: &tls.Config{InsecureSkipVerify: true}}}
	if r := fetch(t, secure, "https://"+addr+"/metrics", "good"); r.code != http.StatusOK || r.body != "metric_total 1\n" {
		t.Errorf("TLS /metrics with a token: %d %q, want 200 and the metrics", r.code, r.body)
	}
	if r := fetch(t, secure, "https://"+addr+"/metrics", ""); r.code != http.StatusUnauthorized {
		t.Errorf("TLS /metrics without credentials: %d, want 401", r.code)
	}
	if r := fetch(t, secure, "https://"+addr+"/healthz", ""); r.code != http.StatusOK {
		t.Errorf("TLS /healthz: %d, want 200", r.code)
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
