package agent_test

import (
	"encoding/binary"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/rdmavisor/rdmavisor/internal/agent/agenttest"
	"github.com/rdmavisor/rdmavisor/internal/config"
	"github.com/rdmavisor/rdmavisor/internal/engine"
	"github.com/rdmavisor/rdmavisor/internal/frame"
	"github.com/rdmavisor/rdmavisor/internal/poll"
	"github.com/rdmavisor/rdmavisor/pkg/vconn"
)

// TestAllocationLimits: an allocation holds at most limits.sessions
// connections, limits.listeners ports and limits.regions regions of
// limits.regionBytes in all; past each the application gets ErrLimit,
// nothing else breaks, and closing one frees its place.
func TestAllocationLimits(t *testing.T) {
	cl := startCluster(t, agenttest.Options{TuneConfig: func(c *config.AgentConfig) {
		c.Limits = config.Limits{Sessions: 2, Listeners: 2, Regions: 2, RegionBytes: 64 << 10, QueuedBytes: config.DefaultQueuedBytes, RegisteredBytes: config.DefaultRegisteredBytes}
	}})
	ctx := ctxT(t)
	a, b := cl.Nodes[0], cl.Nodes[1]
	sock, err := a.Allocate(ctx, "lim", 8)
	if err != nil {
		t.Fatal(err)
	}
	c1, err := vconn.NewClient(ctx, vconn.Options{Socket: sock})
	if err != nil {
		t.Fatal(err)
	}
	c2, err := vconn.NewClient(ctx, vconn.Options{Socket: sock})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := vconn.NewClient(ctx, vconn.Options{Socket: sock}); !errors.Is(err, vconn.ErrLimit) {
		t.Fatalf("third session: %v, want ErrLimit", err)
	}
	_ = c2.Close()
	poll.Until(t, 10*time.Second, "a session's place freed", func() bool {
		c, err := vconn.NewClient(ctx, vconn.Options{Socket: sock})
		if err == nil {
			_ = c.Close()
		}
		return err == nil
	})

	// Listeners.
	l1, err := c1.Listen(ctx, ":1")
	if err != nil {
		t.Fatal(err)
	}
	// A port in use is refused as that, and takes no place.
	if _, err := c1.Listen(ctx, ":1"); !errors.Is(err, vconn.ErrAddrInUse) {
		t.Fatalf("listen on a used port: %v, want ErrAddrInUse", err)
	}
	if _, err := c1.Listen(ctx, ":2"); err != nil {
		t.Fatal(err)
	}
	if _, err := c1.Listen(ctx, ":3"); !errors.Is(err, vconn.ErrLimit) {
		t.Fatalf("third listener: %v, want ErrLimit", err)
	}
	_ = l1.Close()
	l3, err := c1.Listen(ctx, ":3")
	if err != nil {
		t.Fatalf("listen after one closed: %v", err)
	}

	// Regions, by count and by bytes.
	srv := appClient(t, b, "srv", 4)
	ln, err := srv.Listen(ctx, ":9")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	go agenttest.ServeDiscard(ln)
	c, err := c1.Dial(ctx, "node-b:9")
	if err != nil {
		t.Fatal(err)
	}
	r1, err := c.Export(ctx, 32<<10, vconn.AccessRead)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.Export(ctx, 16<<10, vconn.AccessRead); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Export(ctx, 1, vconn.AccessRead); !errors.Is(err, vconn.ErrLimit) {
		t.Fatalf("third region: %v, want ErrLimit", err)
	}
	if err := r1.Close(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Export(ctx, 48<<10+1, vconn.AccessRead); !errors.Is(err, vconn.ErrLimit) {
		t.Fatalf("a region past limits.regionBytes: %v, want ErrLimit", err)
	}
	// The withdrawn region counts until the peer confirmed, a round
	// trip after the unexport.
	poll.Until(t, 10*time.Second, "a region that fits the bytes left", func() bool {
		_, err := c.Export(ctx, 48<<10, vconn.AccessRead)
		if err != nil && !errors.Is(err, vconn.ErrLimit) {
			t.Fatalf("a region that fits the bytes left: %v", err)
		}
		return err == nil
	})
	// The vconn still works, and its end returns its regions' places.
	if err := c.SendMsg(ctx, []byte("still fine")); err != nil {
		t.Fatal(err)
	}
	_ = c.Close()
	_ = l3.Close()
	c, err = c1.Dial(ctx, "node-b:9")
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	poll.Until(t, 10*time.Second, "the closed vconn's regions freed", func() bool {
		r, err := c.Export(ctx, 64<<10, vconn.AccessRead)
		if err == nil {
			_ = r.Close(ctx)
		}
		return err == nil
	})
}

// queuedLimit is limits.queuedBytes in the queued-bytes tests: the least
// allowed, eight of their 8 KiB messages.
const queuedLimit = config.MinQueuedBytes

func startQueuedCluster(t *testing.T) *agenttest.Cluster {
	return startCluster(t, agenttest.Options{
		// Few credits, so that a held message stops its sender soon.
		TuneEngine: func(c *engine.Config) { c.Credits = 8 },
		// node-a's pods are limited; node-b's senders stream at full
		// window.
		TuneConfig: func(c *config.AgentConfig) {
			if c.NodeName == "node-a" {
				c.Limits.QueuedBytes = queuedLimit
			}
		},
	})
}

// watchQueued samples allocation id's queued bytes until the test ends,
// and fails the test if either direction ever passes the limit.
func watchQueued(t *testing.T, n *agenttest.Node, id string) (rx func() int64) {
	var last atomic.Int64
	done := make(chan struct{})
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			r, x, _ := n.Agent.QueuedBytes(id)
			last.Store(r)
			if r > queuedLimit || x > queuedLimit || r < 0 || x < 0 {
				t.Errorf("allocation %s holds %d received and %d sent bytes: limit %d", id, r, x, queuedLimit)
				return
			}
			select {
			case <-done:
				return
			case <-time.After(200 * time.Microsecond):
			}
		}
	}()
	t.Cleanup(func() { close(done); wg.Wait() })
	return last.Load
}

// TestQueuedBytesReceive: a pod that grants its vconns a large window and
// never reads its socket gets the allocation's received bytes in the
// agent up to limits.queuedBytes and no further; the deliveries past it
// wait in the engine, holding their credits, so the senders are held
// back, while another allocation's vconns to the same peer keep flowing.
// Once the pod reads, every message arrives, intact and in order, and the
// count goes back to zero when the pod leaves.
func TestQueuedBytesReceive(t *testing.T) {
	const (
		vconns = 12
		msgs   = 100     // per vconn
		size   = 8 << 10 // one chunk
	)
	cl := startQueuedCluster(t)
	ctx := ctxT(t)
	a, b := cl.Nodes[0], cl.Nodes[1]

	// On node-b: for each vconn, read its index, then send it msgs
	// messages tagged with index and sequence.
	srv := appClient(t, b, "srv", vconns+4)
	ln, err := srv.Listen(ctx, ":9")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	var sent atomic.Int64
	var senders sync.WaitGroup
	senders.Add(vconns)
	go func() {
		for range vconns {
			c, err := ln.AcceptVConn()
			if err != nil {
				return
			}
			go func() {
				defer senders.Done()
				m, err := c.RecvMsg(ctx)
				if err != nil || len(m.Data) != 1 {
					t.Errorf("the index: %v (%d bytes)", err, len(m.Data))
					return
				}
				for i := range msgs {
					if err := c.SendMsg(ctx, payload(m.Data[0], i, size)); err != nil {
						t.Errorf("send %d: %v", i, err)
						return
					}
					sent.Add(1)
				}
			}()
		}
	}()
	echo, err := srv.Listen(ctx, ":10")
	if err != nil {
		t.Fatal(err)
	}
	defer echo.Close()
	go agenttest.ServeEcho(echo)

	// The pod that will not read.
	sock, err := a.Allocate(ctx, "pod", vconns)
	if err != nil {
		t.Fatal(err)
	}
	rx := watchQueued(t, a, "pod")
	r := dialRaw(t, sock)
	r.send(frame.Frame{Op: frame.OpHello, Req: 1, Arg: frame.Version})
	if f, err := r.recv(); err != nil || f.Op != frame.OpOK {
		t.Fatalf("hello: %v %v", f.Op, err)
	}
	index := map[uint32]byte{} // handle -> index
	for i := range vconns {
		r.send(frame.Frame{Op: frame.OpDial, Req: uint32(10 + i), Payload: []byte("node-b:9")})
		f, err := r.recv()
		if err != nil || f.Op != frame.OpOK {
			t.Fatalf("dial %d: %v %v %s", i, f.Op, err, f.Payload)
		}
		index[f.Handle] = byte(i)
		r.send(frame.Frame{Op: frame.OpSend, Req: uint32(100 + i), Handle: f.Handle, Payload: []byte{byte(i)}})
		if f, err := r.recv(); err != nil || f.Op != frame.OpOK {
			t.Fatalf("send the index %d: %v %v %s", i, f.Op, err, f.Payload)
		}
	}
	for h := range index {
		r.send(frame.Frame{Op: frame.OpGrant, Handle: h, Arg: 1 << 20})
	}

	poll.Until(t, 10*time.Second, "the received bytes at the limit", func() bool { return rx() > queuedLimit-size })
	time.Sleep(200 * time.Millisecond)
	if n := sent.Load(); n >= vconns*msgs {
		t.Fatalf("the senders sent all %d messages to a pod that reads none", n)
	}

	// Another allocation's traffic to the same peer flows meanwhile.
	other := appClient(t, a, "other", 1)
	c, err := other.Dial(ctx, "node-b:10")
	if err != nil {
		t.Fatal(err)
	}
	for i := range 50 {
		want := payload(0xee, i, 1000)
		if err := c.SendMsg(ctx, want); err != nil {
			t.Fatal(err)
		}
		m, err := c.RecvMsg(ctx)
		if err != nil || string(m.Data) != string(want) {
			t.Fatalf("echo %d: %v", i, err)
		}
	}
	_ = c.Close()
	if got := rx(); got <= queuedLimit-size {
		t.Fatalf("the pod's received bytes fell to %d while it read nothing", got)
	}
	held := sent.Load()
	if held >= vconns*msgs {
		t.Fatalf("the senders sent all %d messages to a pod that reads none", held)
	}

	// The pod reads: everything arrives, in order.
	next := map[uint32]int{}
	for got := 0; got < vconns*msgs; {
		f, err := r.recv()
		if err != nil {
			t.Fatalf("after %d messages: %v", got, err)
		}
		if f.Op != frame.OpData {
			t.Fatalf("after %d messages: %v %s", got, f.Op, f.Payload)
		}
		i, ok := index[f.Handle]
		if !ok {
			t.Fatalf("data for handle %d", f.Handle)
		}
		if want := payload(i, next[f.Handle], size); string(f.Payload) != string(want) {
			t.Fatalf("vconn %d: message %d is not the one sent next", i, next[f.Handle])
		}
		next[f.Handle]++
		got++
	}
	senders.Wait()
	t.Logf("%d of %d messages sent while the pod read nothing", held, vconns*msgs)

	_ = r.c.Close()
	poll.Until(t, 10*time.Second, "the pod's queued bytes back to zero", func() bool {
		rx, tx, _ := a.Agent.QueuedBytes("pod")
		return rx == 0 && tx == 0
	})
}

// payload is message seq of vconn i: its index and sequence, then a
// pattern of both.
func payload(i byte, seq, size int) []byte {
	b := make([]byte, size)
	b[0] = i
	binary.BigEndian.PutUint32(b[1:], uint32(seq))
	for k := 5; k < size; k++ {
		b[k] = byte(k) ^ i ^ byte(seq)
	}
	return b
}

// TestQueuedBytesSend: the pod's payloads waiting in the agent for a peer
// that does not read are at most limits.queuedBytes; the next operation
// fails with ErrLimit's code, and closing the vconn gives back what its
// queued operations held.
func TestQueuedBytesSend(t *testing.T) {
	cl := startQueuedCluster(t)
	ctx := ctxT(t)
	a, b := cl.Nodes[0], cl.Nodes[1]
	listenNeverRead(t, b, ":9")
	sock, err := a.Allocate(ctx, "pod", 2)
	if err != nil {
		t.Fatal(err)
	}
	watchQueued(t, a, "pod")
	r, h := rawVConn(t, sock, "node-b:9")
	// Sends of 32 KiB, each answered before the next goes, until the
	// peer's credits and the engine's send queue run out and two wait in
	// the agent: the third is refused.
	var limited bool
	buf := make([]byte, frame.MaxFrame)
	for req := uint32(10); req < 10+2000 && !limited; req++ {
		r.send(frame.Frame{Op: frame.OpSend, Req: req, Handle: h, Payload: payload(1, int(req), 32<<10)})
		for {
			_ = r.c.SetReadDeadline(time.Now().Add(300 * time.Millisecond))
			n, err := r.c.Read(buf)
			if err != nil {
				// No answer: the send waits in the agent; send more.
				break
			}
			f, err := frame.Decode(buf[:n])
			if err != nil {
				t.Fatal(err)
			}
			if f.Op == frame.OpError {
				if frame.Code(f.Arg) != frame.CodeLimit {
					t.Fatalf("send %d: code %d %s, want the limit code", f.Req, f.Arg, f.Payload)
				}
				limited = true
				break
			}
			if f.Req == req {
				break
			}
		}
	}
	if !limited {
		t.Fatal("sends to a peer that reads nothing never met limits.queuedBytes")
	}
	if _, tx, _ := a.Agent.QueuedBytes("pod"); tx != queuedLimit {
		t.Fatalf("%d bytes of sends queued at the refusal, want the limit, %d", tx, queuedLimit)
	}
	// Once refused, the vconn's later sends are too, even of one byte:
	// no hole in what the peer gets.
	r.send(frame.Frame{Op: frame.OpSend, Req: 300, Handle: h, Payload: []byte{1}})
	if f, err := r.recv(); err != nil || f.Op != frame.OpError || frame.Code(f.Arg) != frame.CodeLimit {
		t.Fatalf("a send after the refusal: %v %v, want the limit code", f.Op, err)
	}
	r.send(frame.Frame{Op: frame.OpClose, Req: 200, Handle: h})
	poll.Until(t, 10*time.Second, "the closed vconn's sends given back", func() bool {
		rx, tx, _ := a.Agent.QueuedBytes("pod")
		return rx == 0 && tx == 0
	})
}

// listenNeverRead listens on addr of node n with an application that
// accepts every vconn and never reads it: its senders stall.
func listenNeverRead(t *testing.T, n *agenttest.Node, addr string) {
	t.Helper()
	ln, err := appClient(t, n, "srv", 2).Listen(ctxT(t), addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = ln.Close() })
	go func() {
		for {
			c, err := ln.AcceptVConn()
			if err != nil {
				return
			}
			t.Cleanup(func() { _ = c.Close() })
		}
	}()
}

// rawVConn says hello on an allocation's socket as a raw client and dials
// addr: the connection and the vconn's handle.
func rawVConn(t *testing.T, sock, addr string) (*rawConn, uint32) {
	t.Helper()
	r := dialRaw(t, sock)
	r.send(frame.Frame{Op: frame.OpHello, Req: 1, Arg: frame.Version})
	if f, err := r.recv(); err != nil || f.Op != frame.OpOK {
		t.Fatalf("hello: %v %v", f.Op, err)
	}
	r.send(frame.Frame{Op: frame.OpDial, Req: 2, Payload: []byte(addr)})
	f, err := r.recv()
	if err != nil || f.Op != frame.OpOK {
		t.Fatalf("dial: %v %v %s", f.Op, err, f.Payload)
	}
	return r, f.Handle
}
