package vconn_test

import (
	"context"
	"fmt"
	"net"
	"net/netip"
	"slices"
	"testing"
	"time"

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
	// recvFirst receives a message and returns its first byte (0 if
	// empty): BenchmarkE4Paired's echo reads it to tell round trips from
	// one-way messages.
	recvFirst(ctx context.Context) (byte, error)
}

type sdkConn struct{ c *vconn.Conn }

func (s sdkConn) send(ctx context.Context, b []byte) error { return s.c.SendMsg(ctx, b) }
func (s sdkConn) recv(ctx context.Context) error {
	_, err := s.c.RecvMsg(ctx)
	return err
}

func (s sdkConn) recvFirst(ctx context.Context) (byte, error) {
	m, err := s.c.RecvMsg(ctx)
	if err != nil || len(m.Data) == 0 {
		return 0, err
	}
	return m.Data[0], nil
}

type engConn struct{ vc *engine.VConn }

func (e engConn) recvFirst(ctx context.Context) (byte, error) {
	m, err := e.vc.Recv(ctx)
	if err != nil {
		return 0, err
	}
	var b byte
	if len(m.Data) > 0 {
		b = m.Data[0]
	}
	m.Release()
	return b, nil
}

func (e engConn) send(ctx context.Context, b []byte) error { return e.vc.Send(ctx, b) }
func (e engConn) recv(ctx context.Context) error {
	m, err := e.vc.Recv(ctx)
	if err == nil {
		m.Release()
	}
	return err
}

// sdkPair connects two vconns through two agents and their sockets.
func sdkPair(b *testing.B) (msgConn, msgConn) { return agentPair(b, false) }

// shmPairB connects two vconns through two agents, each pod on shared
// memory.
func shmPairB(b *testing.B) (msgConn, msgConn) { return agentPair(b, true) }

func agentPair(b *testing.B, shm bool) (msgConn, msgConn) {
	cl := cluster(b, agenttest.Options{})
	ca := shmClient(b, cl.Nodes[0], "a", 4, shm)
	cb := shmClient(b, cl.Nodes[1], "b", 4, shm)
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
	if c.OnSharedMemory() != shm || s.OnSharedMemory() != shm {
		b.Fatalf("on shared memory: %v and %v, want %v", c.OnSharedMemory(), s.OnSharedMemory(), shm)
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

// BenchmarkE4 measures the pod-to-agent hop: a 64-byte round trip (mean
// and median) and one-way messages/s through the agents, with the pods on
// the unix socket and on shared memory, against the same engines called
// directly in-process, in one run.
func BenchmarkE4(b *testing.B) {
	msg := make([]byte, 64)
	for _, path := range []struct {
		name string
		pair func(*testing.B) (msgConn, msgConn)
	}{{"socket", sdkPair}, {"shm", shmPairB}, {"engine", enginePair}} {
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
			rtts := make([]time.Duration, b.N)
			b.ReportAllocs()
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				t0 := time.Now()
				if err := c.send(ctx, msg); err != nil {
					b.Fatal(err)
				}
				if err := c.recv(ctx); err != nil {
					b.Fatal(err)
				}
				rtts[i] = time.Since(t0)
			}
			b.StopTimer()
			slices.Sort(rtts)
			b.ReportMetric(float64(b.Elapsed().Microseconds())/float64(b.N), "µs/rtt")
			b.ReportMetric(float64(rtts[len(rtts)/2].Nanoseconds())/1e3, "p50-µs/rtt")
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
