package agent_test

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"testing"
	"time"

	"github.com/rdmavisor/rdmavisor/internal/agent/agenttest"
	"github.com/rdmavisor/rdmavisor/internal/config"
	"github.com/rdmavisor/rdmavisor/internal/poll"
	"github.com/rdmavisor/rdmavisor/pkg/vconn"
)

// TestPeerResetReachesTheOtherSide: when one agent's engine drops its side
// of the connection to another (its heartbeat lost it, say) while the
// other's heartbeat carries on, the other learns it from the epoch in the
// next beat's answer and fails its own side too, rather than keep sending
// Auto's UC datagrams into QPs that are gone; new vconns then connect
// afresh and echo.
func TestPeerResetReachesTheOtherSide(t *testing.T) {
	cl := startCluster(t, agenttest.Options{Transport: config.TransportAuto})
	a, b := cl.Nodes[0], cl.Nodes[1]
	ctx := ctxT(t)
	srv := appClient(t, b, "srv", 8)
	ln, err := srv.Listen(ctx, ":7")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	go agenttest.ServeEcho(ln)
	cli := appClient(t, a, "cli", 8)
	roundTrip := func(c *vconn.Conn, msg string) error {
		if _, err := c.Write([]byte(msg)); err != nil {
			return err
		}
		got := make([]byte, len(msg))
		if _, err := io.ReadFull(c, got); err != nil {
			return err
		}
		if !bytes.Equal(got, []byte(msg)) {
			return fmt.Errorf("echo of %q came back as %q", msg, got)
		}
		return nil
	}
	c, err := cli.Dial(ctx, "node-b:7")
	if err != nil {
		t.Fatal(err)
	}
	if err := roundTrip(c, "before"); err != nil {
		t.Fatal(err)
	}
	ea, eb := a.Agent.Engine(), b.Agent.Engine()
	old := ea.PeerEpoch(eb.GID())
	p, err := eb.Peer(ea.GID(), nil)
	if err != nil {
		t.Fatal(err)
	}
	p.Fail(errors.New("test: heartbeat lost"))
	poll.Until(t, 10*time.Second, "a's side of the connection to fail", func() bool { return ea.PeerEpoch(eb.GID()) != old })
	for i := range 3 {
		c, err := cli.Dial(ctx, "node-b:7")
		if err != nil {
			t.Fatalf("dial %d after the reset: %v", i, err)
		}
		for k := range 10 {
			if err := roundTrip(c, fmt.Sprintf("after %d.%d", i, k)); err != nil {
				t.Fatalf("vconn %d after the reset: %v", i, err)
			}
		}
		_ = c.Close()
	}
}
