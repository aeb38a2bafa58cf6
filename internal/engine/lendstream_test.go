package engine

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"runtime"
	"sync"
	"testing"
	"time"

	"github.com/rdmavisor/rdmavisor/internal/transport"
	"github.com/rdmavisor/rdmavisor/internal/verbs/soft/wire"
)

// TestSendStagedStream is the agent's shared-memory sender (agent/shm.go)
// in small, on Auto over a lossy, reordering, duplicating fabric: 64 KiB
// messages sent in place from a 256 KiB slab that holds four, each slot
// reused once all its chunks came back (returned), with small copied
// messages (datagrams, bundled) between them, and a reader that lags.
// Every message must arrive once, in order, whole, and io.EOF only after
// the last: E6 once read EOF at message 684 of 1,024 such messages.
func TestSendStagedStream(t *testing.T) {
	a, b := testEngines(t, wire.Faults{Seed: 5, Loss: 0.01, Reorder: 0.02, Duplicate: 0.01}, Config{})
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	va, vb, err := Pair(ctx, a, b, VConnOptions{Transport: transport.Auto}, VConnOptions{Transport: transport.Auto})
	if err != nil {
		t.Fatal(err)
	}
	const size, slots, count = 64 << 10, 4, 600
	mem := mapShared(t, slots*size)
	// free holds the slots whose chunks all came back; out counts the
	// chunks of each slot not back yet.
	free := make(chan int, slots)
	for i := range slots {
		free <- i
	}
	var mu sync.Mutex
	out := make([]int, slots)
	st, err := va.StageSends(mem, func(slot uint32) {
		mu.Lock()
		out[slot]--
		done := out[slot] == 0
		mu.Unlock()
		if done {
			free <- int(slot)
		}
	}, func() {})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = st.Close() })

	got := make(chan error, 1)
	go func() { got <- readStream(ctx, vb, count) }()
	small := make([]byte, 100)
	for i := range count {
		var slot int
		select {
		case slot = <-free:
		case <-ctx.Done():
			t.Fatalf("message %d: no slot came back: %v", i, ctx.Err())
		}
		m := mem[slot*size : (slot+1)*size]
		binary.LittleEndian.PutUint64(m, uint64(2*i))
		for j := 8; j < len(m); j += 512 {
			m[j] = byte(i)
		}
		mu.Lock()
		out[slot] = va.Chunks(size)
		mu.Unlock()
		if _, err := va.SendStaged(ctx, st, slot*size, size, 0, false, uint32(slot)); err != nil {
			t.Fatalf("message %d: %v", 2*i, err)
		}
		binary.LittleEndian.PutUint64(small, uint64(2*i+1))
		if err := va.Send(ctx, small); err != nil {
			t.Fatalf("message %d: %v", 2*i+1, err)
		}
	}
	if err := va.CloseWrite(); err != nil {
		t.Fatal(err)
	}
	if err := <-got; err != nil {
		t.Fatal(err)
	}
}

// readStream reads 2*count messages numbered in order, the even ones 64
// KiB stamped with their half number every 512 bytes, slowly, then wants
// io.EOF.
func readStream(ctx context.Context, vb *VConn, count int) error {
	for i := range 2 * count {
		m, err := vb.Recv(ctx)
		if err != nil {
			return fmt.Errorf("message %d of %d: %w", i, 2*count, err)
		}
		n := binary.LittleEndian.Uint64(m.Data)
		ok := n == uint64(i)
		if i%2 == 0 {
			ok = ok && len(m.Data) == 64<<10
			for j := 8; ok && j < len(m.Data); j += 512 {
				ok = m.Data[j] == byte(i/2)
			}
		}
		m.Release()
		if !ok {
			return fmt.Errorf("message %d of %d: %d bytes numbered %d, or its bytes differ", i, 2*count, len(m.Data), n)
		}
		if i%32 == 0 {
			time.Sleep(200 * time.Microsecond) // the sender runs ahead, on credits
		}
		runtime.Gosched()
	}
	if _, err := vb.Recv(ctx); !errors.Is(err, io.EOF) {
		return fmt.Errorf("after the last message: %v, want EOF", err)
	}
	return nil
}

// TestFinAfterGapFails: a FIN that comes while messages before it are
// missing (an Auto message lost, those after it held past the gap) ends
// the vconn with ErrLost, not with io.EOF after the messages before the
// gap: the application must not take a stream cut short for a whole
// one. Nothing the engine sends leaves such a gap (its FIN waits for its
// datagrams' acknowledgements, and goes behind its RC messages); the
// test makes one by skipping a sequence number at the sender.
func TestFinAfterGapFails(t *testing.T) {
	ctx, _, _, va, vb := testPair(t, wire.Faults{}, transport.Auto, 30*time.Second)
	big := make([]byte, 40_000) // chunked: over RC, as E6's 64 KiB messages
	send := func(i int) {
		binary.LittleEndian.PutUint64(big, uint64(i))
		if err := va.Send(ctx, big); err != nil {
			t.Fatalf("message %d: %v", i, err)
		}
	}
	send(0)
	m, err := vb.Recv(ctx)
	if err != nil {
		t.Fatal(err)
	}
	m.Release()
	va.snd.mu.Lock()
	va.snd.seq++ // message 1, lost
	va.snd.mu.Unlock()
	send(2)
	send(3)
	if err := va.CloseWrite(); err != nil {
		t.Fatal(err)
	}
	m, err = vb.Recv(ctx)
	if err == nil {
		m.Release()
		t.Fatalf("a message numbered %d came after the gap", binary.LittleEndian.Uint64(m.Data))
	}
	if !errors.Is(err, ErrLost) {
		t.Fatalf("Recv after the FIN past a gap: %v, want ErrLost", err)
	}
}
