package agent_test

import (
	"testing"

	"github.com/rdmavisor/rdmavisor/internal/agent/agenttest"
	"github.com/rdmavisor/rdmavisor/internal/config"
)

// TestListedGIDCannotTakeAnother is issue 33's finding 4: a node lists
// another node's GID (its address) in its RDMANode, as an agent may write
// anything into its own, and sorts first by name. node-b's GID stays
// node-b's: node-a's dials to node-b all work (dials refused: 0 of 5),
// where the first node by name won the GID and every dial was refused.
func TestListedGIDCannotTakeAnother(t *testing.T) {
	cl := startCluster(t, agenttest.Options{TLS: true, TuneConfig: func(c *config.AgentConfig) {
		if c.NodeName != "node-a" {
			return
		}
		// node-0, which no agent serves, lists node-b's address (127.0.0.3)
		// as its rail 1's GID.
		liar := config.Peer{NodeName: "node-0", Address: "127.0.0.9:9", RailGIDs: []string{"127.0.0.3"}}
		c.PeerDiscovery.Static = append([]config.Peer{liar}, c.PeerDiscovery.Static...)
	}})
	a, b := cl.Nodes[0], cl.Nodes[1]
	ctx := ctxT(t)
	ln, err := appClient(t, b, "srv", 8).Listen(ctx, ":7")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	go agenttest.ServeEcho(ln)
	cli := appClient(t, a, "cli", 8)
	refused := 0
	for range 5 {
		c, err := cli.Dial(ctx, "node-b:7")
		if err != nil {
			t.Logf("dial: %v", err)
			refused++
			continue
		}
		echoes(t, c, "node-b's own")
		_ = c.Close()
	}
	if refused != 0 {
		t.Errorf("node-a's dials to node-b refused: %d of 5, want 0", refused)
	}
}
