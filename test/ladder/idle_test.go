package ladder_test

import (
	"context"
	"fmt"
	"os"
	"syscall"
	"testing"
	"time"

	"github.com/rdmavisor/rdmavisor/internal/agent/agenttest"
	"github.com/rdmavisor/rdmavisor/pkg/vconn"
)

// idleVConns is how many vconns each idle agent holds open: node-a's
// application dials them all to node-b's.
const idleVConns = 1000

// TestIdleCPU: two agents holding 1,000 open vconns each (both ends of
// 1,000 vconns between them), each used once, burn
// almost no CPU while nothing is sent: their pollers park, and so do the
// vconns' goroutines. It measures this process's CPU time (the agents and
// the idle applications' clients) over a few seconds and fails past a
// tenth of one CPU, a bound that any spinning poller or timer on a
// vconn's path exceeds many times over (a spinning poller takes a whole
// CPU). With RDMAVISOR_IDLE_REPORT naming a file, it writes the figure
// there as a line of markdown (hack/bench-e6.sh).
func TestIdleCPU(t *testing.T) {
	cl, err := agenttest.Start(agenttest.Options{VConnsPerNode: idleVConns + 16, Transport: "auto"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cl.Close() })
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	ca, err := cl.Nodes[0].Client(ctx, "idle-a", idleVConns)
	if err != nil {
		t.Fatal(err)
	}
	defer ca.Close()
	cb, err := cl.Nodes[1].Client(ctx, "idle-b", idleVConns)
	if err != nil {
		t.Fatal(err)
	}
	defer cb.Close()
	ln, err := cb.Listen(ctx, ":7")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	accepted := make(chan *vconn.Conn, idleVConns)
	go func() {
		for {
			c, err := ln.AcceptVConn()
			if err != nil {
				return
			}
			accepted <- c
		}
	}()
	msg := []byte("ping")
	var conns []*vconn.Conn
	for i := 0; i < idleVConns; i++ {
		c, err := ca.Dial(ctx, "node-b:7")
		if err != nil {
			t.Fatalf("dial %d: %v", i, err)
		}
		s := <-accepted
		conns = append(conns, c, s)
		// Each used once, both ways: its QPs, credits and goroutines
		// are those of a live vconn, not of one never used.
		if err := c.SendMsg(ctx, msg); err != nil {
			t.Fatal(err)
		}
		if _, err := s.RecvMsg(ctx); err != nil {
			t.Fatal(err)
		}
		if err := s.SendMsg(ctx, msg); err != nil {
			t.Fatal(err)
		}
		if _, err := c.RecvMsg(ctx); err != nil {
			t.Fatal(err)
		}
	}
	defer func() {
		for _, c := range conns {
			_ = c.Close()
		}
	}()
	// Let the last acknowledgements, grants and timers settle.
	time.Sleep(time.Second)
	const window = 5 * time.Second
	before, t0 := cpuTime(t), time.Now()
	time.Sleep(window)
	used, wall := cpuTime(t)-before, time.Since(t0)
	share := float64(used) / float64(wall)
	t.Logf("two idle agents holding %d open vconns each (both ends of %d vconns, each used once): %v of CPU in %v, %.2f%% of one CPU",
		idleVConns, idleVConns, used.Round(time.Millisecond), wall.Round(time.Millisecond), 100*share)
	if f := os.Getenv("RDMAVISOR_IDLE_REPORT"); f != "" {
		line := fmt.Sprintf("| two idle agents, %d open vconns each (both ends of %d vconns between them, each used once) | %.2f%% of one CPU (%v of CPU time in %v) |\n",
			idleVConns, idleVConns, 100*share, used.Round(time.Millisecond), wall.Round(time.Millisecond))
		if err := os.WriteFile(f, []byte("| what | CPU |\n|---|---:|\n"+line), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	if share > 0.10 {
		t.Errorf("idle agents used %.1f%% of one CPU; want at most 10%%", 100*share)
	}
}

// cpuTime is the CPU time (user and system) this process used so far.
func cpuTime(t *testing.T) time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		t.Fatal(err)
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
