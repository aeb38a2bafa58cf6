package vconn_test

import (
	"context"
	"encoding/binary"
	"errors"
	"net"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/rdmavisor/rdmavisor/internal/frame"
	"github.com/rdmavisor/rdmavisor/internal/transport"
	"github.com/rdmavisor/rdmavisor/pkg/vconn"
)

// fakeAgent serves sessions on a unixpacket socket as an agent would up to
// a dialled vconn (Hello with a send window of window, one Dial), and
// hands every Read to read, on the session's goroutine. Grants are
// ignored.
type fakeAgent struct {
	sock   string
	window uint32
	read   func(w *frameWriter, f frame.Frame)
}

// frameWriter writes one session's frames; safe for concurrent use.
type frameWriter struct {
	mu sync.Mutex
	c  *net.UnixConn
}

func (w *frameWriter) write(f *frame.Frame) {
	b, err := frame.Append(nil, f)
	if err != nil {
		panic(err)
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	_, _ = w.c.Write(b)
}

func startFakeAgent(t *testing.T, window uint32, read func(w *frameWriter, f frame.Frame)) *fakeAgent {
	t.Helper()
	a := &fakeAgent{sock: filepath.Join(t.TempDir(), "agent.sock"), window: window, read: read}
	ln, err := net.ListenUnix("unixpacket", &net.UnixAddr{Name: a.sock, Net: "unixpacket"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	go func() {
		for {
			c, err := ln.AcceptUnix()
			if err != nil {
				return
			}
			go a.serve(c)
		}
	}()
	return a
}

func (a *fakeAgent) serve(c *net.UnixConn) {
	defer c.Close()
	w := &frameWriter{c: c}
	buf := make([]byte, frame.MaxFrame)
	for {
		n, err := c.Read(buf)
		if err != nil {
			return
		}
		f, err := frame.Decode(buf[:n])
		if err != nil {
			return
		}
		f.Payload = append([]byte(nil), f.Payload...)
		switch f.Op {
		case frame.OpHello:
			info := frame.AppendHello(nil, frame.HelloInfo{Quota: 4, SendWindow: a.window, MaxMessage: 1024, Node: "fake"})
			w.write(&frame.Frame{Op: frame.OpOK, Req: f.Req, Arg: frame.Version, Payload: info})
		case frame.OpDial:
			info := frame.VConnInfo{Transport: transport.RC, MaxMessage: 1024}
			w.write(&frame.Frame{Op: frame.OpOK, Req: f.Req, Handle: 1, Arg2: info.Arg2()})
		case frame.OpRead:
			a.read(w, f)
		}
	}
}

// dialFake opens a client of a and dials its one vconn.
func dialFake(t *testing.T, a *fakeAgent) (*vconn.Client, *vconn.Conn) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	cl, err := vconn.NewClient(ctx, vconn.Options{Socket: a.sock, VConns: 1})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cl.Close() })
	c, err := cl.Dial(ctx, "10.0.0.1:1")
	if err != nil {
		t.Fatal(err)
	}
	return cl, c
}

// readLength is the byte count a Read asks for.
func readLength(f frame.Frame) int { return int(binary.BigEndian.Uint32(f.Payload)) }

// TestReadReplyOfWrongLength: an agent answering a region read with fewer
// bytes than asked (none: the read asked again forever) or more (they
// were dropped) breaks the protocol: the read fails and the session ends.
func TestReadReplyOfWrongLength(t *testing.T) {
	for _, give := range []int{0, 5, 20} {
		t.Run(strings.Repeat("x", give), func(t *testing.T) {
			a := startFakeAgent(t, 16, func(w *frameWriter, f frame.Frame) {
				w.write(&frame.Frame{Op: frame.OpOK, Req: f.Req, Handle: f.Handle, Payload: make([]byte, give)})
			})
			_, c := dialFake(t, a)
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			err := c.ReadRegion(ctx, 7, 0, make([]byte, 10))
			if !errors.Is(err, vconn.ErrAgentGone) || !strings.Contains(err.Error(), "a read of 10 bytes answered with") {
				t.Fatalf("a read of 10 bytes answered with %d: %v, want the session ended for a protocol error", give, err)
			}
			if err := c.ReadRegion(ctx, 7, 0, make([]byte, 10)); !errors.Is(err, vconn.ErrAgentGone) {
				t.Fatalf("a read after: %v, want the session's end", err)
			}
		})
	}
}

// TestCancelledOpHoldsWindow: an operation whose context ended before the
// agent answered still counts in the send window until the answer comes,
// as the agent counts it: two operations started meanwhile, with a window
// of two, go one at a time, and the agent never sees three outstanding
// (which it refuses with CodeWindow).
func TestCancelledOpHoldsWindow(t *testing.T) {
	var (
		mu          sync.Mutex
		outstanding int
		held        = make(chan frame.Frame, 1)
		over        int
	)
	a := startFakeAgent(t, 2, func(w *frameWriter, f frame.Frame) {
		mu.Lock()
		outstanding++
		n := outstanding
		mu.Unlock()
		if n > 2 {
			mu.Lock()
			over++
			outstanding--
			mu.Unlock()
			w.write(&frame.Frame{Op: frame.OpError, Req: f.Req, Handle: f.Handle, Arg: uint32(frame.CodeWindow), Payload: []byte("send window exceeded")})
			return
		}
		if f.Arg == 1 { // region 1: held until the test releases it
			held <- f
			go func() {
				time.Sleep(300 * time.Millisecond)
				mu.Lock()
				outstanding--
				mu.Unlock()
				w.write(&frame.Frame{Op: frame.OpOK, Req: f.Req, Handle: f.Handle, Payload: make([]byte, readLength(f))})
			}()
			return
		}
		go func() {
			time.Sleep(50 * time.Millisecond)
			mu.Lock()
			outstanding--
			mu.Unlock()
			w.write(&frame.Frame{Op: frame.OpOK, Req: f.Req, Handle: f.Handle, Payload: make([]byte, readLength(f))})
		}()
	})
	_, c := dialFake(t, a)
	ctx1, cancel1 := context.WithCancel(context.Background())
	done1 := make(chan error, 1)
	go func() { done1 <- c.ReadRegion(ctx1, 1, 0, make([]byte, 8)) }()
	<-held
	cancel1()
	if err := <-done1; !errors.Is(err, context.Canceled) {
		t.Fatalf("the cancelled read: %v", err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	errs := make(chan error, 2)
	for range 2 {
		go func() { errs <- c.ReadRegion(ctx, 2, 0, make([]byte, 8)) }()
	}
	for range 2 {
		if err := <-errs; err != nil {
			t.Errorf("a read after the cancelled one: %v", err)
		}
	}
	mu.Lock()
	defer mu.Unlock()
	if over != 0 {
		t.Errorf("the agent saw more than its window of 2 outstanding %d times, want 0", over)
	}
}
