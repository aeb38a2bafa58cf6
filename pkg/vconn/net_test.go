package vconn_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	"github.com/rdmavisor/rdmavisor/internal/agent/agenttest"
)

// TestGRPC runs a real gRPC service, unary and streaming calls, over
// vconns.
func TestGRPC(t *testing.T) {
	cl := cluster(t, agenttest.Options{})
	a := client(t, cl.Nodes[0], "a", 8)
	b := client(t, cl.Nodes[1], "b", 8)
	ctx := testCtx(t)
	ln, err := b.Listen(ctx, ":50051")
	if err != nil {
		t.Fatal(err)
	}
	srv := grpc.NewServer()
	hs := health.NewServer()
	healthpb.RegisterHealthServer(srv, hs)
	go func() { _ = srv.Serve(ln) }()
	defer srv.Stop()

	conn, err := grpc.NewClient("passthrough:///node-b:50051",
		grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithContextDialer(func(ctx context.Context, addr string) (net.Conn, error) { return a.Dial(ctx, addr) }))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	hc := healthpb.NewHealthClient(conn)
	for i := 0; i < 20; i++ {
		rep, err := hc.Check(ctx, &healthpb.HealthCheckRequest{})
		if err != nil {
			t.Fatal(err)
		}
		if rep.Status != healthpb.HealthCheckResponse_SERVING {
			t.Fatalf("status %v", rep.Status)
		}
	}
	// Streaming: Watch sends the current status, then every change.
	wctx, cancel := context.WithCancel(ctx)
	defer cancel()
	w, err := hc.Watch(wctx, &healthpb.HealthCheckRequest{Service: "svc"})
	if err != nil {
		t.Fatal(err)
	}
	want := []healthpb.HealthCheckResponse_ServingStatus{healthpb.HealthCheckResponse_SERVICE_UNKNOWN,
		healthpb.HealthCheckResponse_SERVING, healthpb.HealthCheckResponse_NOT_SERVING}
	for i, st := range want {
		rep, err := w.Recv()
		if err != nil {
			t.Fatal(err)
		}
		if rep.Status != st {
			t.Fatalf("update %d: %v, want %v", i, rep.Status, st)
		}
		if i+1 < len(want) {
			hs.SetServingStatus("svc", want[i+1])
		}
	}
}

// TestHTTP serves net/http over a vconn listener.
func TestHTTP(t *testing.T) {
	cl := cluster(t, agenttest.Options{})
	a := client(t, cl.Nodes[0], "a", 8)
	b := client(t, cl.Nodes[1], "b", 8)
	ctx := testCtx(t)
	ln, err := b.Listen(ctx, ":8080")
	if err != nil {
		t.Fatal(err)
	}
	body := strings.Repeat("rdma ", 50000) // 250 kB: several messages
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprintf(w, "%s %s\n", r.Method, r.URL.Path)
		_, _ = io.WriteString(w, body)
	})}
	go func() { _ = srv.Serve(ln) }()
	defer srv.Close()
	hc := &http.Client{Transport: &http.Transport{
		DialContext: func(ctx context.Context, _, addr string) (net.Conn, error) { return a.Dial(ctx, addr) },
	}}
	defer hc.CloseIdleConnections()
	for i := 0; i < 5; i++ {
		req, _ := http.NewRequestWithContext(ctx, "GET", "http://node-b:8080/hello", nil)
		resp, err := hc.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		got, err := io.ReadAll(resp.Body)
		resp.Body.Close()
		if err != nil {
			t.Fatal(err)
		}
		if want := "GET /hello\n" + body; string(got) != want {
			t.Fatalf("body: %d bytes, want %d", len(got), len(want))
		}
	}
}

// TestDeadlines checks net.Conn deadlines.
func TestDeadlines(t *testing.T) {
	cl := cluster(t, agenttest.Options{})
	a := client(t, cl.Nodes[0], "a", 2)
	b := client(t, cl.Nodes[1], "b", 2)
	ctx := testCtx(t)
	ln, err := b.Listen(ctx, ":7")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	accepted := make(chan net.Conn, 1)
	go func() {
		c, err := ln.Accept()
		if err == nil {
			accepted <- c
		}
	}()
	c, err := a.Dial(ctx, "127.0.0.3:7")
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	srv := <-accepted
	defer srv.Close()
	_ = c.SetReadDeadline(time.Now().Add(50 * time.Millisecond))
	start := time.Now()
	if _, err := c.Read(make([]byte, 1)); !errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("Read past the deadline: %v", err)
	}
	var ne net.Error
	if _, err := c.Read(make([]byte, 1)); !errors.As(err, &ne) || !ne.Timeout() {
		t.Fatalf("Read error %v is not a timeout", err)
	}
	if d := time.Since(start); d > 2*time.Second {
		t.Fatalf("deadline took %v", d)
	}
	_ = c.SetReadDeadline(time.Time{})
	if _, err := srv.Write([]byte("hi")); err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, 2)
	if _, err := io.ReadFull(c, buf); err != nil || string(buf) != "hi" {
		t.Fatalf("read after clearing the deadline: %q %v", buf, err)
	}
	_ = c.SetWriteDeadline(time.Now().Add(-time.Second))
	if _, err := c.Write([]byte("x")); !errors.Is(err, os.ErrDeadlineExceeded) {
		// A write with window left does not wait, so it may succeed.
		if err != nil {
			t.Fatalf("Write past the deadline: %v", err)
		}
	}
	if c.LocalAddr().Network() != "vconn" || c.RemoteAddr().String() != "127.0.0.3:7" {
		t.Fatalf("addresses %v %v", c.LocalAddr(), c.RemoteAddr())
	}
}
