package agent_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/rdmavisor/rdmavisor/internal/agent/agenttest"
	"github.com/rdmavisor/rdmavisor/internal/poll"
	"github.com/rdmavisor/rdmavisor/pkg/vconn"
)

// TestAcceptShare: tenant A's pod on node-a dials a service pod on node-b,
// whose allocation has 16 vconns, until it is refused, and holds every
// vconn it got. A holds at most three quarters of the quota (12), its
// refusal names the limit, and tenant B's pod on node-a still gets in
// (figure: B's dials refused 0 of 4, the quarter kept). Once A closes its
// vconns it gets its share again.
func TestAcceptShare(t *testing.T) {
	cl := startCluster(t, agenttest.Options{})
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	nodeA, nodeB := cl.Nodes[0], cl.Nodes[1]
	srv := podClient(t, ctx, nodeB, "svc", "server", "10.244.1.10", 16)
	tenantA := podClient(t, ctx, nodeA, "tenant-a", "greedy", "10.244.0.10", 32)
	tenantB := podClient(t, ctx, nodeA, "tenant-b", "client", "10.244.0.11", 16)
	ln, err := srv.Listen(ctx, ":7000")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	go agenttest.ServeEcho(ln)

	var held []*vconn.Conn
	defer func() {
		for _, c := range held {
			_ = c.Close()
		}
	}()
	var refusal error
	for range 16 {
		c, err := tenantA.Dial(ctx, "10.244.1.10:7000")
		if err != nil {
			refusal = err
			break
		}
		held = append(held, c)
	}
	t.Logf("tenant A holds %d vconns of the service's 16, then: %v", len(held), refusal)
	if len(held) > 12 {
		t.Errorf("tenant A holds %d of the service's 16 vconns, want at most three quarters, 12", len(held))
	}
	if !errors.Is(refusal, vconn.ErrQuota) || !strings.Contains(refusal.Error(), "the most one caller may") {
		t.Errorf("tenant A's dial past its share: %v, want ErrQuota naming the per-caller limit", refusal)
	}
	refused := 0
	for i := range 4 {
		c, err := tenantB.Dial(ctx, "10.244.1.10:7000")
		if err != nil {
			refused++
			t.Logf("tenant B's dial %d: %v", i, err)
			continue
		}
		echoes(t, c, "tenant B")
		defer c.Close()
	}
	if refused != 0 {
		t.Errorf("tenant B's dials refused: %d of 4 while tenant A holds its vconns, want 0", refused)
	}
	for _, c := range held {
		_ = c.Close()
	}
	held = nil
	poll.Until(t, 10*time.Second, "tenant A let in again once it closed its vconns", func() bool {
		c, err := tenantA.Dial(ctx, "10.244.1.10:7000")
		if err != nil {
			return false
		}
		_ = c.Close()
		return true
	})
}
