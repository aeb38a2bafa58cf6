package vconn_test

import (
	"context"
	"fmt"
	"net"
	"net/netip"
	"testing"

	"github.com/go-logr/logr"

	"github.com/rdmavisor/rdmavisor/internal/agent/agenttest"
	"github.com/rdmavisor/rdmavisor/internal/engine"
	"github.com/rdmavisor/rdmavisor/internal/verbs/soft"
	"github.com/rdmavisor/rdmavisor/internal/verbs/soft/wire"
	"github.com/rdmavisor/rdmavisor/pkg/vconn"
)

// msgConn is what both paths of E4 offer.
type msgConn interface {
	send(ctx context.Context, b []byte) error
	recv(ctx context.Context) error
}

type sdkConn struct{ c *vconn.Conn }

func (s sdkConn) send(ctx context.Context, b []byte) error { return s.c.SendMsg(ctx, b) }
func (s sdkConn) recv(ctx context.Context) error {
	_, err := s.c.RecvMsg(ctx)
	return err
}

type engConn struct{ vc *engine.VConn }

func (e engConn) send(ctx context.Context, b []byte) error { return e.vc.Send(ctx, b) }
func (e engConn) recv(ctx context.Context) error {
	m, err := e.vc.Recv(ctx)
	if err == nil {
		m.Release()
	}
	return err
}

// sdkPair connects two vconns through two agents and their sockets.
func sdkPair(b *testing.B) (msgConn, msgConn) {
	cl := cluster(b, agenttest.Options{})
	ca := client(b, cl.Nodes[0], "a", 4)
	cb := client(b, cl.Nodes[1], "b", 4)
	ctx := testCtx(b)
	ln, err := cb.Listen(ctx, ":9")
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = ln.Close() })
	c, err := ca.Dial(ctx, "node-b:9")
	if err != nil {
		b.Fatal(err)
	}
	s, err := ln.AcceptVConn()
	if err != nil {
		b.Fatal(err)
	}
	return sdkConn{c}, sdkConn{s}
}

// enginePair connects two vconns of two in-process engines on the same
// provider and wire (soft devices over UDP on 127.0.0.2 and 127.0.0.3).
func enginePair(b *testing.B) (msgConn, msgConn) {
	pc, err := net.ListenPacket("udp", "127.0.0.2:0")
	if err != nil {
		b.Fatal(err)
	}
	port := uint16(pc.LocalAddr().(*net.UDPAddr).Port)
	_ = pc.Close()
	open := func(ip string) *engine.Engine {
		w, err := wire.ListenUDP(wire.UDPConfig{Addr: netip.MustParseAddr(ip), Port: port})
		if err != nil {
			b.Fatal(err)
		}
		dev, err := soft.Open(soft.Config{Name: ip, Wire: w})
		if err != nil {
			b.Fatal(err)
		}
		e, err := engine.New(engine.Config{Device: dev, Log: logr.Discard(), QPsPerPeer: 2, RecvBuffers: 1024, SendBuffers: 1024})
		if err != nil {
			b.Fatal(err)
		}
		b.Cleanup(func() { _ = e.Close(); _ = dev.Close() })
		return e
	}
	ea, eb := open("127.0.0.2"), open("127.0.0.3")
	va, vb, err := engine.Pair(testCtx(b), ea, eb, engine.VConnOptions{}, engine.VConnOptions{})
	if err != nil {
		b.Fatal(err)
	}
	return engConn{va}, engConn{vb}
}

// BenchmarkE4 measures the pod-to-agent hop: a 64-byte round trip and
// one-way messages/s through the unix socket and the agents, against the
// same engines called directly in-process, in one run.
func BenchmarkE4(b *testing.B) {
	msg := make([]byte, 64)
	for _, path := range []struct {
		name string
		pair func(*testing.B) (msgConn, msgConn)
	}{{"socket", sdkPair}, {"engine", enginePair}} {
		b.Run(fmt.Sprintf("rtt/%s", path.name), func(b *testing.B) {
			c, s := path.pair(b)
			ctx := testCtx(b)
			go func() {
				for {
					if s.recv(ctx) != nil || s.send(ctx, msg) != nil {
						return
					}
				}
			}()
			b.ReportAllocs()
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				if err := c.send(ctx, msg); err != nil {
					b.Fatal(err)
				}
				if err := c.recv(ctx); err != nil {
					b.Fatal(err)
				}
			}
			b.ReportMetric(float64(b.Elapsed().Microseconds())/float64(b.N), "µs/rtt")
		})
		b.Run(fmt.Sprintf("stream/%s", path.name), func(b *testing.B) {
			c, s := path.pair(b)
			ctx := testCtx(b)
			done := make(chan error, 1)
			go func() {
				for i := 0; i < b.N; i++ {
					if err := s.recv(ctx); err != nil {
						done <- err
						return
					}
				}
				done <- nil
			}()
			b.ReportAllocs()
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				if err := c.send(ctx, msg); err != nil {
					b.Fatal(err)
				}
			}
			if err := <-done; err != nil {
				b.Fatal(err)
			}
			b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "msgs/s")
		})
	}
}
