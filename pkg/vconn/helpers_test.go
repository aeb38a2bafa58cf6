package vconn_test

import (
	"context"
	"testing"
	"time"

	"github.com/go-logr/logr/testr"

	"github.com/rdmavisor/rdmavisor/internal/agent/agenttest"
	"github.com/rdmavisor/rdmavisor/pkg/vconn"
)

// cluster starts two agents for one test.
func cluster(t testing.TB, o agenttest.Options) *agenttest.Cluster {
	t.Helper()
	if o.Log.GetSink() == nil && testing.Verbose() {
		o.Log = testr.NewWithInterface(t, testr.Options{Verbosity: 0})
	}
	c, err := agenttest.Start(o)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := c.Close(); err != nil {
			t.Errorf("close cluster: %v", err)
		}
	})
	return c
}

// client allocates k vconns on node n and connects a client to them.
func client(t testing.TB, n *agenttest.Node, id string, k int) *vconn.Client {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	c, err := n.Client(ctx, id, k)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() })
	return c
}

func testCtx(t testing.TB) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	t.Cleanup(cancel)
	return ctx
}

// waitUntil polls cond for up to 10 s, failing the test with what if it
// never holds.
func waitUntil(t testing.TB, cond func() bool, what string) {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); !cond(); time.Sleep(5 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("waiting for %s: timed out", what)
		}
	}
}
