package agent_test

import (
	"testing"
	"time"

	"github.com/rdmavisor/rdmavisor/internal/agent/agenttest"
	"github.com/rdmavisor/rdmavisor/internal/poll"
)

// TestPeersThatLeaveAreForgotten: a peer agent that discovery no longer
// lists is kept while a vconn uses it and forgotten (connection, heartbeat,
// engine peer) once none does; a later dial to it, when it is back, works.
func TestPeersThatLeaveAreForgotten(t *testing.T) {
	cl := startCluster(t, agenttest.Options{})
	a, b := cl.Nodes[0], cl.Nodes[1]
	ctx := ctxT(t)
	srv := appClient(t, b, "srv", 4)
	ln, err := srv.Listen(ctx, ":5")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	go agenttest.ServeDiscard(ln)
	cli := appClient(t, a, "cli", 4)
	c, err := cli.Dial(ctx, "node-b:5")
	if err != nil {
		t.Fatal(err)
	}
	if n := a.Agent.Remotes(); n != 1 {
		t.Fatalf("%d remotes before, want 1", n)
	}
	a.Agent.PeersChanged(nil)
	if n := a.Agent.Remotes(); n != 1 {
		t.Fatalf("a peer in use was forgotten: %d remotes", n)
	}
	if _, err := c.Write([]byte("still here")); err != nil {
		t.Fatalf("vconn broken by discovery: %v", err)
	}
	if err := c.Close(); err != nil {
		t.Fatal(err)
	}
	// The vconn's close completes asynchronously in the engine: retry.
	poll.Until(t, 10*time.Second, "node-b forgotten", func() bool {
		a.Agent.PeersChanged(nil)
		return a.Agent.Remotes() == 0
	})
	c, err = cli.Dial(ctx, "node-b:5")
	if err != nil {
		t.Fatalf("dial after the peer was forgotten: %v", err)
	}
	if _, err := c.Write([]byte("back")); err != nil {
		t.Fatal(err)
	}
	_ = c.Close()
}
