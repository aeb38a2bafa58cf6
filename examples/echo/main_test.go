package main

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/rdmavisor/rdmavisor/internal/agent/agenttest"
	"github.com/rdmavisor/rdmavisor/pkg/vconn"
)

// TestEcho runs the example across two agents, with as many vconns as the
// client's allocation holds.
func TestEcho(t *testing.T) {
	cl, err := agenttest.Start(agenttest.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	newClient := func(n *agenttest.Node, id string) *vconn.Client {
		c, err := n.Client(ctx, id, 2)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = c.Close() })
		return c
	}
	srv, cli := newClient(cl.Nodes[1], "server"), newClient(cl.Nodes[0], "client")
	// The client starts first: its dials are refused until the server
	// listens, and retried.
	type result struct {
		out string
		err error
	}
	res := make(chan result, 1)
	go func() {
		var count counts
		out, err := client(ctx, cli, cl.Nodes[1].Name+":7000", 2, 200, 3000, &count)
		if err == nil && (count.sent.Load() != 400 || count.delivered.Load() != 400) {
			err = fmt.Errorf("counted %d sent, %d delivered; want 400 of each", count.sent.Load(), count.delivered.Load())
		}
		res <- result{out, err}
	}()
	time.Sleep(300 * time.Millisecond)
	sctx, stop := context.WithCancel(ctx)
	served := make(chan error, 1)
	go func() { served <- serve(sctx, srv, 7000) }()
	r := <-res
	if r.err != nil || !strings.HasPrefix(r.out, "echo: OK 2 vconns, 400 messages of 3000 bytes") {
		t.Fatalf("client: %q, %v", r.out, r.err)
	}
	// A third vconn exceeds the client's allocation of two.
	if _, err := client(ctx, cli, cl.Nodes[1].Name+":7000", 3, 10, 10, new(counts)); err == nil {
		t.Fatal("three vconns on an allocation of two")
	}
	stop()
	if err := <-served; err != nil {
		t.Fatal(err)
	}
}
