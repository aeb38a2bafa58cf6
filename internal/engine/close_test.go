package engine

import (
	"context"
	"errors"
	"io"
	"testing"
	"time"

	"github.com/rdmavisor/rdmavisor/internal/transport"
	softwire "github.com/rdmavisor/rdmavisor/internal/verbs/soft/wire"
)

// closePair opens a vconn pair of transport tr whose receive window is 4
// credits, so a sender's queue soon outgrows what its peer granted.
func closePair(t *testing.T, tr transport.Kind, closeTimeout time.Duration) (context.Context, *Engine, *Engine, *VConn, *VConn) {
	t.Helper()
	a, b := testEngines(t, softwire.Faults{}, Config{Credits: 4, CloseTimeout: closeTimeout})
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	t.Cleanup(cancel)
	va, vb, err := Pair(ctx, a, b, VConnOptions{Transport: tr}, VConnOptions{Transport: tr})
	if err != nil {
		t.Fatal(err)
	}
	return ctx, a, b, va, vb
}

// TestCloseResetsLateSender: B closes without reading while A has queued
// five times B's window. What A sends after B's close reaches no reader,
// so B answers it with a RST, as TCP does: A learns its data was lost
// (ErrReset, not a Send that waits for grants that never come), and both
// vconns are released, no receive buffer held.
func TestCloseResetsLateSender(t *testing.T) {
	for _, tr := range []transport.Kind{transport.RC, transport.Auto} {
		t.Run(tr.String(), func(t *testing.T) {
			ctx, a, b, va, vb := closePair(t, tr, time.Minute)
			for range 20 {
				if err := va.Send(ctx, make([]byte, 100)); err != nil {
					t.Fatal(err)
				}
			}
			if err := vb.Close(); err != nil {
				t.Fatal(err)
			}
			var err error
			for err == nil {
				err = va.Send(ctx, make([]byte, 100))
			}
			if !errors.Is(err, ErrReset) {
				t.Fatalf("A's send after B closed: %v, want ErrReset", err)
			}
			_ = va.Close()
			waitFor(t, func() bool { return a.Stats().VConns == 0 && b.Stats().VConns == 0 }, "vconns released")
			if h := b.Stats().RecvBuffersHeld; h != 0 {
				t.Errorf("B holds %d receive buffers", h)
			}
		})
	}
}

// TestCloseAbortsWhenPeerStopsReading: A closes with messages queued
// behind a window its peer's application never reads. Its FIN cannot go;
// after CloseTimeout with no grant A's vconn is reset and released (it
// would otherwise hold its vQPN for good), and B reads what it received,
// then ErrReset: the rest was lost, and B is told so.
func TestCloseAbortsWhenPeerStopsReading(t *testing.T) {
	ctx, a, _, va, vb := closePair(t, transport.RC, 200*time.Millisecond)
	for range 20 {
		if err := va.Send(ctx, make([]byte, 100)); err != nil {
			t.Fatal(err)
		}
	}
	start := time.Now()
	if err := va.Close(); err != nil {
		t.Fatal(err)
	}
	waitFor(t, func() bool { return a.Stats().VConns == 0 }, "A's vconn released")
	if d := time.Since(start); d < 200*time.Millisecond {
		t.Errorf("A's vconn released %v after Close, before CloseTimeout", d)
	}
	n := 0
	for {
		m, err := vb.Recv(ctx)
		if err != nil {
			if !errors.Is(err, ErrReset) {
				t.Fatalf("B's receive after %d messages: %v, want ErrReset", n, err)
			}
			break
		}
		m.Release()
		n++
	}
	if n == 0 || n >= 20 {
		t.Errorf("B read %d of 20 messages before the reset, want some and not all", n)
	}
	_ = vb.Close()
}

// TestCloseWaitsForSlowReader: a closed vconn whose peer reads slowly but
// keeps granting is not reset: every grant restarts CloseTimeout, so all
// of its messages arrive, in order, and then the peer's EOF, though they
// take longer than CloseTimeout in all.
func TestCloseWaitsForSlowReader(t *testing.T) {
	const n, timeout = 12, time.Second
	ctx, a, b, va, vb := closePair(t, transport.RC, timeout)
	for i := range n {
		if err := va.Send(ctx, []byte{byte(i)}); err != nil {
			t.Fatal(err)
		}
	}
	start := time.Now()
	if err := va.Close(); err != nil {
		t.Fatal(err)
	}
	for i := range n {
		time.Sleep(150 * time.Millisecond)
		m, err := vb.Recv(ctx)
		if err != nil {
			t.Fatalf("message %d: %v", i, err)
		}
		if len(m.Data) != 1 || m.Data[0] != byte(i) {
			t.Fatalf("message %d: %v", i, m.Data)
		}
		m.Release()
	}
	if d := time.Since(start); d < timeout {
		t.Fatalf("read in %v, within CloseTimeout: the test shows nothing", d)
	}
	if _, err := vb.Recv(ctx); !errors.Is(err, io.EOF) {
		t.Fatalf("B's receive after the last message: %v, want EOF", err)
	}
	_ = vb.Close()
	waitFor(t, func() bool { return a.Stats().VConns == 0 && b.Stats().VConns == 0 }, "vconns released")
}
