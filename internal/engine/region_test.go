package engine

import (
	"bytes"
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/rdmavisor/rdmavisor/internal/verbs/soft/wire"
)

// stalledPair is a vconn pair with 4 credits whose vb has data in its
// ring that va, which does not read, holds back: va's unexport
// confirmations used to wait behind it for good.
func stalledPair(t *testing.T, cfg Config) (context.Context, *Engine, *Engine, *VConn, *VConn) {
	t.Helper()
	cfg.Credits = 4
	a, b := testEngines(t, wire.Faults{}, cfg)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	t.Cleanup(cancel)
	va, vb, err := Pair(ctx, a, b, VConnOptions{}, VConnOptions{})
	if err != nil {
		t.Fatal(err)
	}
	for i := range 6 {
		if err := vb.Send(ctx, []byte{byte(i)}); err != nil {
			t.Fatal(err)
		}
	}
	waitFor(t, func() bool { return vb.snd.len() > 0 && b.Stats().CreditStalls > 0 }, "vb to wait for credits")
	return ctx, a, b, va, vb
}

// exported waits until vb knows va's region id.
func exported(t *testing.T, vb *VConn, id uint32) {
	t.Helper()
	waitFor(t, func() bool {
		rg := vb.rg()
		rg.mu.Lock()
		defer rg.mu.Unlock()
		_, ok := rg.remote[id]
		return ok
	}, "the export to reach the peer")
}

// TestUnexportConfirmedPastStalledData: the peer confirms an unexport
// though its send ring holds data this side's reader holds back, so the
// memory is deregistered a round trip after Close; released runs then,
// once.
func TestUnexportConfirmedPastStalledData(t *testing.T) {
	ctx, a, _, va, vb := stalledPair(t, Config{})
	var released atomic.Int32
	r, err := va.Export(ctx, 64<<10, AccessRead|AccessWrite, func() { released.Add(1) })
	if err != nil {
		t.Fatal(err)
	}
	exported(t, vb, r.ID())
	if got := a.Stats().RegisteredBytes; got != 64<<10 {
		t.Fatalf("registered %d bytes, want %d", got, 64<<10)
	}
	if err := r.Close(); err != nil {
		t.Fatal(err)
	}
	waitFor(t, func() bool { return a.Stats().RegisteredBytes == 0 }, "the region deregistered while vb's data waits")
	if n := released.Load(); n != 1 {
		t.Fatalf("released ran %d times, want 1", n)
	}
	if vb.snd.len() == 0 {
		t.Fatal("vb's data went: the test did not stall it")
	}
	if va.Err() != nil || vb.Err() != nil {
		t.Fatalf("vconns failed: %v, %v", va.Err(), vb.Err())
	}
}

// TestUnexportWaitsForQueuedOps: a one-sided operation the peer queued
// before the unexport arrived, behind data the peer's credits hold, is
// still posted before the confirmation: the memory stays registered (and
// the window valid) until the operation ran, which succeeds.
func TestUnexportWaitsForQueuedOps(t *testing.T) {
	ctx, a, _, va, vb := stalledPair(t, Config{})
	const size = 64 << 10
	r, err := va.Export(ctx, size, AccessRead|AccessWrite, nil)
	if err != nil {
		t.Fatal(err)
	}
	want := bytes.Repeat([]byte("region!"), size/7)
	if _, err := r.WriteAt(want, 0); err != nil {
		t.Fatal(err)
	}
	exported(t, vb, r.ID())
	got := make([]byte, len(want))
	read := make(chan error, 1)
	go func() { read <- vb.Read(ctx, r.ID(), 0, got) }()
	waitFor(t, func() bool {
		rg := vb.rg()
		rg.mu.Lock()
		defer rg.mu.Unlock()
		return rg.marks == 1
	}, "vb's read queued")
	if err := r.Close(); err != nil {
		t.Fatal(err)
	}
	time.Sleep(200 * time.Millisecond)
	if reg := a.Stats().RegisteredBytes; reg != size {
		t.Fatalf("%d bytes registered while the peer's read waits, want %d", reg, size)
	}
	select {
	case err := <-read:
		t.Fatalf("the read ran behind stalled data: %v", err)
	default:
	}
	// va reads: vb's data, then its read, then the confirmation, go.
	for range 6 {
		m, err := va.Recv(ctx)
		if err != nil {
			t.Fatal(err)
		}
		m.Release()
	}
	if err := <-read; err != nil || !bytes.Equal(got, want) {
		t.Fatalf("the read queued before the unexport: %v (bytes equal: %v)", err, bytes.Equal(got, want))
	}
	waitFor(t, func() bool { return a.Stats().RegisteredBytes == 0 }, "the region deregistered after the read")
	if va.Err() != nil || vb.Err() != nil {
		t.Fatalf("vconns failed: %v, %v", va.Err(), vb.Err())
	}
}

// TestMaxRegisteredBytes: exports past Config.MaxRegisteredBytes, over
// all vconns, fail with ErrRegisteredLimit and release what they were
// given at once; a withdrawn region counts until deregistered.
func TestMaxRegisteredBytes(t *testing.T) {
	const limit = 3 * 4096
	a, b := testEngines(t, wire.Faults{}, Config{MaxRegisteredBytes: limit})
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	va, _, err := Pair(ctx, a, b, VConnOptions{}, VConnOptions{})
	if err != nil {
		t.Fatal(err)
	}
	wa, _, err := Pair(ctx, a, b, VConnOptions{}, VConnOptions{})
	if err != nil {
		t.Fatal(err)
	}
	var released atomic.Int32
	count := func() { released.Add(1) }
	r1, err := va.Export(ctx, 2*4096, AccessRead, count)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := wa.Export(ctx, 4096, AccessRead, count); err != nil {
		t.Fatal(err)
	}
	_, err = wa.Export(ctx, 1, AccessRead, count)
	if !errors.Is(err, ErrRegisteredLimit) {
		t.Fatalf("an export past MaxRegisteredBytes: %v, want ErrRegisteredLimit", err)
	}
	if n := released.Load(); n != 1 {
		t.Fatalf("released ran %d times after the refusal, want 1 (the refused export's)", n)
	}
	if err := r1.Close(); err != nil {
		t.Fatal(err)
	}
	waitFor(t, func() bool {
		r, err := wa.Export(ctx, 2*4096, AccessRead, count)
		if err != nil && !errors.Is(err, ErrRegisteredLimit) {
			t.Fatal(err)
		}
		return r != nil
	}, "an export once the withdrawn region is deregistered")
	if got := a.Stats().RegisteredBytes; got != limit {
		t.Fatalf("registered %d bytes, want %d", got, limit)
	}
}
