package agent_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/rdmavisor/rdmavisor/internal/admin"
	"github.com/rdmavisor/rdmavisor/internal/agent/agenttest"
	"github.com/rdmavisor/rdmavisor/internal/config"
	"github.com/rdmavisor/rdmavisor/internal/poll"
	"github.com/rdmavisor/rdmavisor/pkg/vconn"
)

// railAddrs are the soft devices of each node's rail 1 (rail 0 is the
// node's own address).
var railAddrs = map[string]string{"node-a": "127.0.0.4", "node-b": "127.0.0.5"}

// twoRails gives the nodes named in railAddrs a second soft device.
func twoRails(c *config.AgentConfig) {
	if a, ok := railAddrs[c.NodeName]; ok {
		c.Device.Rails = 2
		c.Soft.RailAddresses = []string{a}
	}
}

// railClient connects a client to a new allocation of node n bound to rail.
func railClient(t *testing.T, n *agenttest.Node, id string, rail int) *vconn.Client {
	t.Helper()
	ctx := ctxT(t)
	ac, err := admin.Dial(ctx, n.Config.AdminSocket)
	if err != nil {
		t.Fatal(err)
	}
	defer ac.Close()
	al, err := ac.Create(ctx, admin.Allocation{ID: id, VConns: 4, Rail: rail})
	if err != nil {
		t.Fatalf("allocation %s on rail %d: %v", id, rail, err)
	}
	if al.Rail != rail {
		t.Fatalf("allocation %s: rail %d, asked %d", id, al.Rail, rail)
	}
	c, err := vconn.NewClient(ctx, vconn.Options{Socket: al.Socket})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() })
	return c
}

// echo dials node-b:port from c and checks one message comes back.
func echo(ctx context.Context, t *testing.T, c *vconn.Client, port, msg string) {
	t.Helper()
	conn, err := c.Dial(ctx, "node-b:"+port)
	if err != nil {
		t.Fatalf("dial node-b:%s: %v", port, err)
	}
	defer conn.Close()
	if err := conn.SendMsg(ctx, []byte(msg)); err != nil {
		t.Fatal(err)
	}
	m, err := conn.RecvMsg(ctx)
	if err != nil || string(m.Data) != "echo "+msg {
		t.Fatalf("reply %q, %v", m.Data, err)
	}
}

// serveEcho answers every vconn accepted on port of c with its first
// message.
func serveEcho(ctx context.Context, t *testing.T, c *vconn.Client, port string) {
	ln, err := c.Listen(ctx, ":"+port)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = ln.Close() })
	go func() {
		for {
			conn, err := ln.AcceptVConn()
			if err != nil {
				return
			}
			go func() {
				defer conn.Close()
				if m, err := conn.RecvMsg(ctx); err == nil {
					_ = conn.SendMsg(ctx, append([]byte("echo "), m.Data...))
				}
			}()
		}
	}()
}

// TestTwoRails: each node has two soft devices (two UDP addresses), an
// engine each. An allocation is bound to the rail its creator names (0 by
// default); its vconns run on that rail's engine and reach the peer's
// engine of the same rail, whatever rail the listener's allocation is on,
// and traffic flows on both rails at once. A rail the node lacks is
// refused, saying how many it has.
func TestTwoRails(t *testing.T) {
	cl := startCluster(t, agenttest.Options{TuneConfig: twoRails})
	ctx := ctxT(t)
	a, b := cl.Nodes[0], cl.Nodes[1]
	for _, n := range cl.Nodes {
		rails := n.Agent.Rails()
		if len(rails) != 2 || rails[0].GID().String() != n.IP || rails[1].GID().String() != railAddrs[n.Name] {
			t.Fatalf("%s: %d rails; want its own address and %s", n.Name, len(rails), railAddrs[n.Name])
		}
	}
	serveEcho(ctx, t, railClient(t, b, "srv0", 0), "9")
	serveEcho(ctx, t, railClient(t, b, "srv1", 1), "10")
	c0, c1 := railClient(t, a, "cli0", 0), railClient(t, a, "cli1", 1)
	done := make(chan struct{})
	go func() {
		defer close(done)
		echo(ctx, t, c0, "10", "rail 0")
	}()
	echo(ctx, t, c1, "9", "rail 1")
	<-done

	// Each rail's engine talks to the peer's of the same rail only.
	for _, n := range cl.Nodes {
		for i, e := range n.Agent.Rails() {
			peers, _ := e.PeerStats()
			if len(peers) != 1 {
				t.Fatalf("%s rail %d: peers %+v; want one", n.Name, i, peers)
			}
			other := a
			if n == a {
				other = b
			}
			if want := other.Agent.Rails()[i].GID(); peers[0].GID != want {
				t.Errorf("%s rail %d talks to %v; want the peer's rail %d, %v", n.Name, i, peers[0].GID, i, want)
			}
		}
	}

	// The metrics cover both rails: the peer's QPs and vconns by rail,
	// named after its node on each, and the node's messages summed.
	m := gather(t, a.Agent.Collector())
	for _, k := range []string{`rdmavisor_qps{peer="node-b",rail="0",type="rc"}`, `rdmavisor_qps{peer="node-b",rail="1",type="rc"}`} {
		if m[k] < 1 {
			t.Errorf("node-a %s = %v, want at least 1", k, m[k])
		}
	}
	sent, recv := 0.0, 0.0
	for k, v := range m {
		switch {
		case strings.HasPrefix(k, "rdmavisor_messages_sent_total{"):
			sent += v
		case strings.HasPrefix(k, "rdmavisor_messages_received_total{"):
			recv += v
		}
	}
	if sent != 2 || recv != 2 { // a message out and its echo back on each rail
		t.Errorf("node-a sent %v and received %v messages over its rails, want 2 and 2", sent, recv)
	}

	// The status reports each rail's device and what is bound to it.
	st := a.Agent.Status()
	if len(st.Rails) != 2 || st.Rails[0].Device != "soft-127.0.0.2" || st.Rails[1].Device != "soft-127.0.0.4" ||
		st.Rails[1].GID != "127.0.0.4" || st.Rails[0].Allocated != 4 || st.Rails[1].Allocated != 4 || st.Allocated != 8 ||
		st.Rails[0].Peers != 1 || st.Rails[1].Peers != 1 || st.Rails[1].LinkLayer != "Ethernet" {
		t.Errorf("node-a's status: %+v", st)
	}
	ac, err := admin.Dial(ctx, a.Config.AdminSocket)
	if err != nil {
		t.Fatal(err)
	}
	defer ac.Close()
	if _, err := ac.Create(ctx, admin.Allocation{ID: "far", VConns: 1, Rail: 2}); err == nil || !strings.Contains(err.Error(), "has 2 rail(s)") {
		t.Errorf("an allocation on rail 2: %v; want a refusal naming the 2 rails", err)
	}
}

// TestRailMissingOnPeer: a vconn of rail 1 to a node with one rail fails
// with why, and rail 0 still works between them.
func TestRailMissingOnPeer(t *testing.T) {
	cl := startCluster(t, agenttest.Options{TuneConfig: func(c *config.AgentConfig) {
		if c.NodeName == "node-a" {
			twoRails(c)
		}
	}})
	ctx := ctxT(t)
	serveEcho(ctx, t, railClient(t, cl.Nodes[1], "srv", 0), "9")
	c1 := railClient(t, cl.Nodes[0], "cli1", 1)
	if _, err := c1.Dial(ctx, "node-b:9"); err == nil || !strings.Contains(err.Error(), "not rail 1") {
		t.Errorf("dial from rail 1 to a one-rail node: %v; want an error naming rail 1", err)
	}
	echo(ctx, t, railClient(t, cl.Nodes[0], "cli0", 0), "9", "rail 0")
}

// TestRailsUnderTLS: under mutual TLS a peer's rail GID must be one of
// its certificate's addresses, as rail 0's is, or, on rails 1.., the one
// discovery lists for that node and rail (its RDMANode, which only its own
// agent may write; here the static peers' railGIDs): the certificates
// name each node's own address only. Unlisted, or listed as another
// address, rail 1 is refused, saying why, and rail 0 works; listed, rail 1
// carries vconns both ways.
func TestRailsUnderTLS(t *testing.T) {
	for _, tc := range []struct {
		name   string
		listed map[string]string // what each node's discovery says the other's rail 1 is
		ok     bool
	}{
		{"unlisted", nil, false},
		{"listed wrong", map[string]string{"node-a": "127.0.0.9", "node-b": "127.0.0.8"}, false},
		// node-a vouches for node-b's rail 1, but node-b not for node-a's:
		// node-b refuses the QPs node-a's rail 1 asks for.
		{"listed by the dialer only", map[string]string{"node-a": railAddrs["node-b"], "node-b": "127.0.0.8"}, false},
		{"listed", map[string]string{"node-a": railAddrs["node-b"], "node-b": railAddrs["node-a"]}, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cl := startCluster(t, agenttest.Options{TLS: true, TuneConfig: func(c *config.AgentConfig) {
				twoRails(c)
				if g, ok := tc.listed[c.NodeName]; ok {
					c.PeerDiscovery.Static[0].RailGIDs = []string{g}
				}
			}})
			ctx := ctxT(t)
			serveEcho(ctx, t, railClient(t, cl.Nodes[1], "srv", 0), "9")
			c1 := railClient(t, cl.Nodes[0], "cli1", 1)
			if tc.ok {
				echo(ctx, t, c1, "9", "rail 1")
				if peers, _ := cl.Nodes[1].Agent.Rails()[1].PeerStats(); len(peers) != 1 || peers[0].GID != cl.Nodes[0].Agent.Rails()[1].GID() {
					t.Errorf("node-b's rail 1 peers: %+v", peers)
				}
			} else if _, err := c1.Dial(ctx, "node-b:9"); err == nil || !strings.Contains(err.Error(), "certificate") {
				t.Errorf("dial on rail 1, its GID neither certified nor listed: %v; want a refusal naming the certificate", err)
			} else {
				t.Log(err)
			}
			echo(ctx, t, railClient(t, cl.Nodes[0], "cli0", 0), "9", "rail 0")
		})
	}
}

// TestRailEpochs: when a node drops its side of a rail's connection (its
// engine peer fails) without restarting, the other node learns it from
// the heartbeat's rail epochs and fails its own side of that rail, as it
// does for rail 0, and the rail connects afresh.
func TestRailEpochs(t *testing.T) {
	cl := startCluster(t, agenttest.Options{TuneConfig: twoRails})
	ctx := ctxT(t)
	a, b := cl.Nodes[0], cl.Nodes[1]
	serveEcho(ctx, t, railClient(t, b, "srv", 0), "9")
	c1 := railClient(t, a, "cli1", 1)
	echo(ctx, t, c1, "9", "before")
	aGID, bGID := a.Agent.Rails()[1].GID(), b.Agent.Rails()[1].GID()
	if e := a.Agent.Rails()[1].PeerEpoch(bGID); e != 1 {
		t.Fatalf("node-a's rail 1 epoch for node-b: %d, want 1", e)
	}
	p, err := b.Agent.Rails()[1].Peer(aGID, nil)
	if err != nil {
		t.Fatal(err)
	}
	p.Fail(errors.New("test: node-b drops its side of rail 1"))
	poll.Until(t, 10*time.Second, "node-a's rail 1 to drop its side", func() bool { return a.Agent.Rails()[1].PeerEpoch(bGID) == 2 })
	echo(ctx, t, c1, "9", "after")
}
