package agent_test

import (
	"context"
	"errors"
	"io"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/rdmavisor/rdmavisor/internal/admin"
	"github.com/rdmavisor/rdmavisor/internal/agent/agenttest"
	"github.com/rdmavisor/rdmavisor/internal/frame"
	"github.com/rdmavisor/rdmavisor/pkg/vconn"
)

// TestQuota: an allocation of k vconns holds at most k open at once, and
// closing one frees its slot (allocation.take and give, session.dial).
func TestQuota(t *testing.T) {
	cl := startCluster(t, agenttest.Options{})
	a := appClient(t, cl.Nodes[0], "a", 3)
	b := appClient(t, cl.Nodes[1], "b", 100)
	ctx := ctxT(t)
	ln, err := b.Listen(ctx, ":9")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	go agenttest.ServeDiscard(ln)
	if q, err := a.Quota(ctx); err != nil || q != 3 {
		t.Fatalf("Quota: %d, %v", q, err)
	}
	var conns []*vconn.Conn
	for i := 0; i < 3; i++ {
		c, err := a.Dial(ctx, "node-b:9")
		if err != nil {
			t.Fatalf("dial %d: %v", i, err)
		}
		conns = append(conns, c)
	}
	_, err = a.Dial(ctx, "node-b:9")
	if !errors.Is(err, vconn.ErrQuota) {
		t.Fatalf("4th dial: %v, want ErrQuota", err)
	}
	t.Logf("4th dial: %v", err)
	if err := conns[0].Close(); err != nil {
		t.Fatal(err)
	}
	c, err := a.Dial(ctx, "node-b:9")
	if err != nil {
		t.Fatalf("dial after a close: %v", err)
	}
	conns = append(conns[1:], c)
	for _, c := range conns {
		if _, err := c.Write([]byte("x")); err != nil {
			t.Fatal(err)
		}
		_ = c.Close()
	}
}

// TestAcceptQuota: a listener's allocation pays for the vconns it accepts.
// Two callers (node-a's and node-b's host services) fill it: the test
// holds for any share one caller may have (TestAcceptShare).
func TestAcceptQuota(t *testing.T) {
	cl := startCluster(t, agenttest.Options{})
	a := appClient(t, cl.Nodes[0], "a", 10)
	local := appClient(t, cl.Nodes[1], "local", 10)
	b := appClient(t, cl.Nodes[1], "b", 2)
	ctx := ctxT(t)
	ln, err := b.Listen(ctx, ":9")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	for _, c := range []*vconn.Client{a, local} {
		if _, err := c.Dial(ctx, "node-b:9"); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := local.Dial(ctx, "node-b:9"); !errors.Is(err, vconn.ErrQuota) || !strings.Contains(err.Error(), "all its 2 vconns in use") {
		t.Fatalf("3rd dial to a full listener: %v, want ErrQuota, all its vconns in use", err)
	}
	if _, err := a.Dial(ctx, "node-b:10"); !errors.Is(err, vconn.ErrRefused) {
		t.Fatalf("dial to no listener: %v, want ErrRefused", err)
	}
	if _, err := a.Dial(ctx, "node-x:10"); !errors.Is(err, vconn.ErrUnknownHost) {
		t.Fatalf("dial to an unknown host: %v, want ErrUnknownHost", err)
	}
	if _, err := b.Listen(ctx, ":9"); !errors.Is(err, vconn.ErrAddrInUse) {
		t.Fatalf("second listener on a port: %v, want ErrAddrInUse", err)
	}
}

// rawConn speaks frames on an allocation socket directly.
type rawConn struct {
	t testing.TB
	c net.Conn
}

func dialRaw(t testing.TB, path string) *rawConn {
	c, err := net.Dial("unixpacket", path)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() })
	return &rawConn{t: t, c: c}
}

func (r *rawConn) send(f frame.Frame) {
	b, err := frame.Append(nil, &f)
	if err != nil {
		r.t.Fatal(err)
	}
	if _, err := r.c.Write(b); err != nil {
		r.t.Fatal(err)
	}
}

func (r *rawConn) recv() (frame.Frame, error) {
	_ = r.c.SetReadDeadline(time.Now().Add(5 * time.Second))
	buf := make([]byte, frame.MaxFrame)
	n, err := r.c.Read(buf)
	if err != nil {
		return frame.Frame{}, err
	}
	return frame.Decode(buf[:n])
}

// TestIsolation: another allocation's socket cannot touch this one's
// vconns; handles are per connection.
func TestIsolation(t *testing.T) {
	cl := startCluster(t, agenttest.Options{})
	a := appClient(t, cl.Nodes[0], "a", 3)
	b := appClient(t, cl.Nodes[1], "b", 3)
	ctx := ctxT(t)
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
	defer c.Close()
	sock, err := cl.Nodes[0].Allocate(ctx, "other", 1)
	if err != nil {
		t.Fatal(err)
	}
	r := dialRaw(t, sock)
	r.send(frame.Frame{Op: frame.OpHello, Req: 1, Arg: frame.Version})
	if f, err := r.recv(); err != nil || f.Op != frame.OpOK {
		t.Fatalf("hello: %+v %v", f, err)
	}
	for h := uint32(0); h < 8; h++ {
		for _, op := range []frame.Op{frame.OpSend, frame.OpClose, frame.OpRead} {
			r.send(frame.Frame{Op: op, Req: 10 + h, Handle: h, Payload: frame.AppendLength(nil, 1)})
			f, err := r.recv()
			if err != nil {
				t.Fatal(err)
			}
			if f.Op != frame.OpError || frame.Code(f.Arg) != frame.CodeNoHandle {
				t.Fatalf("%v on handle %d of another allocation: %v %v %q", op, h, f.Op, frame.Code(f.Arg), f.Payload)
			}
		}
	}
	// The victim's vconn still works.
	if err := c.SendMsg(ctx, []byte("still mine")); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Write([]byte("x")); err != nil {
		t.Fatal(err)
	}
	_ = context.Background()
}

// TestDeleteAllocation: deleting an allocation closes its vconns; the
// peer reads EOF and the node's vconns are freed.
func TestDeleteAllocation(t *testing.T) {
	cl := startCluster(t, agenttest.Options{})
	a := appClient(t, cl.Nodes[0], "a", 3)
	b := appClient(t, cl.Nodes[1], "b", 3)
	ctx := ctxT(t)
	ln, err := b.Listen(ctx, ":9")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	c, err := a.Dial(ctx, "node-b:9")
	if err != nil {
		t.Fatal(err)
	}
	srv, err := ln.AcceptVConn()
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Close()
	ac, err := admin.Dial(ctx, cl.Nodes[0].Config.AdminSocket)
	if err != nil {
		t.Fatal(err)
	}
	defer ac.Close()
	if err := ac.DeleteAllocation(ctx, "a"); err != nil {
		t.Fatal(err)
	}
	if _, err := c.RecvMsg(ctx); !errors.Is(err, vconn.ErrAgentGone) {
		t.Fatalf("RecvMsg on a deleted allocation: %v, want ErrAgentGone", err)
	}
	if _, err := srv.RecvMsg(ctx); !errors.Is(err, io.EOF) {
		t.Fatalf("peer of a deleted allocation's vconn: %v, want EOF", err)
	}
	if _, err := a.Dial(ctx, "node-b:9"); err == nil {
		t.Fatal("dial through a deleted allocation succeeded")
	}
}
