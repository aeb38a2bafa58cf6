package agent_test

import (
	"sync"
	"testing"

	"github.com/rdmavisor/rdmavisor/internal/agent/agenttest"
	"github.com/rdmavisor/rdmavisor/internal/config"
	"github.com/rdmavisor/rdmavisor/internal/engine"
	"github.com/rdmavisor/rdmavisor/internal/verbs/verbstest"
)

// TestInfiniBandAgents: two agents whose ports are InfiniBand (a fake
// subnet over their soft devices) learn each other's LIDs over the
// control plane (ConnectQP) and carry vconns on LID-routed paths, with
// mutual TLS, for every transport (ud takes the address handles).
func TestInfiniBandAgents(t *testing.T) {
	for _, tr := range []config.Transport{config.TransportRC, config.TransportUD, config.TransportAuto} {
		t.Run(string(tr), func(t *testing.T) {
			sub := verbstest.NewSubnet()
			var mu sync.Mutex
			next := uint16(0x40)
			cl := startCluster(t, agenttest.Options{Transport: tr, TLS: true, TuneEngine: func(c *engine.Config) {
				mu.Lock()
				defer mu.Unlock()
				next++
				ib, err := sub.Attach(c.Device, next)
				if err != nil {
					t.Error(err)
					return
				}
				c.Device = ib
			}})
			ctx := ctxT(t)
			b := appClient(t, cl.Nodes[1], "b", 4)
			ln, err := b.Listen(ctx, ":9")
			if err != nil {
				t.Fatal(err)
			}
			defer ln.Close()
			served := make(chan error, 1)
			go func() {
				c, err := ln.AcceptVConn()
				if err != nil {
					served <- err
					return
				}
				defer c.Close()
				m, err := c.RecvMsg(ctx)
				if err == nil {
					err = c.SendMsg(ctx, append([]byte("echo "), m.Data...))
				}
				if err == nil {
					err = c.Close()
				}
				served <- err
			}()
			a := appClient(t, cl.Nodes[0], "a", 4)
			c, err := a.Dial(ctx, "node-b:9")
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			if err := c.SendMsg(ctx, []byte("over IB")); err != nil {
				t.Fatal(err)
			}
			m, err := c.RecvMsg(ctx)
			if err != nil || string(m.Data) != "echo over IB" {
				for _, n := range cl.Nodes {
					t.Logf("%s: %+v", n.Name, n.Agent.Engine().Stats())
				}
				t.Fatalf("reply %q, %v (the server: %v)", m.Data, err, <-served)
			}
			seen := map[uint16]bool{}
			for _, av := range sub.Vectors() {
				if !av.NoGRH {
					t.Errorf("vector %+v has a GRH", av)
				}
				seen[av.DLID] = true
			}
			if !seen[0x41] || !seen[0x42] {
				t.Errorf("DLIDs %v: want both agents' LIDs 0x41 and 0x42", seen)
			}
		})
	}
}
