package agent_test

import (
	"errors"
	"testing"

	"github.com/rdmavisor/rdmavisor/internal/agent/agenttest"
	"github.com/rdmavisor/rdmavisor/internal/config"
	"github.com/rdmavisor/rdmavisor/pkg/vconn"
)

// TestAllocationLimits: an allocation holds at most limits.sessions
// connections, limits.listeners ports and limits.regions regions of
// limits.regionBytes in all; past each the application gets ErrLimit,
// nothing else breaks, and closing one frees its place.
func TestAllocationLimits(t *testing.T) {
	cl := startCluster(t, agenttest.Options{TuneConfig: func(c *config.AgentConfig) {
		c.Limits = config.Limits{Sessions: 2, Listeners: 2, Regions: 2, RegionBytes: 64 << 10}
	}})
	ctx := ctxT(t)
	a, b := cl.Nodes[0], cl.Nodes[1]
	sock, err := a.Allocate(ctx, "lim", 8)
	if err != nil {
		t.Fatal(err)
	}
	c1, err := vconn.NewClient(ctx, vconn.Options{Socket: sock})
	if err != nil {
		t.Fatal(err)
	}
	c2, err := vconn.NewClient(ctx, vconn.Options{Socket: sock})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := vconn.NewClient(ctx, vconn.Options{Socket: sock}); !errors.Is(err, vconn.ErrLimit) {
		t.Fatalf("third session: %v, want ErrLimit", err)
	}
	_ = c2.Close()
	eventuallyT(t, "a session's place freed", func() bool {
		c, err := vconn.NewClient(ctx, vconn.Options{Socket: sock})
		if err == nil {
			_ = c.Close()
		}
		return err == nil
	})

	// Listeners.
	l1, err := c1.Listen(ctx, ":1")
	if err != nil {
		t.Fatal(err)
	}
	// A port in use is refused as that, and takes no place.
	if _, err := c1.Listen(ctx, ":1"); !errors.Is(err, vconn.ErrAddrInUse) {
		t.Fatalf("listen on a used port: %v, want ErrAddrInUse", err)
	}
	if _, err := c1.Listen(ctx, ":2"); err != nil {
		t.Fatal(err)
	}
	if _, err := c1.Listen(ctx, ":3"); !errors.Is(err, vconn.ErrLimit) {
		t.Fatalf("third listener: %v, want ErrLimit", err)
	}
	_ = l1.Close()
	l3, err := c1.Listen(ctx, ":3")
	if err != nil {
		t.Fatalf("listen after one closed: %v", err)
	}

	// Regions, by count and by bytes.
	srv := appClient(t, b, "srv", 4)
	ln, err := srv.Listen(ctx, ":9")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	go agenttest.ServeDiscard(ln)
	c, err := c1.Dial(ctx, "node-b:9")
	if err != nil {
		t.Fatal(err)
	}
	r1, err := c.Export(ctx, 32<<10, vconn.AccessRead)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.Export(ctx, 16<<10, vconn.AccessRead); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Export(ctx, 1, vconn.AccessRead); !errors.Is(err, vconn.ErrLimit) {
		t.Fatalf("third region: %v, want ErrLimit", err)
	}
	if err := r1.Close(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Export(ctx, 48<<10+1, vconn.AccessRead); !errors.Is(err, vconn.ErrLimit) {
		t.Fatalf("a region past limits.regionBytes: %v, want ErrLimit", err)
	}
	if _, err := c.Export(ctx, 48<<10, vconn.AccessRead); err != nil {
		t.Fatalf("a region that fits the bytes left: %v", err)
	}
	// The vconn still works, and its end returns its regions' places.
	if err := c.SendMsg(ctx, []byte("still fine")); err != nil {
		t.Fatal(err)
	}
	_ = c.Close()
	_ = l3.Close()
	c, err = c1.Dial(ctx, "node-b:9")
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	eventuallyT(t, "the closed vconn's regions freed", func() bool {
		r, err := c.Export(ctx, 64<<10, vconn.AccessRead)
		if err == nil {
			_ = r.Close(ctx)
		}
		return err == nil
	})
}
