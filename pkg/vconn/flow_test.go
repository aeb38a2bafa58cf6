package vconn_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/rdmavisor/rdmavisor/internal/agent/agenttest"
)

// TestFlowControl: an application that does not read stops its peer's
// sends after a bounded number of messages (engine credits, the agent's
// receive window and the send windows), rather than making the agents
// buffer; once it reads, everything arrives in order.
func TestFlowControl(t *testing.T) {
	cl := cluster(t, agenttest.Options{})
	a := client(t, cl.Nodes[0], "a", 2)
	b := client(t, cl.Nodes[1], "b", 2)
	ctx := testCtx(t)
	ln, err := b.Listen(ctx, ":9")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	c, err := a.Dial(ctx, "node-b:9")
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	srv, err := ln.AcceptVConn()
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Close()
	msg := make([]byte, 1000)
	sent := 0
	for ; sent < 5000; sent++ {
		msg[0], msg[1] = byte(sent), byte(sent>>8)
		sctx, cancel := context.WithTimeout(ctx, 300*time.Millisecond)
		err := c.SendMsg(sctx, msg)
		cancel()
		if errors.Is(err, context.DeadlineExceeded) {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
	}
	t.Logf("the sender blocked after %d messages", sent)
	if sent >= 5000 {
		t.Fatal("the sender never blocked")
	}
	for i := 0; i < sent; i++ {
		m, err := srv.RecvMsg(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if got := int(m.Data[0]) | int(m.Data[1])<<8; got != i {
			t.Fatalf("message %d arrived as %d", got, i)
		}
	}
}
