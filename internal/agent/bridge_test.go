package agent_test

import (
	"bytes"
	"crypto/rand"
	"fmt"
	"io"
	"net"
	"os"
	"sync"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/rdmavisor/rdmavisor/internal/agent/agenttest"
	"github.com/rdmavisor/rdmavisor/internal/frame"
)

// rawSession says hello on an allocation's socket, as a client of the
// frame protocol with no SDK would (the preload library).
func rawSession(t *testing.T, sock string) *net.UnixConn {
	t.Helper()
	c, err := net.DialUnix("unixpacket", nil, &net.UnixAddr{Name: sock, Net: "unixpacket"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() })
	if f := rawRequest(t, c, frame.Frame{Op: frame.OpHello, Req: 1, Arg: frame.Version}); f.Op != frame.OpOK {
		t.Fatalf("hello: %v %s", f.Op, f.Payload)
	}
	return c
}

func rawRequest(t *testing.T, c *net.UnixConn, f frame.Frame) frame.Frame {
	t.Helper()
	b, err := frame.Append(nil, &f)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.Write(b); err != nil {
		t.Fatal(err)
	}
	r, _ := readRights(t, c)
	return r
}

// readRights reads a frame and the socket it carries, if any.
func readRights(t *testing.T, c *net.UnixConn) (frame.Frame, *os.File) {
	t.Helper()
	_ = c.SetReadDeadline(time.Now().Add(10 * time.Second))
	buf, oob := make([]byte, frame.MaxFrame), make([]byte, unix.CmsgSpace(4*4))
	n, oobn, _, _, err := c.ReadMsgUnix(buf, oob)
	if err != nil {
		t.Fatal(err)
	}
	f, err := frame.Decode(buf[:n])
	if err != nil {
		t.Fatal(err)
	}
	f.Payload = append([]byte(nil), f.Payload...)
	var file *os.File
	if oobn > 0 {
		msgs, err := unix.ParseSocketControlMessage(oob[:oobn])
		if err != nil || len(msgs) != 1 {
			t.Fatalf("control message: %v (%d)", err, len(msgs))
		}
		fds, err := unix.ParseUnixRights(&msgs[0])
		if err != nil || len(fds) != 1 {
			t.Fatalf("rights: %v %v", fds, err)
		}
		file = os.NewFile(uintptr(fds[0]), "bridged")
		t.Cleanup(func() { _ = file.Close() })
	}
	return f, file
}

// fileConn makes a net.Conn of a socket, closing f: the Conn holds the
// only descriptor, so closing it is the program's close.
func fileConn(t *testing.T, f *os.File) net.Conn {
	t.Helper()
	c, err := net.FileConn(f)
	_ = f.Close()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() })
	return c
}

// inUse is how many vconns of an allocation are held.
func inUse(n *agenttest.Node, id string) int {
	for _, al := range n.Agent.Allocations() {
		if al.ID == id {
			return al.InUse
		}
	}
	return -1
}

func waitInUse(t *testing.T, n *agenttest.Node, id string, want int) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for inUse(n, id) != want {
		if time.Now().After(deadline) {
			t.Fatalf("allocation %s on %s: %d vconns in use, want %d", id, n.Name, inUse(n, id), want)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// TestBridge: a bridged Dial and a bridged Listen hand each end a plain
// stream socket; 8 MiB cross in both directions at once, byte for byte;
// a descriptor duplicated and closed keeps the stream (as after fork or
// dup); a half-close (shutdown(SHUT_WR)) is the peer's end of file while
// the answer still flows back; then both vconns go back to their quotas.
func TestBridge(t *testing.T) {
	cl := startCluster(t, agenttest.Options{VConnsPerNode: 100})
	a, b := cl.Nodes[0], cl.Nodes[1]
	ds, dfile, afile := bridgeFiles(t, cl, 7000)
	// The client's socket as a forked child would have it: a duplicate,
	// the original closed.
	dup, err := unix.Dup(int(dfile.Fd()))
	if err != nil {
		t.Fatal(err)
	}
	_ = dfile.Close()
	client := fileConn(t, os.NewFile(uintptr(dup), "dup"))
	server := fileConn(t, afile)

	const size = 8 << 20
	up, downData := make([]byte, size), make([]byte, size)
	_, _ = rand.Read(up)
	_, _ = rand.Read(downData)
	var wg sync.WaitGroup
	var gotAtServer, gotAtClient []byte
	var errs [4]error
	wg.Add(4)
	go func() { defer wg.Done(); _, errs[0] = client.Write(up) }()
	go func() { defer wg.Done(); _, errs[1] = server.Write(downData) }()
	go func() { defer wg.Done(); gotAtServer, errs[2] = readN(server, size) }()
	go func() { defer wg.Done(); gotAtClient, errs[3] = readN(client, size) }()
	wg.Wait()
	for i, err := range errs {
		if err != nil {
			t.Fatalf("copy %d: %v", i, err)
		}
	}
	if !bytes.Equal(gotAtServer, up) || !bytes.Equal(gotAtClient, downData) {
		t.Fatal("bridged bytes differ from those written")
	}
	if n := inUse(a, "server"); n != 1 {
		t.Errorf("server allocation: %d vconns in use, want 1 (the bridged one)", n)
	}
	// The sessions that made the bridges may go: the sockets live on.
	_ = ds.Close()
	if _, err := client.Write([]byte("after the session")); err != nil {
		t.Fatal(err)
	}
	if got, err := readN(server, len("after the session")); err != nil || string(got) != "after the session" {
		t.Fatalf("after the session closed: %q %v", got, err)
	}
	// A half-close, as a client that ends its request with
	// shutdown(SHUT_WR): the server reads to its end of file, then answers,
	// and the client reads the whole answer, then the server's close.
	if _, err := client.Write([]byte("request")); err != nil {
		t.Fatal(err)
	}
	if err := client.(*net.UnixConn).CloseWrite(); err != nil {
		t.Fatal(err)
	}
	_ = server.SetReadDeadline(time.Now().Add(10 * time.Second))
	if req, err := io.ReadAll(server); err != nil || string(req) != "request" {
		t.Fatalf("server read to the client's end of file: %q, %v", req, err)
	}
	answer := bytes.Repeat([]byte("answer "), 100000)
	if _, err := server.Write(answer); err != nil {
		t.Fatalf("the server answers after the client's half-close: %v", err)
	}
	_ = server.Close()
	_ = client.SetReadDeadline(time.Now().Add(10 * time.Second))
	if got, err := io.ReadAll(client); err != nil || !bytes.Equal(got, answer) {
		t.Fatalf("client read of the answer: %d bytes, %v; want %d", len(got), err, len(answer))
	}
	_ = client.Close()
	waitInUse(t, a, "server", 0)
	waitInUse(t, b, "client", 0)
}

// TestBridgeRefused: a bridged dial of a port nobody listens on is an
// error reply with no socket; a listener's bridged accepts stop with its
// session, and a bridge leaks nothing when the agent stops under it.
func TestBridgeRefused(t *testing.T) {
	cl := startCluster(t, agenttest.Options{VConnsPerNode: 100})
	ctx := ctxT(t)
	a, b := cl.Nodes[0], cl.Nodes[1]
	sb, err := b.Allocate(ctx, "client", 2)
	if err != nil {
		t.Fatal(err)
	}
	ds := rawSession(t, sb)
	req, _ := frame.Append(nil, &frame.Frame{Op: frame.OpDial, Req: 2, Flags: frame.FlagBridge, Payload: []byte(a.Name + ":7001")})
	if _, err := ds.Write(req); err != nil {
		t.Fatal(err)
	}
	f, file := readRights(t, ds)
	if f.Op != frame.OpError || frame.Code(f.Arg) != frame.CodeRefused || file != nil {
		t.Fatalf("bridged dial of a closed port: %v %v socket %v: %s", f.Op, frame.Code(f.Arg), file != nil, f.Payload)
	}
	waitInUse(t, b, "client", 0)

	// Quota: two bridged vconns, the third is refused with the quota code.
	sa, err := a.Allocate(ctx, "server", 8)
	if err != nil {
		t.Fatal(err)
	}
	ls := rawSession(t, sa)
	if f := rawRequest(t, ls, frame.Frame{Op: frame.OpListen, Req: 2, Arg: 7001, Flags: frame.FlagBridge}); f.Op != frame.OpOK {
		t.Fatalf("listen: %v %s", f.Op, f.Payload)
	}
	for i := range 3 {
		req, _ := frame.Append(nil, &frame.Frame{Op: frame.OpDial, Req: uint32(10 + i), Flags: frame.FlagBridge, Payload: []byte(a.Name + ":7001")})
		if _, err := ds.Write(req); err != nil {
			t.Fatal(err)
		}
		f, file := readRights(t, ds)
		switch {
		case i < 2 && (f.Op != frame.OpOK || file == nil):
			t.Fatalf("dial %d: %v %s", i, f.Op, f.Payload)
		case i == 2 && (f.Op != frame.OpError || frame.Code(f.Arg) != frame.CodeQuota):
			t.Fatalf("dial past the quota: %v %v, want %v", f.Op, frame.Code(f.Arg), frame.CodeQuota)
		}
		if i < 2 {
			if af, afile := readRights(t, ls); af.Op != frame.OpAccept || afile == nil {
				t.Fatalf("accept %d: %v", i, af.Op)
			}
		}
	}
	waitInUse(t, a, "server", 2)
	// The agent restarts with bridges open: nothing waits on them.
	done := make(chan error, 1)
	go func() { done <- a.Restart() }()
	select {
	case err := <-done:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(20 * time.Second):
		t.Fatal("the agent does not stop with bridges open")
	}
}

func readN(c net.Conn, n int) ([]byte, error) {
	_ = c.SetReadDeadline(time.Now().Add(30 * time.Second))
	b := make([]byte, n)
	if _, err := io.ReadFull(c, b); err != nil {
		return nil, fmt.Errorf("read %d bytes: %w", n, err)
	}
	return b, nil
}

// TestBridgeUnreliable: a stream cannot ride a transport that may lose
// messages: a bridged dial on uc is refused with a reason, and its vconn
// goes back to the quota.
func TestBridgeUnreliable(t *testing.T) {
	cl := startCluster(t, agenttest.Options{VConnsPerNode: 100, Transport: "uc"})
	ctx := ctxT(t)
	a, b := cl.Nodes[0], cl.Nodes[1]
	srv := appClient(t, a, "server", 2)
	ln, err := srv.Listen(ctx, ":7002")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	go agenttest.ServeDiscard(ln)
	sb, err := b.Allocate(ctx, "client", 2)
	if err != nil {
		t.Fatal(err)
	}
	ds := rawSession(t, sb)
	req, _ := frame.Append(nil, &frame.Frame{Op: frame.OpDial, Req: 2, Flags: frame.FlagBridge, Payload: []byte(a.Name + ":7002")})
	if _, err := ds.Write(req); err != nil {
		t.Fatal(err)
	}
	f, file := readRights(t, ds)
	if f.Op != frame.OpError || frame.Code(f.Arg) != frame.CodeBadRequest || file != nil || !bytes.Contains(f.Payload, []byte("cannot carry a stream")) {
		t.Fatalf("bridged dial on uc: %v %v socket %v: %s", f.Op, frame.Code(f.Arg), file != nil, f.Payload)
	}
	waitInUse(t, b, "client", 0)
}
