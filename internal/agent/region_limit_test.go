package agent_test

import (
	"context"
	"errors"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/rdmavisor/rdmavisor/internal/agent/agenttest"
	"github.com/rdmavisor/rdmavisor/internal/config"
	"github.com/rdmavisor/rdmavisor/internal/poll"
	"github.com/rdmavisor/rdmavisor/pkg/vconn"
)

// regionLimit is limits.regionBytes in the registered-memory tests, and
// regionSize the size of each region they export: two fit.
const (
	regionLimit = 2 << 20
	regionSize  = 1 << 20
)

// watchRegistered waits for node n to hold no registered region memory
// (the engine's own count, not an allowance), then samples it until the
// test ends; peak reports the most it saw, whose excess over the limit is
// the tests' figure, "memory registered past the limit", which must be 0.
func watchRegistered(t *testing.T, n *agenttest.Node) (peak func() int64) {
	t.Helper()
	poll.Until(t, 10*time.Second, "no registered memory left from before", func() bool { return n.Agent.Engine().Stats().RegisteredBytes == 0 })
	var worst atomic.Int64
	done := make(chan struct{})
	var wg sync.WaitGroup
	wg.Add(1)
	sample := func() {
		if b := n.Agent.Engine().Stats().RegisteredBytes; b > worst.Load() {
			worst.Store(b)
		}
	}
	go func() {
		defer wg.Done()
		for {
			sample()
			select {
			case <-done:
				return
			case <-time.After(100 * time.Microsecond):
			}
		}
	}()
	t.Cleanup(func() { close(done); wg.Wait() })
	return func() int64 { sample(); return worst.Load() }
}

// selfPair is a pod's vconn to itself: c dialed, s accepted, on node n.
func selfPair(ctx context.Context, t *testing.T, pod *vconn.Client, n *agenttest.Node) (c, s *vconn.Conn) {
	t.Helper()
	ln, err := pod.Listen(ctx, ":7")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = ln.Close() })
	c, err = pod.Dial(ctx, n.Name+":7")
	if err != nil {
		t.Fatal(err)
	}
	if s, err = ln.AcceptVConn(); err != nil {
		t.Fatal(err)
	}
	return c, s
}

// stallSends sends small messages on s, one at a time, until one is not
// delivered: the peer (which never reads) granted no more credits, so
// s's send ring holds data that goes nowhere.
func stallSends(ctx context.Context, t *testing.T, n *agenttest.Node, s *vconn.Conn) {
	t.Helper()
	delivered := func() uint64 { return n.Agent.Engine().Stats().MsgsReceived }
	msg := make([]byte, 1024)
	for i := 0; ; i++ {
		if i == 10_000 {
			t.Fatal("the peer took every message: no stall")
		}
		before := delivered()
		if err := s.SendMsg(ctx, msg); err != nil {
			t.Fatalf("send %d: %v", i, err)
		}
		deadline := time.Now().Add(300 * time.Millisecond)
		for delivered() == before && time.Now().Before(deadline) {
			time.Sleep(time.Millisecond)
		}
		if delivered() == before {
			return
		}
	}
}

// TestUnexportLoopStaysUnderLimit is issue 23's attack on registered
// memory: a pod dials itself, never reads, and loops Export and Unexport.
// A region's memory is deregistered only once the peer confirmed the
// unexport (it may still be reading it), and that confirmation travelled
// only on an empty send ring; the allowance came back at Unexport, so the
// pod registered 64 MiB under a 2 MiB limits.regionBytes. Now the
// allowance comes back only with the deregistration: the memory the
// engine holds registered (its own count) never passes the limit,
// "memory registered past the limit: 0".
//
//   - peer stalled: the exporter's peer vconn is the one whose ring is
//     stalled; its confirmations no longer wait behind that data, and the
//     loop goes on at full speed.
//   - own ring stalled: the exporter's own ring is stalled, so its
//     unexports wait there, in order with its data, and no confirmation
//     comes: the third export is refused with ErrLimit.
func TestUnexportLoopStaysUnderLimit(t *testing.T) {
	const loops = 64 // 64 MiB exported and withdrawn
	cl := startCluster(t, agenttest.Options{TuneConfig: func(c *config.AgentConfig) {
		c.Limits.RegionBytes = regionLimit
	}})
	a := cl.Nodes[0]

	t.Run("peer stalled", func(t *testing.T) {
		ctx := ctxT(t)
		peak := watchRegistered(t, a)
		pod := appClient(t, a, "pod1", 4)
		c, s := selfPair(ctx, t, pod, a)
		// s sends to c, which never reads: s's ring stalls.
		stallSends(ctx, t, a, s)
		sendCtx, stop := context.WithCancel(ctx)
		defer stop()
		go func() {
			for s.SendMsg(sendCtx, make([]byte, 1024)) == nil {
			}
		}()
		waits := 0
		for i := range loops {
			r, err := c.Export(ctx, regionSize, vconn.AccessRead|vconn.AccessWrite)
			for errors.Is(err, vconn.ErrLimit) {
				// The last unexport's confirmation is a round trip away.
				waits++
				time.Sleep(time.Millisecond)
				r, err = c.Export(ctx, regionSize, vconn.AccessRead|vconn.AccessWrite)
			}
			if err != nil {
				t.Fatalf("export %d: %v", i, err)
			}
			if err := r.Close(ctx); err != nil {
				t.Fatalf("unexport %d: %v", i, err)
			}
		}
		if over := max(0, peak()-regionLimit); over != 0 {
			t.Fatalf("%d MiB exported and withdrawn: %d MiB registered at most under a %d MiB limit; memory registered past the limit: %d bytes, want 0",
				loops*regionSize>>20, peak()>>20, regionLimit>>20, over)
		}
		t.Logf("%d MiB exported and withdrawn under a %d MiB limit, %d MiB registered at most; %d exports waited for a confirmation; memory registered past the limit: 0",
			loops*regionSize>>20, regionLimit>>20, peak()>>20, waits)
	})

	t.Run("own ring stalled", func(t *testing.T) {
		ctx := ctxT(t)
		peak := watchRegistered(t, a)
		pod := appClient(t, a, "pod2", 4)
		c, s := selfPair(ctx, t, pod, a)
		_ = c // never reads
		// s sends to c until its ring holds data c's credits hold back,
		// then exports and withdraws behind it.
		stallSends(ctx, t, a, s)
		limited := -1
		for i := range loops {
			r, err := s.Export(ctx, regionSize, vconn.AccessRead|vconn.AccessWrite)
			if over := peak() - regionLimit; over > 0 {
				t.Fatalf("export %d: memory registered past the limit: %d bytes, want 0", i, over)
			}
			if errors.Is(err, vconn.ErrLimit) {
				limited = i
				break
			}
			if err != nil {
				t.Fatalf("export %d: %v", i, err)
			}
			if err := r.Close(ctx); err != nil {
				t.Fatalf("unexport %d: %v", i, err)
			}
		}
		if limited != regionLimit/regionSize {
			t.Fatalf("export refused at %d, want ErrLimit at export %d: the withdrawn regions are still registered", limited, regionLimit/regionSize)
		}
		t.Logf("export %d refused with ErrLimit while %d MiB awaited the peer; memory registered past the limit: 0", limited, regionLimit>>20)
	})
}

// TestCloseReturnsRegionsAfterDeregistration: closing a vconn withdraws
// its regions, and their memory stays registered until the peer confirmed
// (it may still be reading them) or, if no confirmation can come, until
// the vconn is released and the grace for the peer's operations in
// flight passed. The allocation's allowance comes back only with the
// deregistration: at every moment the allowance held covers what the
// engine holds registered for the pod, and an export meanwhile is refused
// with ErrLimit.
//
//   - peer confirms: the unexports go before the FIN and are answered.
//   - peer holds: the closed vconn's ring is stalled (its peer, the same
//     pod, never reads), so the unexports wait behind its data, and the
//     memory stays until the peer lets the data through (it closes).
//   - peer gone: the peer's node stops; the vconn fails, and the memory
//     goes after the grace (3s), counted from no earlier than the stop.
func TestCloseReturnsRegionsAfterDeregistration(t *testing.T) {
	cl := startCluster(t, agenttest.Options{
		TuneConfig:       func(c *config.AgentConfig) { c.Limits.RegionBytes = regionLimit },
		HeartbeatTimeout: 2 * time.Second,
	})
	a, b := cl.Nodes[0], cl.Nodes[1]
	for _, tc := range []string{"peer confirms", "peer holds", "peer gone"} {
		t.Run(tc, func(t *testing.T) {
			ctx := ctxT(t)
			peak := watchRegistered(t, a)
			id := strings.ReplaceAll(tc, " ", "-")
			pod := appClient(t, a, id, 4)
			var c, s *vconn.Conn
			if tc == "peer gone" {
				srv := appClient(t, b, "srv", 4)
				ln, err := srv.Listen(ctx, ":9")
				if err != nil {
					t.Fatal(err)
				}
				go agenttest.ServeDiscard(ln)
				if c, err = pod.Dial(ctx, b.Name+":9"); err != nil {
					t.Fatal(err)
				}
				if s, err = pod.Dial(ctx, b.Name+":9"); err != nil {
					t.Fatal(err)
				}
			} else {
				c, s = selfPair(ctx, t, pod, a)
			}
			for i := range regionLimit / regionSize {
				if _, err := c.Export(ctx, regionSize, vconn.AccessRead|vconn.AccessWrite); err != nil {
					t.Fatalf("export %d: %v", i, err)
				}
			}
			if tc == "peer holds" {
				stallSends(ctx, t, a, c) // s never reads
			}
			if _, err := s.Export(ctx, 1, vconn.AccessRead); !errors.Is(err, vconn.ErrLimit) {
				t.Fatalf("an export past the limit: %v, want ErrLimit", err)
			}
			// The peer is gone from the moment its node starts to stop:
			// the vconn may fail, and its grace begin, before Stop returns
			// (a loaded machine has taken 3s to stop a node).
			gone := time.Now()
			if tc == "peer gone" {
				if err := b.Stop(); err != nil {
					t.Fatal(err)
				}
			}
			closed := time.Now()
			if err := c.Close(); err != nil {
				t.Fatal(err)
			}
			// The allowance is read before the registered bytes: both
			// only fall now, the registered ones first, so held < reg
			// would mean the allowance came back first.
			var returned, sinceGone time.Duration
			peerClosed := false
			for {
				_, held, _ := a.Agent.RegionsHeld(id)
				reg := a.Agent.Engine().Stats().RegisteredBytes
				if held < reg {
					t.Fatalf("%v after the close: %d bytes of allowance held, %d registered", time.Since(closed), held, reg)
				}
				if held == 0 {
					returned, sinceGone = time.Since(closed), time.Since(gone)
					break
				}
				if tc == "peer holds" && !peerClosed && time.Since(closed) > time.Second {
					// Held a second with the data: let it through.
					peerClosed = true
					_ = s.Close()
				}
				if time.Since(closed) > 15*time.Second {
					t.Fatalf("the allowance not back 15s after the close: %d bytes held, %d registered", held, reg)
				}
				time.Sleep(time.Millisecond)
			}
			if reg := a.Agent.Engine().Stats().RegisteredBytes; reg != 0 {
				t.Fatalf("%d bytes still registered once the allowance came back", reg)
			}
			switch {
			case tc == "peer holds" && returned < time.Second:
				t.Fatalf("the allowance came back %v after the close, while the peer held the unexports", returned)
			case tc == "peer gone" && sinceGone < 3*time.Second:
				t.Fatalf("the allowance came back %v after the peer's node began to stop: before the grace", sinceGone)
			}
			c2, err := pod.Dial(ctx, a.Name+":7")
			if tc != "peer gone" {
				if err != nil {
					t.Fatal(err)
				}
				for i := range regionLimit / regionSize {
					if _, err := c2.Export(ctx, regionSize, vconn.AccessRead); err != nil {
						t.Fatalf("export %d once the closed vconn's regions are gone: %v", i, err)
					}
				}
			}
			if over := peak() - regionLimit; over > 0 {
				t.Fatalf("memory registered past the limit: %d bytes, want 0", over)
			}
			t.Logf("the allowance came back %v after the close, with the deregistration; memory registered past the limit: 0", returned.Round(time.Millisecond))
		})
	}
}

// TestRegisteredBytesNodeCap: limits.registeredBytes bounds the memory
// the regions of all allocations together keep registered, counted as
// each allocation's limits.regionBytes is (until deregistered): an
// export past it fails with ErrLimit, whatever allocation asks. Shared
// fairly: once another allocation's region is gone, an export that would
// take p2 past its fair share (half the limit, while p1 holds a region)
// still fails, naming it; once p1 holds none, p2's succeeds.
func TestRegisteredBytesNodeCap(t *testing.T) {
	const nodeLimit = 3 * regionSize // under two allocations' 2 MiB each
	cl := startCluster(t, agenttest.Options{TuneConfig: func(c *config.AgentConfig) {
		c.Limits.RegionBytes = regionLimit
		c.Limits.RegisteredBytes = nodeLimit
	}})
	a := cl.Nodes[0]
	ctx := ctxT(t)
	peak := watchRegistered(t, a)
	c1, _ := selfPair(ctx, t, appClient(t, a, "p1", 4), a)
	p2 := appClient(t, a, "p2", 4)
	ln, err := p2.Listen(ctx, ":8")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	c2, err := p2.Dial(ctx, a.Name+":8")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := ln.AcceptVConn(); err != nil {
		t.Fatal(err)
	}

	var p1 []*vconn.Region
	for i := range regionLimit / regionSize {
		r, err := c1.Export(ctx, regionSize, vconn.AccessRead)
		if err != nil {
			t.Fatalf("p1's export %d: %v", i, err)
		}
		p1 = append(p1, r)
	}
	if _, err := c2.Export(ctx, regionSize, vconn.AccessRead); err != nil {
		t.Fatalf("p2's first export, within both limits: %v", err)
	}
	// p2 holds 1 MiB of its 2, but the node holds its 3.
	_, err = c2.Export(ctx, regionSize, vconn.AccessRead)
	if !errors.Is(err, vconn.ErrLimit) || !strings.Contains(err.Error(), "limits.registeredBytes") {
		t.Fatalf("an export past limits.registeredBytes: %v, want ErrLimit naming limits.registeredBytes", err)
	}
	refused := err
	if _, held, _ := a.Agent.RegionsHeld("p2"); held != regionSize {
		t.Fatalf("p2 holds %d bytes after the refusal, want %d: a refused export holds nothing", held, regionSize)
	}
	if err := p1[0].Close(ctx); err != nil {
		t.Fatal(err)
	}
	poll.Until(t, 10*time.Second, "p2's export refused as past its fair share once p1's region is deregistered", func() bool {
		_, err := c2.Export(ctx, regionSize, vconn.AccessRead)
		if !errors.Is(err, vconn.ErrLimit) {
			t.Fatalf("p2's export to 2 MiB of the node's 3 while p1 holds 1: %v, want ErrLimit", err)
		}
		return strings.Contains(err.Error(), "past its fair share of limits.registeredBytes")
	})
	if err := p1[1].Close(ctx); err != nil {
		t.Fatal(err)
	}
	poll.Until(t, 10*time.Second, "p2's export once p1's regions are deregistered", func() bool {
		_, err := c2.Export(ctx, regionSize, vconn.AccessRead)
		if err != nil && !errors.Is(err, vconn.ErrLimit) {
			t.Fatal(err)
		}
		return err == nil
	})
	if over := peak() - nodeLimit; over > 0 {
		t.Fatalf("memory registered past limits.registeredBytes: %d bytes, want 0", over)
	}
	t.Logf("refused past the node's %d MiB: %v; memory registered past the limit: 0", nodeLimit>>20, refused)
}
