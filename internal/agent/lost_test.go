package agent_test

import (
	"bytes"
	"errors"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/rdmavisor/rdmavisor/internal/agent"
	"github.com/rdmavisor/rdmavisor/internal/agent/agenttest"
	"github.com/rdmavisor/rdmavisor/internal/engine"
	"github.com/rdmavisor/rdmavisor/internal/poll"
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
	poll.Until(t, 10*time.Second, "every QP toward the lost peer released", func() bool {
		_, ok := towardB()
		return !ok
	})
	// The node comes back: reachable again, and vconns to it work.
	if err := b.Restart(); err != nil {
		t.Fatal(err)
	}
	poll.Until(t, 10*time.Second, "the node reachable again", func() bool { return len(a.Agent.Status().Unreachable) == 0 })
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

// TestRestartedPeerBurst: a node's agent restarts and its pods dial at
// once, before this agent's heartbeat has met the new agent: the first
// call tells of the new incarnation, and the peer of the old one fails.
// No vconn of the burst may join that peer, or the peer made for the new
// agent fail with it: every one echoes.
func TestRestartedPeerBurst(t *testing.T) {
	// Beats far apart: only the calls of the new agent tell of it.
	cl := startCluster(t, agenttest.Options{HeartbeatTimeout: 30 * time.Second,
		TuneAgent: func(o *agent.Options) { o.HeartbeatInterval = 10 * time.Second }})
	a, b := cl.Nodes[0], cl.Nodes[1]
	ctx := ctxT(t)
	const burst = 200
	ln, err := appClient(t, a, "srv", 2*burst).Listen(ctx, ":9")
	if err != nil {
		t.Fatal(err)
	}
	go agenttest.ServeEcho(ln)
	// echo dials and echoes two messages. In the burst (ready not nil) it
	// waits, before echoing, until every vconn of the burst has dialled
	// and a moment more: the vconns are all open when the old agent's
	// peer fails.
	var dialled sync.WaitGroup
	echo := func(c *vconn.Client, i int, ready *sync.WaitGroup) error {
		conn, err := c.Dial(ctx, a.Name+":9")
		if ready != nil {
			ready.Done()
		}
		if err != nil {
			return fmt.Errorf("dial %d: %w", i, err)
		}
		defer conn.Close()
		if ready != nil {
			// Then long enough for a fail that was due to come.
			ready.Wait()
			time.Sleep(200 * time.Millisecond)
		}
		for round := range 2 {
			msg := fmt.Appendf(nil, "vconn %d, round %d", i, round)
			if err := conn.SendMsg(ctx, msg); err != nil {
				return fmt.Errorf("vconn %d: send %d: %w", i, round, err)
			}
			m, err := conn.RecvMsg(ctx)
			if err != nil {
				return fmt.Errorf("vconn %d: receive %d: %w", i, round, err)
			}
			if !bytes.Equal(m.Data, msg) {
				return fmt.Errorf("vconn %d: echo %q", i, m.Data)
			}
		}
		return nil
	}
	// a knows b's first agent: b called it.
	if err := echo(appClient(t, b, "before", 1), 0, nil); err != nil {
		t.Fatal(err)
	}
	// The old agent's peer fails only once the burst has dialled, or
	// after a second if it cannot (the burst waits for it to fail). The
	// burst is counted before the restart: the hook may wait on it before
	// the burst starts.
	dialled.Add(burst)
	agent.BeforeRestartFail(t, func() {
		all := make(chan struct{})
		go func() { dialled.Wait(); close(all) }()
		select {
		case <-all:
		case <-time.After(time.Second):
		}
	})
	if err := b.Restart(); err != nil {
		t.Fatal(err)
	}
	pod := appClient(t, b, "after", burst)
	errs := make(chan error, burst)
	for i := range burst {
		go func() { errs <- echo(pod, i, &dialled) }()
	}
	failed := 0
	for range burst {
		if err := <-errs; err != nil {
			if failed++; failed <= 3 {
				t.Error(err)
			}
		}
	}
	if failed > 0 {
		t.Fatalf("%d of %d vconns dialled from the restarted node failed", failed, burst)
	}
}
