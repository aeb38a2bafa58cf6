package vconn_test

import (
	"bytes"
	"errors"
	"io"
	"testing"

	"github.com/rdmavisor/rdmavisor/internal/agent/agenttest"
	"github.com/rdmavisor/rdmavisor/internal/config"
	"github.com/rdmavisor/rdmavisor/pkg/vconn"
)

func TestMessages(t *testing.T) {
	for _, tr := range []config.Transport{config.TransportRC, config.TransportAuto} {
		t.Run(string(tr), func(t *testing.T) { testMessages(t, tr, false) })
		// Two pods on one node: the agent is its own peer.
		t.Run(string(tr)+"/same-node", func(t *testing.T) { testMessages(t, tr, true) })
	}
}

func testMessages(t *testing.T, tr config.Transport, sameNode bool) {
	cl := cluster(t, agenttest.Options{Transport: tr})
	server := cl.Nodes[1]
	if sameNode {
		server = cl.Nodes[0]
	}
	a := client(t, cl.Nodes[0], "a", 4)
	b := client(t, server, "b", 4)
	ctx := testCtx(t)
	ln, err := b.Listen(ctx, ":80")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	done := make(chan error, 1)
	go func() {
		c, err := ln.AcceptVConn()
		if err != nil {
			done <- err
			return
		}
		defer c.Close()
		for {
			m, err := c.RecvMsg(ctx)
			if errors.Is(err, io.EOF) {
				done <- nil
				return
			}
			if err != nil {
				done <- err
				return
			}
			if err := c.SendMsgImm(ctx, m.Data, m.Imm+1); err != nil {
				done <- err
				return
			}
		}
	}()
	c, err := a.Dial(ctx, server.Name+":80")
	if err != nil {
		t.Fatal(err)
	}
	for i, n := range []int{0, 1, 100, 4000, 60000} {
		msg := bytes.Repeat([]byte{byte(i)}, n)
		if err := c.SendMsgImm(ctx, msg, uint32(i)); err != nil {
			t.Fatal(err)
		}
		m, err := c.RecvMsg(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(m.Data, msg) || !m.HasImm || m.Imm != uint32(i)+1 {
			t.Fatalf("message %d: got %d bytes imm %d/%v", i, len(m.Data), m.Imm, m.HasImm)
		}
	}
	if err := c.Close(); err != nil {
		t.Fatal(err)
	}
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	_ = vconn.ErrQuota
}
