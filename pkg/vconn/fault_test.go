package vconn_test

import (
	"context"
	"errors"
	"io"
	"runtime"
	"slices"
	"sync"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/rdmavisor/rdmavisor/internal/agent/agenttest"
	"github.com/rdmavisor/rdmavisor/pkg/vconn"
)

// TestPeerAgentDies: when the peer's agent dies, vconns to it fail with
// ErrPeerGone within 5 s, and blocked readers return.
func TestPeerAgentDies(t *testing.T) {
	cl := cluster(t, agenttest.Options{HeartbeatTimeout: time.Second})
	a := client(t, cl.Nodes[0], "a", 8)
	b := client(t, cl.Nodes[1], "b", 8)
	ctx := testCtx(t)
	ln, err := b.Listen(ctx, ":9")
	if err != nil {
		t.Fatal(err)
	}
	go func() {
		for {
			c, err := ln.AcceptVConn()
			if err != nil {
				return
			}
			go func() { _, _ = io.Copy(c, c) }()
		}
	}()
	var conns []*vconn.Conn
	for i := 0; i < 4; i++ {
		c, err := a.Dial(ctx, "node-b:9")
		if err != nil {
			t.Fatal(err)
		}
		if _, err := c.Write([]byte("ping")); err != nil {
			t.Fatal(err)
		}
		if _, err := io.ReadFull(c, make([]byte, 4)); err != nil {
			t.Fatal(err)
		}
		conns = append(conns, c)
	}
	start := time.Now()
	if err := cl.Nodes[1].Stop(); err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	for _, c := range conns {
		wg.Add(1)
		go func() {
			defer wg.Done()
			_, err := c.RecvMsg(ctx)
			if !errors.Is(err, vconn.ErrPeerGone) {
				t.Errorf("RecvMsg after the peer died: %v, want ErrPeerGone", err)
			}
		}()
	}
	wg.Wait()
	d := time.Since(start)
	t.Logf("vconns failed %v after the peer agent stopped: %v", d, conns[0].Err())
	if d > 5*time.Second {
		t.Fatalf("took %v", d)
	}
	if err := conns[0].SendMsg(ctx, []byte("x")); err == nil {
		t.Fatal("send on a failed vconn succeeded")
	}
	for _, c := range conns {
		_ = c.Close()
	}
	// The quota came back.
	if _, err := a.Dial(ctx, "node-b:9"); errors.Is(err, vconn.ErrQuota) {
		t.Fatalf("dial after closing failed vconns: %v", err)
	}
}

// TestLocalAgentRestarts: clients fail cleanly when their agent goes, and
// reconnect once it is back.
func TestLocalAgentRestarts(t *testing.T) {
	cl := cluster(t, agenttest.Options{})
	a := client(t, cl.Nodes[0], "a", 8)
	b := client(t, cl.Nodes[1], "b", 8)
	ctx := testCtx(t)
	ln, err := b.Listen(ctx, ":9")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	go agenttest.ServeDiscard(ln)
	c, err := a.Dial(ctx, "node-b:9")
	if err != nil {
		t.Fatal(err)
	}
	lnA, err := a.Listen(ctx, ":11")
	if err != nil {
		t.Fatal(err)
	}
	acceptErr := make(chan error, 1)
	go func() {
		_, err := lnA.Accept()
		acceptErr <- err
	}()
	if err := cl.Nodes[0].Restart(); err != nil {
		t.Fatal(err)
	}
	if _, err := c.RecvMsg(ctx); !errors.Is(err, vconn.ErrAgentGone) {
		t.Fatalf("RecvMsg when the agent restarted: %v, want ErrAgentGone", err)
	}
	if err := <-acceptErr; !errors.Is(err, vconn.ErrAgentGone) {
		t.Fatalf("Accept when the agent restarted: %v, want ErrAgentGone", err)
	}
	if err := c.SendMsg(ctx, []byte("x")); err == nil {
		t.Fatal("send through a dead agent succeeded")
	}
	_ = c.Close()
	// The device plugin re-creates the allocation at the same path; the
	// client reconnects on its next call.
	if _, err := cl.Nodes[0].Allocate(ctx, "a", 8); err != nil {
		t.Fatal(err)
	}
	l2, err := a.Listen(ctx, ":11")
	if err != nil {
		t.Fatalf("listen after the restart: %v", err)
	}
	defer l2.Close()
	if q, err := a.Quota(ctx); err != nil || q != 8 {
		t.Fatalf("quota after the restart: %d, %v", q, err)
	}
	// And the restarted node reaches its peer again, both ways: the peer
	// replaced the QPs it had to the old incarnation.
	lnB, err := b.Listen(ctx, ":12")
	if err != nil {
		t.Fatal(err)
	}
	defer lnB.Close()
	go func() {
		c, err := lnB.Accept()
		if err != nil {
			return
		}
		defer c.Close()
		m, err := c.(*vconn.Conn).RecvMsg(ctx)
		if err == nil {
			_ = c.(*vconn.Conn).SendMsg(ctx, append([]byte("echo "), m.Data...))
		}
	}()
	c2, err := a.Dial(ctx, "node-b:12")
	if err != nil {
		t.Fatalf("dial the peer after the restart: %v", err)
	}
	defer c2.Close()
	if err := c2.SendMsg(ctx, []byte("hello again")); err != nil {
		t.Fatal(err)
	}
	if m, err := c2.RecvMsg(ctx); err != nil || string(m.Data) != "echo hello again" {
		t.Fatalf("reply across nodes after the restart: %q, %v", m.Data, err)
	}
}

// TestOpenCloseLeaks: 10,000 vconn open/close cycles leave no vQPN, no
// buffer and no goroutine behind.
func TestOpenCloseLeaks(t *testing.T) {
	defer goleak.VerifyNone(t, goleak.IgnoreCurrent())
	cycles := 10000
	cl, err := agenttest.Start(agenttest.Options{})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	newClient := func(n *agenttest.Node, id string, k int) *vconn.Client {
		sock, err := n.Allocate(ctx, id, k)
		if err != nil {
			t.Fatal(err)
		}
		c, err := vconn.NewClient(ctx, vconn.Options{Socket: sock})
		if err != nil {
			t.Fatal(err)
		}
		return c
	}
	// The server closes its side when it reads EOF, a little after the
	// client: its allocation has room for that lag.
	a, b := newClient(cl.Nodes[0], "a", 64), newClient(cl.Nodes[1], "b", 4096)
	ln, err := b.Listen(ctx, ":9")
	if err != nil {
		t.Fatal(err)
	}
	go agenttest.ServeDiscard(ln)
	// One cycle first, so the QPs exist in the baseline.
	warm, err := a.Dial(ctx, "node-b:9")
	if err != nil {
		t.Fatal(err)
	}
	_ = warm.Close()
	settle := func() (vcs [2]int, bufs [2][]int) {
		deadline := time.Now().Add(10 * time.Second)
		for {
			for i, n := range cl.Nodes {
				st := n.Agent.Engine().Stats()
				vcs[i], bufs[i] = st.VConns, st.BuffersInUse
			}
			if vcs == [2]int{} || time.Now().After(deadline) {
				return
			}
			time.Sleep(10 * time.Millisecond)
		}
	}
	_, base := settle()
	start := time.Now()
	workers := 8
	var wg sync.WaitGroup
	for w := 0; w < workers; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; i < cycles/workers; i++ {
				c, err := a.Dial(ctx, "node-b:9")
				if err != nil {
					t.Errorf("cycle %d: %v", i, err)
					return
				}
				if i%16 == 0 {
					if _, err := c.Write([]byte("x")); err != nil {
						t.Errorf("cycle %d: %v", i, err)
					}
				}
				if err := c.Close(); err != nil {
					t.Errorf("cycle %d: close: %v", i, err)
					return
				}
			}
		}()
	}
	wg.Wait()
	t.Logf("%d open/close cycles in %v", cycles, time.Since(start))
	vcs, bufs := settle()
	if vcs != [2]int{} {
		t.Errorf("vconns still open: %v", vcs)
	}
	for i := range bufs {
		if !slices.Equal(bufs[i], base[i]) {
			t.Errorf("node %d: buffers in use %v, baseline %v", i, bufs[i], base[i])
		}
	}
	_ = ln.Close()
	_ = a.Close()
	_ = b.Close()
	if err := cl.Close(); err != nil {
		t.Fatal(err)
	}
	runtime.GC()
}
