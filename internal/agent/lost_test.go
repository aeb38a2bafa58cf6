package agent_test

import (
	"errors"
	"slices"
	"testing"
	"time"

	"github.com/rdmavisor/rdmavisor/internal/agent/agenttest"
	"github.com/rdmavisor/rdmavisor/internal/engine"
	"github.com/rdmavisor/rdmavisor/pkg/vconn"
)

// TestLostPeerReleased: when a peer node is lost, its vconns fail, and
// once the applications have closed them the engine gives back every QP
// it held for that node (its own toward it and the ones the node made
// toward it), rather than keeping them until the node comes back.
func TestLostPeerReleased(t *testing.T) {
	cl := startCluster(t, agenttest.Options{HeartbeatTimeout: 500 * time.Millisecond})
	a, b := cl.Nodes[0], cl.Nodes[1]
	ctx := ctxT(t)
	ln, err := appClient(t, b, "srv", 4).Listen(ctx, ":9")
	if err != nil {
		t.Fatal(err)
	}
	go agenttest.ServeEcho(ln)
	pod := appClient(t, a, "pod", 4)
	var conns []*vconn.Conn
	for range 3 {
		c, err := pod.Dial(ctx, b.Name+":9")
		if err != nil {
			t.Fatal(err)
		}
		if err := c.SendMsg(ctx, []byte("hello")); err != nil {
			t.Fatal(err)
		}
		if _, err := c.RecvMsg(ctx); err != nil {
			t.Fatal(err)
		}
		conns = append(conns, c)
	}
	gid := b.Agent.Engine().GID()
	towardB := func() (engine.PeerStats, bool) {
		peers, _ := a.Agent.Engine().PeerStats()
		for _, p := range peers {
			if p.GID == gid {
				return p, true
			}
		}
		return engine.PeerStats{}, false
	}
	if p, ok := towardB(); !ok || p.RCQPs == 0 || p.IngressQPs == 0 {
		t.Fatalf("before the loss, toward the peer: %+v (%v)", p, ok)
	}
	if err := b.Stop(); err != nil {
		t.Fatal(err)
	}
	for i, c := range conns {
		if _, err := c.RecvMsg(ctx); !errors.Is(err, vconn.ErrPeerGone) {
			t.Fatalf("vconn %d after the peer's node stopped: %v, want ErrPeerGone", i, err)
		}
	}
	// The agent reports the node unreachable (its RDMANode says so).
	if got := a.Agent.Status().Unreachable; !slices.Equal(got, []string{b.Name}) {
		t.Fatalf("unreachable peers once the node stopped: %v, want [%s]", got, b.Name)
	}
	// While one failed vconn is still open, its QPs stay: the application
	// has not seen the end of it yet.
	for _, c := range conns[1:] {
		_ = c.Close()
	}
	time.Sleep(time.Second)
	if _, ok := towardB(); !ok {
		t.Fatal("the peer was released while a vconn to it was still open")
	}
	_ = conns[0].Close()
	eventuallyT(t, "every QP toward the lost peer released", func() bool {
		_, ok := towardB()
		return !ok
	})
	// The node comes back: reachable again, and vconns to it work.
	if err := b.Restart(); err != nil {
		t.Fatal(err)
	}
	eventuallyT(t, "the node reachable again", func() bool { return len(a.Agent.Status().Unreachable) == 0 })
	ln, err = appClient(t, b, "srv2", 4).Listen(ctx, ":9")
	if err != nil {
		t.Fatal(err)
	}
	go agenttest.ServeEcho(ln)
	c, err := pod.Dial(ctx, b.Name+":9")
	if err != nil {
		t.Fatal(err)
	}
	if err := c.SendMsg(ctx, []byte("again")); err != nil {
		t.Fatal(err)
	}
	if m, err := c.RecvMsg(ctx); err != nil || string(m.Data) != "again" {
		t.Fatalf("echo from the node that came back: %q, %v", m.Data, err)
	}
}
