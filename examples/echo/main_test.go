package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"log"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/rdmavisor/rdmavisor/internal/admin"
	"github.com/rdmavisor/rdmavisor/internal/agent/agenttest"
	"github.com/rdmavisor/rdmavisor/pkg/vconn"
)

// TestEcho runs the example across two agents, with as many vconns as the
// client's allocation holds, 4 messages in flight on each: a server pod
// and a client pod that dials it by its headless Service's name.
func TestEcho(t *testing.T) {
	cl, err := agenttest.Start(agenttest.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	var logs syncBuffer
	log.SetOutput(&logs)
	defer log.SetOutput(os.Stderr)
	newClient := func(n *agenttest.Node, id string) *vconn.Client {
		ip := map[string]string{"server": "10.244.1.4", "client": "10.244.0.4"}[id]
		c, err := n.PodClient(ctx, admin.Pod{UID: "uid-" + id, Namespace: "default", Name: "echo-" + id, IPs: []string{ip}}, id, 2)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = c.Close() })
		return c
	}
	srv, cli := newClient(cl.Nodes[1], "server"), newClient(cl.Nodes[0], "client")
	// The client starts first: the Service's name has no pod until the
	// server's starts, and its dials are refused until the server
	// listens; it retries both.
	const service = "echo.default.svc.cluster.local:7000"
	go func() {
		time.Sleep(150 * time.Millisecond)
		cl.Hosts.Set("echo.default.svc.cluster.local", netip.MustParseAddr("10.244.1.4"))
	}()
	type result struct {
		out string
		err error
	}
	res := make(chan result, 1)
	go func() {
		var count counts
		out, err := client(ctx, cli, service, 2, 200, 3000, 4, &count)
		if err == nil && (count.sent.Load() != 400 || count.delivered.Load() != 400) {
			err = fmt.Errorf("counted %d sent, %d delivered; want 400 of each", count.sent.Load(), count.delivered.Load())
		}
		res <- result{out, err}
	}()
	time.Sleep(300 * time.Millisecond)
	sctx, stop := context.WithCancel(ctx)
	served := make(chan error, 1)
	ready := filepath.Join(t.TempDir(), "ready")
	go func() { served <- serve(sctx, srv, 7000, ready) }()
	r := <-res
	if r.err != nil || !strings.HasPrefix(r.out, "echo: OK 2 vconns, 400 messages of 3000 bytes") {
		t.Fatalf("client: %q, %v", r.out, r.err)
	}
	// The server said where it listens, for a readiness probe.
	var said struct{ Listening string }
	if b, err := os.ReadFile(ready); err != nil || json.Unmarshal(b, &said) != nil || !strings.HasSuffix(said.Listening, ":7000") {
		t.Fatalf("ready file: %q, %v", b, err)
	}
	// A third vconn exceeds the client's allocation of two.
	if _, err := client(ctx, cli, service, 3, 10, 10, 1, new(counts)); err == nil {
		t.Fatal("three vconns on an allocation of two")
	}
	stop()
	if err := <-served; err != nil {
		t.Fatal(err)
	}
	// The server prints the address its clients dial: its pod's.
	if !strings.Contains(logs.String(), "listening on 10.244.1.4:7000") {
		t.Errorf("server's log %q, want \"listening on 10.244.1.4:7000\"", logs.String())
	}
}

// syncBuffer is a log output the test reads while the server writes it.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}
