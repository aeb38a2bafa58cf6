package vconn_test

import (
	"errors"
	"net"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/rdmavisor/rdmavisor/internal/agent/agenttest"
	"github.com/rdmavisor/rdmavisor/internal/config"
	"github.com/rdmavisor/rdmavisor/internal/frame"
	"github.com/rdmavisor/rdmavisor/pkg/vconn"
)

// The SDK and the rules of docs/protocol.md that issue 35 clarified: an
// Error with req 0 and handle 0 ends the session (§3, R8.5, R8.6); bad
// arguments are answered, each with its own code, and leave the session
// as it was (§8); a bridged vconn is refused on an unreliable transport
// before any listener hears of it (R8.20).

// echoPair dials node-b's echo listener from node-a.
func echoPair(t *testing.T, cl *agenttest.Cluster) (*vconn.Client, *vconn.Conn) {
	t.Helper()
	ctx := testCtx(t)
	b := client(t, cl.Nodes[1], "b", 8)
	ln, err := b.Listen(ctx, ":9")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = ln.Close() })
	go agenttest.ServeEcho(ln)
	a := client(t, cl.Nodes[0], "a", 8)
	c, err := a.Dial(ctx, "node-b:9")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() })
	return a, c
}

func echoes(t *testing.T, c *vconn.Conn, what string) {
	t.Helper()
	if _, err := c.Write([]byte(what)); err != nil {
		t.Fatalf("%s: write: %v", what, err)
	}
	_ = c.SetReadDeadline(time.Now().Add(10 * time.Second))
	b := make([]byte, len(what))
	n, err := c.Read(b)
	for n < len(b) && err == nil {
		var k int
		k, err = c.Read(b[n:])
		n += k
	}
	if err != nil || string(b) != what {
		t.Fatalf("%s: the echo: %q, %v", what, b[:n], err)
	}
}

// TestAgentEndsSession: a frame the agent ends the session for (a Grant
// on handle 0) fails every vconn of the session with ErrAgentGone and the
// agent's reason, and the next Dial connects again.
func TestAgentEndsSession(t *testing.T) {
	cl := cluster(t, agenttest.Options{})
	a, c := echoPair(t, cl)
	echoes(t, c, "before")
	if err := c.WriteFrame(frame.Frame{Op: frame.OpGrant, Arg: 1}); err != nil {
		t.Fatal(err)
	}
	_ = c.SetReadDeadline(time.Now().Add(10 * time.Second))
	_, err := c.Read(make([]byte, 1))
	if !errors.Is(err, vconn.ErrAgentGone) || !strings.Contains(err.Error(), "grant on handle 0") {
		t.Fatalf("read after the agent ended the session: %v; want ErrAgentGone with the agent's reason", err)
	}
	c2, err := a.Dial(testCtx(t), "node-b:9")
	if err != nil {
		t.Fatalf("dial after the session ended: %v", err)
	}
	defer c2.Close()
	echoes(t, c2, "after")
}

// TestSessionEndErrorBeforeClose: the SDK ends the session at the Error
// itself (req 0, handle 0), not at the close that follows: a fake agent
// that sends one and keeps the connection open.
func TestSessionEndErrorBeforeClose(t *testing.T) {
	path := filepath.Join(t.TempDir(), "fake.sock")
	ln, err := net.ListenUnix("unixpacket", &net.UnixAddr{Name: path, Net: "unixpacket"})
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	done := make(chan struct{})
	defer close(done)
	go func() {
		c, err := ln.AcceptUnix()
		if err != nil {
			return
		}
		defer c.Close()
		buf := make([]byte, frame.MaxFrame)
		read := func() frame.Frame {
			n, err := c.Read(buf)
			if err != nil {
				return frame.Frame{}
			}
			f, _ := frame.Decode(buf[:n])
			return f
		}
		write := func(f frame.Frame) { b, _ := frame.Append(nil, &f); _, _ = c.Write(b) }
		h := read()
		write(frame.Frame{Op: frame.OpOK, Req: h.Req, Arg: frame.Version,
			Payload: frame.AppendHello(nil, frame.HelloInfo{Quota: 4, SendWindow: 16, MaxMessage: 65536, Node: "fake"})})
		d := read()
		write(frame.Frame{Op: frame.OpOK, Req: d.Req, Handle: 1, Arg2: frame.VConnInfo{Transport: 1, MaxMessage: 65536}.Arg2(), Payload: d.Payload})
		read() // the Grant
		write(frame.Frame{Op: frame.OpError, Arg: uint32(frame.CodeBadRequest), Payload: []byte("you lost track")})
		<-done // and keeps the connection open
	}()
	ctx := testCtx(t)
	cli, err := vconn.NewClient(ctx, vconn.Options{Socket: path})
	if err != nil {
		t.Fatal(err)
	}
	defer cli.Close()
	c, err := cli.Dial(ctx, "node-b:1")
	if err != nil {
		t.Fatal(err)
	}
	_ = c.SetReadDeadline(time.Now().Add(5 * time.Second))
	_, err = c.Read(make([]byte, 1))
	if !errors.Is(err, vconn.ErrAgentGone) || !strings.Contains(err.Error(), "you lost track") {
		t.Fatalf("read: %v; want ErrAgentGone with the agent's reason, at once", err)
	}
}

// TestBadArgumentsKeepSession: an Export the agent refuses gets the code
// of its fault (TooLarge past maxMessageBytes, BadRequest for size 0 or
// an access other than read, write or both), and the vconn and its
// session go on.
func TestBadArgumentsKeepSession(t *testing.T) {
	cl := cluster(t, agenttest.Options{})
	_, c := echoPair(t, cl)
	ctx := testCtx(t)
	for _, x := range []struct {
		size   int
		access vconn.Access
		want   vconn.Code
	}{
		{0, vconn.AccessRead, vconn.CodeBadRequest},
		{1<<20 + 1, vconn.AccessRead, vconn.CodeTooLarge},
		{64, 0, vconn.CodeBadRequest},
		{64, vconn.AccessRead | 4, vconn.CodeBadRequest},
	} {
		if _, err := c.Export(ctx, x.size, x.access); !errors.Is(err, &vconn.Error{Code: x.want}) {
			t.Errorf("export of %d bytes, access %d: %v; want %v", x.size, x.access, err, x.want)
		}
		echoes(t, c, "still here")
	}
	r, err := c.Export(ctx, 1<<20, vconn.AccessRead|vconn.AccessWrite)
	if err != nil {
		t.Fatalf("an export of maxMessageBytes: %v", err)
	}
	if err := r.ReadAt(ctx, make([]byte, 3*frame.MaxPayload), 0); err != nil {
		t.Fatalf("a read of 3 × 64 KiB goes in pieces: %v", err)
	}
}

// TestBridgeRefusedOnUD: on ud a bridged Dial is refused before any
// listener hears of it, so an SDK listener accepts nothing; the SDK's own
// vconns on ud refuse to be streams, and carry messages.
func TestBridgeRefusedOnUD(t *testing.T) {
	cl := cluster(t, agenttest.Options{Transport: config.TransportUD})
	ctx := testCtx(t)
	b := client(t, cl.Nodes[1], "b", 8)
	ln, err := b.Listen(ctx, ":9")
	if err != nil {
		t.Fatal(err)
	}
	accepted := make(chan *vconn.Conn, 4)
	go func() {
		for {
			c, err := ln.AcceptVConn()
			if err != nil {
				close(accepted)
				return
			}
			accepted <- c
		}
	}()
	sock, err := cl.Nodes[0].Allocate(ctx, "raw", 2)
	if err != nil {
		t.Fatal(err)
	}
	raw, err := net.Dial("unixpacket", sock)
	if err != nil {
		t.Fatal(err)
	}
	defer raw.Close()
	for _, f := range []frame.Frame{
		{Op: frame.OpHello, Req: 1, Arg: frame.Version},
		{Op: frame.OpDial, Req: 2, Flags: frame.FlagBridge, Payload: []byte("node-b:9")},
	} {
		bs, _ := frame.Append(nil, &f)
		if _, err := raw.Write(bs); err != nil {
			t.Fatal(err)
		}
		_ = raw.SetReadDeadline(time.Now().Add(10 * time.Second))
		buf := make([]byte, frame.MaxFrame)
		n, err := raw.Read(buf)
		if err != nil {
			t.Fatal(err)
		}
		rep, err := frame.Decode(buf[:n])
		if err != nil {
			t.Fatal(err)
		}
		if f.Op == frame.OpDial && (rep.Op != frame.OpError || frame.Code(rep.Arg) != frame.CodeBadRequest) {
			t.Fatalf("a bridged dial on ud: %v %s; want BadRequest", rep.Op, rep.Payload)
		}
	}
	select {
	case c := <-accepted:
		t.Fatalf("the listener accepted %v from a refused bridged dial", c.RemoteAddr())
	case <-time.After(time.Second):
	}
	a := client(t, cl.Nodes[0], "a", 8)
	c, err := a.Dial(ctx, "node-b:9")
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if _, err := c.Write([]byte("stream")); !errors.Is(err, vconn.ErrNotStream) {
		t.Fatalf("a stream on ud: %v, want ErrNotStream", err)
	}
	if err := c.SendMsg(ctx, []byte("message")); err != nil {
		t.Fatal(err)
	}
	if s := <-accepted; s == nil {
		t.Fatal("the listener accepted nothing of a plain dial")
	}
}
