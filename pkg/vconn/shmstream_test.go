package vconn_test

import (
	"context"
	"encoding/binary"
	"fmt"
	"io"
	"runtime"
	"sync"
	"testing"
	"time"

	"github.com/rdmavisor/rdmavisor/internal/agent/agenttest"
	"github.com/rdmavisor/rdmavisor/pkg/vconn"
)

// TestSharedMemoryStreamWhole is E6's stream of 64 KiB messages (test/ladder,
// ladderproto.Stream) on shared memory at both ends, between agents on
// transport auto as the ladder's: the messages are sent in place from the
// dialer's TX ring, and the listener reads slowly, with goroutines
// burning the CPUs beside it, so that the listener's engine holds
// hundreds of them. Once E6's busy phase read EOF at message 684 of 1,024
// while the client waited for the count. Every message must come, in
// order, and EOF only after the last, on each of several streams in a row
// on the same vconn, with 4 KiB ones (copied, bundled) between them.
func TestSharedMemoryStreamWhole(t *testing.T) {
	cl := cluster(t, agenttest.Options{Transport: "auto"})
	a := shmClient(t, cl.Nodes[0], "a", 4, true)
	b := shmClient(t, cl.Nodes[1], "b", 4, true)
	c, s := shmPair(t, a, b, cl.Nodes[1].Name)
	if !c.OnSharedMemory() || !s.OnSharedMemory() {
		t.Fatalf("on shared memory: dialer %v, listener %v", c.OnSharedMemory(), s.OnSharedMemory())
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	burn(t, ctx, 1)

	type stream struct{ size, count int }
	var streams []stream
	for range 2 {
		streams = append(streams, stream{4 << 10, 1024}, stream{64 << 10, 1024})
	}
	served := make(chan error, 1)
	go func() { served <- sink(ctx, s, len(streams)) }()
	for i, st := range streams {
		if err := streamTo(ctx, c, st.size, st.count); err != nil {
			t.Fatalf("stream %d (%d messages of %d bytes): %v", i, st.count, st.size, err)
		}
	}
	if err := c.Close(); err != nil {
		t.Fatal(err)
	}
	if err := <-served; err != nil {
		t.Fatal(err)
	}
}

// streamTo sends count numbered messages of size bytes after a header
// saying so, then reads the sink's count of those it got in order.
func streamTo(ctx context.Context, c *vconn.Conn, size, count int) error {
	h := make([]byte, 16)
	binary.LittleEndian.PutUint64(h, uint64(size))
	binary.LittleEndian.PutUint64(h[8:], uint64(count))
	if err := c.SendMsg(ctx, h); err != nil {
		return err
	}
	m := make([]byte, size)
	for i := range count {
		binary.LittleEndian.PutUint64(m, uint64(i))
		if err := c.SendMsg(ctx, m); err != nil {
			return fmt.Errorf("message %d: %w", i, err)
		}
	}
	r, err := c.RecvMsg(ctx)
	if err != nil {
		return fmt.Errorf("the sink's count: %w", err)
	}
	if got := binary.LittleEndian.Uint64(r.Data); got != uint64(count) {
		return fmt.Errorf("the sink counted %d messages, want %d", got, count)
	}
	return nil
}

// sink reads n streams (streamTo), each message checked for its size and
// number, slowly (a yield a message, a sleep every 64) so that the
// sender runs ahead on credits, and answers each with its count; then
// EOF, and only then.
func sink(ctx context.Context, s *vconn.Conn, n int) error {
	for k := range n {
		h, err := s.RecvMsg(ctx)
		if err != nil {
			return fmt.Errorf("stream %d's header: %w", k, err)
		}
		size, count := binary.LittleEndian.Uint64(h.Data), binary.LittleEndian.Uint64(h.Data[8:])
		for i := range count {
			m, err := s.RecvMsg(ctx)
			if err != nil {
				return fmt.Errorf("stream %d, message %d of %d: %w", k, i, count, err)
			}
			if len(m.Data) != int(size) || binary.LittleEndian.Uint64(m.Data) != i {
				return fmt.Errorf("stream %d, message %d of %d: %d bytes numbered %d", k, i, count, len(m.Data), binary.LittleEndian.Uint64(m.Data))
			}
			runtime.Gosched()
			if i%64 == 63 {
				time.Sleep(time.Millisecond)
			}
		}
		a := make([]byte, 16)
		binary.LittleEndian.PutUint64(a, count)
		if err := s.SendMsg(ctx, a); err != nil {
			return err
		}
	}
	if _, err := s.RecvMsg(ctx); err != io.EOF {
		return fmt.Errorf("after the last stream: %v, want EOF", err)
	}
	return nil
}

// burn runs n goroutines spinning until the test ends: E6's busy phase
// ran two CPU-bound processes beside the agents (here one goroutine: more
// made the test take minutes).
func burn(t *testing.T, ctx context.Context, n int) {
	var wg sync.WaitGroup
	stop := make(chan struct{})
	for range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			x := 0
			for {
				select {
				case <-stop:
					return
				case <-ctx.Done():
					return
				default:
				}
				for i := range 100000 {
					x += i
				}
			}
		}()
	}
	t.Cleanup(func() { close(stop); wg.Wait() })
}
