package engine

import (
	"bytes"
	"context"
	"errors"
	"io"
	"slices"
	"testing"
	"time"

	"github.com/rdmavisor/rdmavisor/internal/engine/format"
	"github.com/rdmavisor/rdmavisor/internal/verbs/soft/wire"
)

// TestSendFrom: the bytes a read puts in the send buffer arrive as one
// message of one chunk, FillSize at most; a read of nothing sends nothing
// and gives its buffer back; a closed sending side refuses before reading.
func TestSendFrom(t *testing.T) {
	a, b := testEngines(t, wire.Faults{}, Config{})
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	va, vb, err := Pair(ctx, a, b, VConnOptions{}, VConnOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if got, want := va.FillSize(), a.cfg.ChunkSize-format.HeaderLen; got != want {
		t.Fatalf("FillSize %d: want a chunk less its header, %d", got, want)
	}
	src := bytes.Repeat([]byte("abcdefgh"), 8<<10) // more than a chunk
	inUse := a.pool.inUse()
	n, err := va.SendFrom(ctx, va.FillSize(), func(b []byte) (int, error) {
		if len(b) != va.FillSize() {
			t.Errorf("read offered %d bytes, want FillSize %d", len(b), va.FillSize())
		}
		return copy(b, src), nil
	})
	if err != nil || n != va.FillSize() {
		t.Fatalf("SendFrom: %d, %v; want %d", n, err, va.FillSize())
	}
	m, err := vb.Recv(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(m.Data, src[:n]) {
		t.Fatalf("received %d bytes, differing from the %d read", len(m.Data), n)
	}
	if m.slot == noSlot {
		t.Error("the message was reassembled: want it in its receive buffer, one chunk")
	}
	m.Release()

	if n, err := va.SendFrom(ctx, FillSmall, func(b []byte) (int, error) {
		if len(b) != FillSmall {
			t.Errorf("read offered %d bytes for FillSmall, want %d", len(b), FillSmall)
		}
		return copy(b, "short"), nil
	}); n != 5 || err != nil {
		t.Fatalf("SendFrom of a short read: %d, %v", n, err)
	}
	if m, err := vb.Recv(ctx); err != nil || string(m.Data) != "short" {
		t.Fatalf("the short read arrived as %q, %v", m.Data, err)
	} else {
		m.Release()
	}

	for _, c := range []struct {
		err  error
		want error
	}{{nil, io.ErrNoProgress}, {io.EOF, io.EOF}} {
		if n, err := va.SendFrom(ctx, va.FillSize(), func([]byte) (int, error) { return 0, c.err }); n != 0 || !errors.Is(err, c.want) {
			t.Errorf("a read of nothing (%v): %d, %v; want 0, %v", c.err, n, err, c.want)
		}
	}
	deadline := time.Now().Add(5 * time.Second)
	for !slices.Equal(a.pool.inUse(), inUse) {
		if time.Now().After(deadline) {
			t.Fatalf("buffers in use %v, %v before: a read of nothing kept its buffer", a.pool.inUse(), inUse)
		}
		time.Sleep(time.Millisecond)
	}
	if err := va.CloseWrite(); err != nil {
		t.Fatal(err)
	}
	read := false
	if _, err := va.SendFrom(ctx, va.FillSize(), func([]byte) (int, error) { read = true; return 1, nil }); !errors.Is(err, ErrClosed) || read {
		t.Errorf("after CloseWrite: %v, read called %v; want ErrClosed and no read", err, read)
	}
}
