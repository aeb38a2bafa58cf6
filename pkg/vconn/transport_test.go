package vconn_test

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"testing"
	"time"

	"github.com/rdmavisor/rdmavisor/internal/agent/agenttest"
	"github.com/rdmavisor/rdmavisor/internal/config"
	"github.com/rdmavisor/rdmavisor/internal/frame"
	"github.com/rdmavisor/rdmavisor/pkg/vconn"
)

// TestTransports: on every transport a vconn reports its transport and the
// largest message it carries; SendMsg carries a message of exactly that
// size and refuses one byte more with ErrTooLarge; Read and Write are a
// correct byte stream on the reliable transports (rc, auto) and refused
// with ErrNotStream, on both ends, on the lossy ones (uc, ud).
func TestTransports(t *testing.T) {
	for _, tc := range []struct {
		tr       config.Transport
		reliable bool
	}{
		{config.TransportRC, true},
		{config.TransportUC, false},
		{config.TransportUD, false},
		{config.TransportAuto, true},
	} {
		t.Run(string(tc.tr), func(t *testing.T) { testTransport(t, tc.tr, tc.reliable) })
	}
}

func testTransport(t *testing.T, tr config.Transport, reliable bool) {
	cl := cluster(t, agenttest.Options{Transport: tr})
	a := client(t, cl.Nodes[0], "a", 4)
	b := client(t, cl.Nodes[1], "b", 4)
	ctx := testCtx(t)
	ln, err := b.Listen(ctx, ":80")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()

	// What each transport may carry: the socket's frame on the reliable
	// ones (the agents' maxMessageBytes is larger), one MTU on ud, one
	// receive buffer on uc, each less the engine's header.
	ecfg := cl.Nodes[0].Agent.Engine().Config()
	lo, hi := frame.MaxPayload, frame.MaxPayload
	switch tr {
	case config.TransportUD:
		lo, hi = ecfg.MTU.Bytes()-64, ecfg.MTU.Bytes()-1
	case config.TransportUC:
		lo, hi = ecfg.ChunkSize-64, ecfg.ChunkSize-1
	}

	// The server: the first vconn echoes messages, the second is the
	// stream (an echo on reliable transports; on the others, what Read and
	// Write answered).
	srvErr := make(chan error, 2)
	go func() {
		for i := 0; i < 2; i++ {
			c, err := ln.AcceptVConn()
			if err != nil {
				srvErr <- err
				return
			}
			if got, want := c.Transport(), vconn.Transport(tr); got != want {
				srvErr <- fmt.Errorf("accepted vconn: transport %q, want %q", got, want)
				continue
			}
			if i == 0 {
				go func() { srvErr <- echoMessages(ctx, c) }()
				continue
			}
			go func() {
				defer c.Close()
				if reliable {
					_, err := io.Copy(c, c)
					srvErr <- err
					return
				}
				// Refused, then a message vconn as any other.
				_, rerr := c.Read(make([]byte, 10))
				_, werr := c.Write([]byte("x"))
				srvErr <- errors.Join(notStream("accepted Read", rerr), notStream("accepted Write", werr), echoMessages(ctx, c))
			}()
		}
	}()

	// Messages.
	c, err := a.Dial(ctx, "node-b:80")
	if err != nil {
		t.Fatal(err)
	}
	limit := c.MaxMessage()
	if c.Transport() != vconn.Transport(tr) || c.Transport().Reliable() != reliable || limit < lo || limit > hi {
		t.Fatalf("vconn: transport %q (reliable %v), max message %d: want %q (reliable %v), %d..%d",
			c.Transport(), c.Transport().Reliable(), limit, tr, reliable, lo, hi)
	}
	for i, n := range []int{8, limit / 2, limit} {
		roundTrip(ctx, t, c, uint32(i), n, reliable)
	}
	if err := c.SendMsg(ctx, make([]byte, limit+1)); !errors.Is(err, vconn.ErrTooLarge) {
		t.Fatalf("a %d-byte message on a %s vconn carrying %d: %v, want ErrTooLarge", limit+1, tr, limit, err)
	}
	roundTrip(ctx, t, c, 9, limit, reliable) // the refusal left the vconn working
	if err := c.Close(); err != nil {
		t.Fatal(err)
	}
	if err := <-srvErr; err != nil {
		t.Fatalf("message server: %v", err)
	}

	// The stream.
	s, err := a.Dial(ctx, "node-b:80")
	if err != nil {
		t.Fatal(err)
	}
	if !reliable {
		n, werr := s.Write([]byte("hello"))
		_, rerr := s.Read(make([]byte, 10))
		if err := errors.Join(notStream("Write", werr), notStream("Read", rerr)); err != nil || n != 0 {
			t.Fatalf("stream on %s: wrote %d: %v", tr, n, err)
		}
		t.Logf("Write on %s: %v", tr, werr)
		roundTrip(ctx, t, s, 20, 100, reliable) // messages still work on it
	} else {
		streamEcho(t, s)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-srvErr:
		if err != nil {
			t.Fatalf("stream server: %v", err)
		}
	case <-ctx.Done():
		t.Fatal("the stream server did not finish")
	}
}

// notStream checks that err is a *net.OpError for ErrNotStream.
func notStream(what string, err error) error {
	var oe *net.OpError
	if !errors.Is(err, vconn.ErrNotStream) || !errors.As(err, &oe) {
		return fmt.Errorf("%s: %v, want a *net.OpError for ErrNotStream", what, err)
	}
	return nil
}

// echoMessages sends every message back until EOF.
func echoMessages(ctx context.Context, c *vconn.Conn) error {
	defer c.Close()
	for {
		m, err := c.RecvMsg(ctx)
		if errors.Is(err, io.EOF) {
			return nil
		}
		if err != nil {
			return err
		}
		if err := c.SendMsg(ctx, m.Data); err != nil {
			return err
		}
	}
}

// roundTrip sends a message of n bytes tagged seq and checks its echo
// byte for byte. On a lossy transport a message or its echo may be lost
// (and on ud an older echo may come late): it resends after a second and
// skips echoes of other messages.
func roundTrip(ctx context.Context, t *testing.T, c *vconn.Conn, seq uint32, n int, reliable bool) {
	t.Helper()
	msg := make([]byte, n)
	for i := range msg {
		msg[i] = byte(i*7) ^ byte(seq)
	}
	binary.BigEndian.PutUint32(msg, seq)
	for try := 0; try < 10; try++ {
		if err := c.SendMsg(ctx, msg); err != nil {
			t.Fatalf("send %d bytes: %v", n, err)
		}
		rctx := ctx
		if !reliable {
			var cancel context.CancelFunc
			rctx, cancel = context.WithTimeout(ctx, time.Second)
			defer cancel()
		}
		for {
			m, err := c.RecvMsg(rctx)
			if !reliable && rctx.Err() != nil && ctx.Err() == nil {
				t.Logf("message %d of %d bytes or its echo lost: resending", seq, n)
				break
			}
			if err != nil {
				t.Fatalf("echo of %d bytes: %v", n, err)
			}
			if !reliable && (len(m.Data) < 4 || binary.BigEndian.Uint32(m.Data) != seq) {
				continue // a late echo of an earlier try
			}
			if !bytes.Equal(m.Data, msg) {
				t.Fatalf("echo of message %d: %d bytes, want %d, equal %v", seq, len(m.Data), n, bytes.Equal(m.Data, msg))
			}
			return
		}
	}
	t.Fatalf("message %d of %d bytes: no echo in 10 tries", seq, n)
}

// streamEcho writes 300 KiB in writes of assorted sizes (one byte, more
// than a message, exactly a message) while reading the echo back, and
// checks every byte.
func streamEcho(t *testing.T, s *vconn.Conn) {
	t.Helper()
	data := make([]byte, 300<<10)
	rng := rand.New(rand.NewPCG(1, 2))
	for i := range data {
		data[i] = byte(rng.Uint32())
	}
	if err := s.SetDeadline(time.Now().Add(20 * time.Second)); err != nil {
		t.Fatal(err)
	}
	werr := make(chan error, 1)
	go func() {
		rest := data
		for _, n := range []int{1, 1000, s.MaxMessage(), 3*s.MaxMessage() + 17} {
			if _, err := s.Write(rest[:n]); err != nil {
				werr <- err
				return
			}
			rest = rest[n:]
		}
		_, err := s.Write(rest)
		werr <- err
	}()
	got := make([]byte, len(data))
	if _, err := io.ReadFull(s, got); err != nil {
		t.Fatalf("read the echo: %v", err)
	}
	if err := <-werr; err != nil {
		t.Fatalf("write: %v", err)
	}
	if !bytes.Equal(got, data) {
		i := 0
		for got[i] == data[i] {
			i++
		}
		t.Fatalf("the echo differs from byte %d of %d", i, len(data))
	}
}
