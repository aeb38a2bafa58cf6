package agent_test

import (
	"fmt"
	"testing"
	"time"

	"github.com/rdmavisor/rdmavisor/internal/agent/agenttest"
	"github.com/rdmavisor/rdmavisor/internal/config"
	"github.com/rdmavisor/rdmavisor/pkg/vconn"
)

// TestMessageRate: an allocation past limits.messageRate is slowed, not
// failed. It sends n messages, over the socket and over shared-memory
// rings (each path an allocation, with a limiter of its own); every send
// succeeds, every message arrives in order, and the n take at least
// (n-burst)/rate: a lower bound only, which a slow machine cannot break.
func TestMessageRate(t *testing.T) {
	const (
		rate  = 100
		burst = rate / 10 // a tenth of a second's worth (config.Limits)
		n     = 40
	)
	cl := startCluster(t, agenttest.Options{TuneConfig: func(c *config.AgentConfig) {
		c.Limits.MessageRate = rate
	}})
	a, b := cl.Nodes[0], cl.Nodes[1]
	ctx := ctxT(t)
	srv := appClient(t, b, "srv", 4)
	ln, err := srv.Listen(ctx, ":9")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	for _, shared := range []bool{false, true} {
		t.Run(fmt.Sprintf("shared memory %v", shared), func(t *testing.T) {
			sock, err := a.Allocate(ctx, fmt.Sprintf("rated-%v", shared), 2)
			if err != nil {
				t.Fatal(err)
			}
			c, err := vconn.NewClient(ctx, vconn.Options{Socket: sock, SharedMemory: shared})
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			conn, err := c.Dial(ctx, "node-b:9")
			if err != nil {
				t.Fatal(err)
			}
			defer conn.Close()
			peer, err := ln.AcceptVConn()
			if err != nil {
				t.Fatal(err)
			}
			defer peer.Close()
			start := time.Now()
			for i := range n {
				if err := conn.SendMsg(ctx, []byte{byte(i)}); err != nil {
					t.Fatalf("send %d past the rate: %v, want it slowed, not failed", i, err)
				}
			}
			for i := range n {
				m, err := peer.RecvMsg(ctx)
				if err != nil || len(m.Data) != 1 || m.Data[0] != byte(i) {
					t.Fatalf("message %d: %v %v", i, m.Data, err)
				}
			}
			if d, least := time.Since(start), time.Duration(n-burst)*time.Second/rate; d < least {
				t.Errorf("%d messages at %d/s (burst %d) arrived in %v, want at least %v", n, rate, burst, d, least)
			}
		})
	}
}
