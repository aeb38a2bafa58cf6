package vconn_test

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"os"
	"testing"
	"time"
	"unsafe"

	"github.com/rdmavisor/rdmavisor/internal/agent/agenttest"
	"github.com/rdmavisor/rdmavisor/internal/config"
	"github.com/rdmavisor/rdmavisor/internal/shm"
	"github.com/rdmavisor/rdmavisor/pkg/vconn"
	"go.uber.org/goleak"
)

// shmClient is client with the shared-memory path asked for (or not).
func shmClient(t testing.TB, n *agenttest.Node, id string, k int, on bool) *vconn.Client {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	sock, err := n.Allocate(ctx, id, k)
	if err != nil {
		t.Fatal(err)
	}
	c, err := vconn.NewClient(ctx, vconn.Options{Socket: sock, SharedMemory: on})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() })
	return c
}

// shmPair dials from a to b through two agents.
func shmPair(t testing.TB, a, b *vconn.Client, node string) (*vconn.Conn, *vconn.Conn) {
	t.Helper()
	ctx := testCtx(t)
	ln, err := b.Listen(ctx, ":7")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = ln.Close() })
	c, err := a.Dial(ctx, node+":7")
	if err != nil {
		t.Fatal(err)
	}
	s, err := ln.AcceptVConn()
	if err != nil {
		t.Fatal(err)
	}
	return c, s
}

// TestSharedMemoryEcho sends messages of every size class through shared
// memory on both ends and checks each comes back whole, in order, with
// its immediate, then that EOF follows the last one.
func TestSharedMemoryEcho(t *testing.T) {
	for _, mixed := range []bool{false, true} {
		name := "both"
		if mixed {
			name = "dialer-only" // the listener's pod stays on the socket
		}
		t.Run(name, func(t *testing.T) {
			cl := cluster(t, agenttest.Options{})
			a := shmClient(t, cl.Nodes[0], "a", 4, true)
			b := shmClient(t, cl.Nodes[1], "b", 4, !mixed)
			c, s := shmPair(t, a, b, cl.Nodes[1].Name)
			if !c.OnSharedMemory() || s.OnSharedMemory() != !mixed {
				t.Fatalf("on shared memory: dialer %v, listener %v", c.OnSharedMemory(), s.OnSharedMemory())
			}
			ctx := testCtx(t)
			done := make(chan error, 1)
			go func() {
				for {
					m, err := s.RecvMsg(ctx)
					if errors.Is(err, io.EOF) {
						done <- s.Close()
						return
					}
					if err == nil {
						err = s.SendMsgImm(ctx, m.Data, m.Imm+1)
					}
					if err != nil {
						done <- err
						return
					}
				}
			}()
			sizes := []int{0, 1, 63, 64, 65, 1000, 4096, 20000, c.MaxMessage()}
			const rounds = 300
			go func() { // the sender runs ahead of the reader: rings fill
				for i := 0; i < rounds; i++ {
					m := bytes.Repeat([]byte{byte(i)}, sizes[i%len(sizes)])
					if err := c.SendMsgImm(ctx, m, uint32(i)); err != nil {
						t.Error(err)
						return
					}
				}
			}()
			for i := 0; i < rounds; i++ {
				m, err := c.RecvMsg(ctx)
				if err != nil {
					t.Fatalf("reply %d: %v", i, err)
				}
				want := bytes.Repeat([]byte{byte(i)}, sizes[i%len(sizes)])
				if !m.HasImm || m.Imm != uint32(i)+1 || !bytes.Equal(m.Data, want) {
					t.Fatalf("reply %d: imm %v %d, %d bytes, want %d", i, m.HasImm, m.Imm, len(m.Data), len(want))
				}
			}
			if err := c.Close(); err != nil {
				t.Fatal(err)
			}
			if err := <-done; err != nil {
				t.Fatal(err)
			}
			// The TX rings' messages of half a chunk or more (8,176 bytes
			// at the default 16 KiB) went from the slab in place, the
			// others were copied; the slabs are deregistered once the
			// vconns are gone.
			var large uint64
			for i := 0; i < rounds; i++ {
				if sizes[i%len(sizes)] >= 8176 {
					large++
				}
			}
			for i, on := range []bool{true, !mixed} {
				eng := cl.Nodes[i].Agent.Engine()
				if got := eng.Stats().SentInPlace; on && got != large || !on && got != 0 {
					t.Errorf("node %d (on shared memory: %v) sent %d messages in place, want %d", i, on, got, map[bool]uint64{true: large}[on])
				}
				waitUntil(t, func() bool { return eng.Stats().RegisteredBytes == 0 }, "the TX slabs deregistered")
			}
		})
	}
}

// TestSharedMemoryRefused checks that the agent refuses a second segment
// for a vconn (the client would stay on what it has) and that the vconn
// keeps working.
func TestSharedMemoryRefused(t *testing.T) {
	cl := cluster(t, agenttest.Options{})
	a := shmClient(t, cl.Nodes[0], "a", 4, true)
	b := shmClient(t, cl.Nodes[1], "b", 4, false)
	c, s := shmPair(t, a, b, cl.Nodes[1].Name)
	ctx := testCtx(t)
	if err := c.AskSharedMemory(ctx); !errors.Is(err, &vconn.Error{Code: vconn.CodeBadRequest}) {
		t.Fatalf("second segment: %v", err)
	}
	// A message through s shows its window grant, which the client sends
	// on accept without waiting, reached the agent: only then is a
	// segment one asked "after a grant".
	if err := c.SendMsg(ctx, []byte("still here")); err != nil {
		t.Fatal(err)
	}
	if m, err := s.RecvMsg(ctx); err != nil || string(m.Data) != "still here" {
		t.Fatalf("%q %v", m.Data, err)
	}
	if err := s.AskSharedMemory(ctx); !errors.Is(err, &vconn.Error{Code: vconn.CodeBadRequest}) {
		t.Fatalf("segment after a grant: %v", err)
	}
	if err := c.SendMsg(ctx, []byte("and still")); err != nil {
		t.Fatal(err)
	}
	if m, err := s.RecvMsg(ctx); err != nil || string(m.Data) != "and still" {
		t.Fatalf("%q %v", m.Data, err)
	}
}

// TestSharedMemoryHostilePod plays a pod that breaks its rings: the agent
// must fail that vconn, say why, and keep serving the pod's other vconns.
func TestSharedMemoryHostilePod(t *testing.T) {
	for _, tc := range []struct {
		name   string
		break_ func(t *testing.T, c *vconn.Conn)
	}{
		{"rx head out of bounds", func(t *testing.T, c *vconn.Conn) {
			// The RX ring is the second half; its head is the pod's to
			// publish, and the agent reads it before each delivery.
			mem := c.SharedMemory()
			binary.LittleEndian.PutUint32(mem[len(mem)/2+64:], 12345)
		}},
		{"tx flags only the agent sends", func(t *testing.T, c *vconn.Conn) {
			if ok, err := c.PushRaw(nil, 0, shm.FlagEOF); !ok || err != nil {
				t.Fatal(ok, err)
			}
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cl := cluster(t, agenttest.Options{})
			a := shmClient(t, cl.Nodes[0], "a", 4, true)
			b := shmClient(t, cl.Nodes[1], "b", 4, true)
			ctx := testCtx(t)
			ln, err := b.Listen(ctx, ":7")
			if err != nil {
				t.Fatal(err)
			}
			defer ln.Close()
			go func() { // greets every vconn, then discards what it reads
				for {
					s, err := ln.AcceptVConn()
					if err != nil {
						return
					}
					go func() {
						defer s.Close()
						for s.SendMsg(ctx, []byte("hi")) == nil {
							if _, err := s.RecvMsg(ctx); err != nil {
								return
							}
						}
					}()
				}
			}()
			bad, err := a.Dial(ctx, cl.Nodes[1].Name+":7")
			if err != nil {
				t.Fatal(err)
			}
			good, err := a.Dial(ctx, cl.Nodes[1].Name+":7")
			if err != nil {
				t.Fatal(err)
			}
			if !bad.OnSharedMemory() {
				t.Fatal("not on shared memory")
			}
			if _, err := bad.RecvMsg(ctx); err != nil { // the first greeting
				t.Fatal(err)
			}
			tc.break_(t, bad)
			_ = bad.SendMsg(ctx, []byte("x")) // another greeting comes back
			rctx, cancel := context.WithTimeout(ctx, 10*time.Second)
			defer cancel()
			var rerr error
			for rerr == nil {
				_, rerr = bad.RecvMsg(rctx)
			}
			if !errors.Is(rerr, &vconn.Error{Code: vconn.CodeBadRequest}) {
				t.Fatalf("broken ring: RecvMsg %v, want a bad request", rerr)
			}
			for i := 0; i < 100; i++ {
				if err := good.SendMsg(ctx, []byte("fine")); err != nil {
					t.Fatalf("other vconn: %v", err)
				}
				if _, err := good.RecvMsg(ctx); err != nil {
					t.Fatalf("other vconn: %v", err)
				}
			}
			if err := good.Close(); err != nil {
				t.Fatal(err)
			}
			_ = bad.Close()
		})
	}
}

// TestSharedMemoryLeaks opens and closes shared-memory vconns and checks
// that no goroutine, descriptor (memfd, doorbell) or mapping is left on
// either side once the clients and agents are gone.
func TestSharedMemoryLeaks(t *testing.T) {
	fds := func() int {
		ents, err := os.ReadDir("/proc/self/fd")
		if err != nil {
			t.Fatal(err)
		}
		return len(ents)
	}
	maps := func() int {
		b, err := os.ReadFile("/proc/self/maps")
		if err != nil {
			t.Fatal(err)
		}
		return bytes.Count(b, []byte("memfd:rdmavisor-"))
	}
	defer goleak.VerifyNone(t, goleak.IgnoreCurrent())
	fd0 := fds()
	func() {
		cl := cluster(t, agenttest.Options{})
		a := shmClient(t, cl.Nodes[0], "a", 8, true)
		b := shmClient(t, cl.Nodes[1], "b", 64, true)
		ctx := testCtx(t)
		ln, err := b.Listen(ctx, ":9")
		if err != nil {
			t.Fatal(err)
		}
		go agenttest.ServeDiscard(ln)
		for i := 0; i < 200; i++ {
			c, err := a.Dial(ctx, cl.Nodes[1].Name+":9")
			if err != nil {
				t.Fatalf("cycle %d: %v", i, err)
			}
			if !c.OnSharedMemory() {
				t.Fatalf("cycle %d: on the socket", i)
			}
			if err := c.SendMsg(ctx, []byte("x")); err != nil {
				t.Fatal(err)
			}
			if err := c.Close(); err != nil {
				t.Fatalf("cycle %d: close: %v", i, err)
			}
		}
		_ = ln.Close()
		_ = a.Close()
		_ = b.Close()
		if err := cl.Close(); err != nil {
			t.Fatal(err)
		}
	}()
	deadline := time.Now().Add(10 * time.Second)
	for (fds() > fd0 || maps() > 0) && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	if n := fds(); n > fd0 {
		t.Errorf("%d descriptors open, %d before", n, fd0)
	}
	if n := maps(); n > 0 {
		b, _ := os.ReadFile("/proc/self/maps")
		t.Errorf("%d shared-memory mappings left:\n%s", n, b)
	}
}

// TestSharedMemoryPayloadRewritten plays a pod that rewrites its TX slab
// while the agent sends from it in place: that is the pod's own data, so
// its messages arrive with their lengths, immediates and order (the
// headers are the agent's, not the pod's), the vconn carries on, and
// nothing else breaks.
func TestSharedMemoryPayloadRewritten(t *testing.T) {
	cl := cluster(t, agenttest.Options{})
	a := shmClient(t, cl.Nodes[0], "a", 4, true)
	b := shmClient(t, cl.Nodes[1], "b", 4, true)
	c, s := shmPair(t, a, b, cl.Nodes[1].Name)
	ctx := testCtx(t)
	mem := c.SharedMemory()
	slab := mem[4352 : len(mem)/2] // the TX ring's slab and past it, in the default layout
	stop := make(chan struct{})
	scribbled := make(chan struct{})
	go func() {
		defer close(scribbled)
		for i := 0; ; i++ {
			select {
			case <-stop:
				return
			default:
			}
			for j := i % 64; j < len(slab); j += 61 {
				slab[j] = byte(i)
			}
		}
	}()
	const rounds = 200
	go func() {
		for i := 0; i < rounds; i++ {
			if err := c.SendMsgImm(ctx, make([]byte, 9000+i*150), uint32(i)); err != nil { // sent in place: over half a chunk
				t.Error(err)
				return
			}
		}
	}()
	for i := 0; i < rounds; i++ {
		m, err := s.RecvMsg(ctx)
		if err != nil {
			t.Fatalf("message %d: %v", i, err)
		}
		if len(m.Data) != 9000+i*150 || !m.HasImm || m.Imm != uint32(i) {
			t.Fatalf("message %d: %d bytes, imm %v %d; want %d bytes, imm %d", i, len(m.Data), m.HasImm, m.Imm, 9000+i*150, i)
		}
	}
	close(stop)
	<-scribbled
	if err := s.SendMsg(ctx, []byte("still fine")); err != nil {
		t.Fatal(err)
	}
	if m, err := c.RecvMsg(ctx); err != nil || string(m.Data) != "still fine" {
		t.Fatalf("after the rewrites: %q, %v", m.Data, err)
	}
	if got := cl.Nodes[0].Agent.Engine().Stats().SentInPlace; got < rounds {
		t.Errorf("%d messages sent in place, want at least %d", got, rounds)
	}
}

// TestSharedMemoryRead: Read on shared memory copies a message straight
// from the ring into the caller's buffer, keeping the rest for the next
// Read when the buffer is shorter: with buffers shorter, equal and longer
// than the messages, the stream arrives byte for byte, and empty messages
// are skipped as on the socket.
func TestSharedMemoryRead(t *testing.T) {
	cl := cluster(t, agenttest.Options{})
	a := shmClient(t, cl.Nodes[0], "a", 4, true)
	b := shmClient(t, cl.Nodes[1], "b", 4, true)
	c, s := shmPair(t, a, b, cl.Nodes[1].Name)
	if !s.OnSharedMemory() {
		t.Fatal("the reader is not on shared memory")
	}
	ctx := testCtx(t)
	sizes := []int{1, 100, 0, 5000, 40000, c.MaxMessage(), 3}
	var want []byte
	for i := 0; i < 60; i++ {
		m := make([]byte, sizes[i%len(sizes)])
		for j := range m {
			m[j] = byte(len(want) + j*7)
		}
		want = append(want, m...)
	}
	go func() {
		off := 0
		for i := 0; i < 60; i++ {
			n := sizes[i%len(sizes)]
			if err := c.SendMsg(ctx, want[off:off+n]); err != nil {
				t.Error(err)
				return
			}
			off += n
		}
		_ = c.Close()
	}()
	var got []byte
	bufs := []int{1, 7, 4096, 40000, c.MaxMessage() + 100}
	for i := 0; ; i++ {
		buf := make([]byte, bufs[i%len(bufs)])
		n, err := s.Read(buf)
		got = append(got, buf[:n]...)
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			t.Fatalf("read %d: %v", i, err)
		}
		if n == 0 {
			t.Fatalf("read %d returned 0 bytes without error", i)
		}
	}
	if !bytes.Equal(got, want) {
		t.Fatalf("read %d bytes, want %d, equal: %v", len(got), len(want), bytes.Equal(got, want))
	}
}

// TestSharedMemoryAgentStops: an agent stopped while its engine sends
// from a pod's TX ring in place (the peer does not read, so sends wait)
// shuts down cleanly: the engine gives up the ring's memory as it closes,
// and the agent unmaps it only after its own goroutines are done with it
// (a fault here is the process's end); the pod's sends end with an error.
func TestSharedMemoryAgentStops(t *testing.T) {
	cl := cluster(t, agenttest.Options{})
	a := shmClient(t, cl.Nodes[0], "a", 4, true)
	b := shmClient(t, cl.Nodes[1], "b", 4, true)
	c, _ := shmPair(t, a, b, cl.Nodes[1].Name)
	ctx := testCtx(t)
	sent := make(chan error, 1)
	go func() {
		for {
			if err := c.SendMsg(ctx, make([]byte, 30000)); err != nil {
				sent <- err
				return
			}
		}
	}()
	eng := cl.Nodes[0].Agent.Engine()
	waitUntil(t, func() bool { return eng.Stats().SentInPlace >= 20 }, "sends in place under way")
	if err := cl.Nodes[0].Stop(); err != nil {
		t.Fatalf("stopping the agent: %v", err)
	}
	select {
	case err := <-sent:
		t.Logf("the pod's send after its agent stopped: %v", err)
	case <-time.After(20 * time.Second):
		t.Fatal("the pod's sends went on 20 s after its agent stopped")
	}
}

// TestSharedMemoryCopiesPastRegisteredLimit: where the node's registered
// memory (limits.registeredBytes) has no room for a TX ring's slab, the
// vconn still runs on shared memory, its messages copied out of the ring
// instead of sent in place, every byte intact.
func TestSharedMemoryCopiesPastRegisteredLimit(t *testing.T) {
	cl := cluster(t, agenttest.Options{TuneConfig: func(c *config.AgentConfig) { c.Limits.RegisteredBytes = 100 << 10 }})
	a := shmClient(t, cl.Nodes[0], "a", 4, true)
	b := shmClient(t, cl.Nodes[1], "b", 4, true)
	c, s := shmPair(t, a, b, cl.Nodes[1].Name)
	ctx := testCtx(t)
	for i := 0; i < 50; i++ {
		m := bytes.Repeat([]byte{byte(i)}, 1000*i)
		if err := c.SendMsgImm(ctx, m, uint32(i)); err != nil {
			t.Fatal(err)
		}
		got, err := s.RecvMsg(ctx)
		if err != nil || !bytes.Equal(got.Data, m) || got.Imm != uint32(i) {
			t.Fatalf("message %d: %d bytes, imm %d, %v", i, len(got.Data), got.Imm, err)
		}
	}
	if n := cl.Nodes[0].Agent.Engine().Stats().SentInPlace; n != 0 {
		t.Fatalf("%d messages sent in place with no registered memory for the slab, want 0", n)
	}
}

// TestRecvMsgFunc: on shared memory the message fn sees is the receive
// ring's memory itself (no copy in the pod: the agent's copy into the
// ring is the message's only one from the wire), whole and in order, its
// room given back after fn (more messages than the ring holds pass); fn's
// error is returned; on the socket, fn sees what RecvMsg would return.
func TestRecvMsgFunc(t *testing.T) {
	for _, on := range []bool{true, false} {
		t.Run(map[bool]string{true: "shm", false: "socket"}[on], func(t *testing.T) {
			cl := cluster(t, agenttest.Options{})
			a := shmClient(t, cl.Nodes[0], "a", 4, true)
			b := shmClient(t, cl.Nodes[1], "b", 4, on)
			c, s := shmPair(t, a, b, cl.Nodes[1].Name)
			ctx := testCtx(t)
			const rounds = 400 // 400 × 20,000 bytes: many times the ring's slab
			go func() {
				for i := 0; i < rounds; i++ {
					if err := c.SendMsgImm(ctx, bytes.Repeat([]byte{byte(i)}, 20000), uint32(i)); err != nil {
						t.Error(err)
						return
					}
				}
			}()
			mem := s.SharedMemory()
			for i := 0; i < rounds; i++ {
				err := s.RecvMsgFunc(ctx, func(m vconn.Message) error {
					if !m.HasImm || m.Imm != uint32(i) || !bytes.Equal(m.Data, bytes.Repeat([]byte{byte(i)}, 20000)) {
						return fmt.Errorf("message %d: imm %v %d, %d bytes", i, m.HasImm, m.Imm, len(m.Data))
					}
					inRing := len(mem) > 0 && uintptr(unsafe.Pointer(&m.Data[0])) >= uintptr(unsafe.Pointer(&mem[0])) &&
						uintptr(unsafe.Pointer(&m.Data[0])) < uintptr(unsafe.Pointer(&mem[0]))+uintptr(len(mem))
					if inRing != on {
						return fmt.Errorf("message %d in the ring's memory: %v, want %v", i, inRing, on)
					}
					return nil
				})
				if err != nil {
					t.Fatal(err)
				}
			}
			if err := c.SendMsg(ctx, []byte("x")); err != nil {
				t.Fatal(err)
			}
			boom := errors.New("fn's own")
			if err := s.RecvMsgFunc(ctx, func(vconn.Message) error { return boom }); err != boom {
				t.Fatalf("fn's error: RecvMsgFunc returned %v", err)
			}
			_ = c.Close()
			if err := s.RecvMsgFunc(ctx, func(vconn.Message) error { return nil }); !errors.Is(err, io.EOF) {
				t.Fatalf("after the peer closed: %v, want io.EOF", err)
			}
		})
	}
}
