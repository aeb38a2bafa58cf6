package engine

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/rdmavisor/rdmavisor/internal/transport"
	"github.com/rdmavisor/rdmavisor/internal/verbs"
	"github.com/rdmavisor/rdmavisor/internal/verbs/soft/wire"
)

// returns counts StageSends' returned calls per token.
type returns struct {
	mu sync.Mutex
	n  map[uint32]int
}

func (r *returns) returned(token uint32) {
	r.mu.Lock()
	r.n[token]++
	r.mu.Unlock()
}

func (r *returns) count(token uint32) int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.n[token]
}

func (r *returns) total() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	k := 0
	for _, n := range r.n {
		k += n
	}
	return k
}

// TestSendStaged: on every transport, messages sent from staging memory
// in place (one byte, small, 3 KiB, several chunks) arrive byte for byte,
// with their immediates; each chunk's token comes back exactly once, and
// only after its message arrived; on RC no chunk-sized send buffer is
// ever taken (the payload is not copied into one, as Send's is, which the
// same check catches); staging memory that does not belong to the vconn,
// or spans outside it, is refused; Close releases it once all is back.
func TestSendStaged(t *testing.T) {
	for _, tr := range []transport.Kind{transport.RC, transport.UC, transport.UD, transport.Auto} {
		t.Run(tr.String(), func(t *testing.T) {
			a, b := testEngines(t, wire.Faults{}, Config{})
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			va, vb, err := Pair(ctx, a, b, VConnOptions{Transport: tr}, VConnOptions{Transport: tr})
			if err != nil {
				t.Fatal(err)
			}
			mem := mapShared(t, 256<<10)
			for i := range mem {
				mem[i] = byte(i*13 + i>>8)
			}
			r := &returns{n: map[uint32]int{}}
			var released atomic.Int32
			st, err := va.StageSends(mem, r.returned, func() { released.Add(1) })
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { _ = st.Close() })
			chunkClass := &a.pool.classes[a.pool.class(a.cfg.ChunkSize)]
			chunksFree := func() int { chunkClass.mu.Lock(); defer chunkClass.mu.Unlock(); return chunkClass.lowest }
			before := chunksFree()
			at := 0
			for i, n := range []int{1, 64, 3000, 40_000} {
				n = min(n, va.MaxMessage())
				k, err := va.SendStaged(ctx, st, at, n, uint32(100+i), i%2 == 0, uint32(i))
				if err != nil || k != va.Chunks(n) {
					t.Fatalf("SendStaged of %d bytes: %d chunks, %v; want %d", n, k, err, va.Chunks(n))
				}
				m, err := vb.Recv(ctx)
				if err != nil {
					t.Fatal(err)
				}
				if !bytes.Equal(m.Data, mem[at:at+n]) {
					t.Fatalf("message %d: %d bytes arrived, not the %d staged", i, len(m.Data), n)
				}
				if m.HasImm != (i%2 == 0) || m.HasImm && m.Imm != uint32(100+i) {
					t.Fatalf("message %d: immediate %v %d", i, m.HasImm, m.Imm)
				}
				m.Release()
				waitFor(t, func() bool { return r.count(uint32(i)) >= va.Chunks(n) }, fmt.Sprintf("message %d's chunks back", i))
				at += n + 7
			}
			if tr == transport.RC && chunksFree() != before {
				t.Errorf("chunk-sized send buffers dipped to %d free from %d: a staged payload was copied", chunksFree(), before)
			}
			if _, err := vb.SendStaged(ctx, st, 0, 10, 0, false, 9); !errors.Is(err, verbs.ErrInvalid) {
				t.Errorf("another vconn's staging: %v, want ErrInvalid", err)
			}
			if _, err := va.SendStaged(ctx, st, len(mem)-10, 11, 0, false, 9); !errors.Is(err, verbs.ErrInvalid) {
				t.Errorf("a span past the staging memory: %v, want ErrInvalid", err)
			}
			if err := va.Send(ctx, mem[:min(40_000, va.MaxMessage())]); err != nil {
				t.Fatal(err)
			}
			if m, err := vb.Recv(ctx); err != nil {
				t.Fatal(err)
			} else {
				m.Release()
			}
			if tr == transport.RC && chunksFree() == before {
				t.Error("Send's copy took no chunk-sized buffer: the check above proves nothing")
			}
			_ = st.Close()
			waitFor(t, func() bool { return released.Load() == 1 }, "the staging released")
			for i := range 4 {
				if got, want := r.count(uint32(i)), va.Chunks(min([]int{1, 64, 3000, 40_000}[i], va.MaxMessage())); got != want {
					t.Errorf("token %d returned %d times, want %d (one per chunk)", i, got, want)
				}
			}
		})
	}
}

// TestSendStagedDropped: staged messages queued behind a peer that does
// not read, then dropped by Abort, all come back (once per chunk queued),
// and the staging memory is released after Close; no send buffer stays
// taken.
func TestSendStagedDropped(t *testing.T) {
	for _, tr := range []transport.Kind{transport.RC, transport.Auto} {
		t.Run(tr.String(), func(t *testing.T) {
			a, b := testEngines(t, wire.Faults{}, Config{})
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			inUse := a.pool.inUse()
			va, _, err := Pair(ctx, a, b, VConnOptions{Transport: tr}, VConnOptions{Transport: tr})
			if err != nil {
				t.Fatal(err)
			}
			mem := mapShared(t, 256<<10)
			r := &returns{n: map[uint32]int{}}
			var released atomic.Int32
			st, err := va.StageSends(mem, r.returned, func() { released.Add(1) })
			if err != nil {
				t.Fatal(err)
			}
			var queued atomic.Int64
			done := make(chan error, 1)
			go func() {
				for i := 0; ; i++ {
					k, err := va.SendStaged(ctx, st, (i%8)*20_000, 20_000, 0, false, uint32(i))
					queued.Add(int64(k))
					if err != nil {
						done <- err
						return
					}
				}
			}()
			// The peer never reads: its credits run out, the ring fills.
			waitFor(t, func() bool { return queued.Load() >= 20 }, "staged sends queued")
			time.Sleep(50 * time.Millisecond)
			va.Abort()
			if err := <-done; err == nil {
				t.Fatal("SendStaged on an aborted vconn returned no error")
			}
			waitFor(t, func() bool { return int64(r.total()) == queued.Load() }, fmt.Sprintf("all %d queued chunks back", queued.Load()))
			_ = st.Close()
			waitFor(t, func() bool { return released.Load() == 1 }, "the staging released")
			waitFor(t, func() bool { return fmt.Sprint(a.pool.inUse()) == fmt.Sprint(inUse) }, "send buffers back")
			if got := int64(r.total()); got != queued.Load() {
				t.Errorf("%d chunks returned, %d queued", got, queued.Load())
			}
		})
	}
}

// TestSendStagedEngineClose: an engine closed while staged sends wait
// behind a peer that does not read (no completion will give them back)
// deregisters their staging memory itself, released once: the PD closes
// (testEngines' cleanup fails the test otherwise).
func TestSendStagedEngineClose(t *testing.T) {
	a, b := testEngines(t, wire.Faults{}, Config{})
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	va, _, err := Pair(ctx, a, b, VConnOptions{}, VConnOptions{})
	if err != nil {
		t.Fatal(err)
	}
	var released atomic.Int32
	st, err := va.StageSends(mapShared(t, 256<<10), func(uint32) {}, func() { released.Add(1) })
	if err != nil {
		t.Fatal(err)
	}
	var queued atomic.Int64
	go func() {
		for i := 0; ; i++ {
			k, err := va.SendStaged(ctx, st, (i%8)*20_000, 20_000, 0, false, uint32(i))
			queued.Add(int64(k))
			if err != nil {
				return
			}
		}
	}()
	waitFor(t, func() bool { return queued.Load() >= 20 }, "staged sends queued")
	if err := a.Close(); err != nil {
		t.Fatalf("closing the engine with staged sends queued: %v", err)
	}
	if n := released.Load(); n != 1 {
		t.Fatalf("staging released %d times by the engine's close, want 1", n)
	}
	if _, err := va.StageSends(mapShared(t, 4096), func(uint32) {}, nil); err == nil {
		t.Fatal("StageSends on a closed engine succeeded")
	}
}
