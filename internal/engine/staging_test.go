package engine

import (
	"bytes"
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/rdmavisor/rdmavisor/internal/verbs"
	"github.com/rdmavisor/rdmavisor/internal/verbs/soft/wire"
)

func mapShared(t *testing.T, n int) []byte {
	t.Helper()
	mem, err := unix.Mmap(-1, 0, n, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED|unix.MAP_ANON)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = unix.Munmap(mem) })
	return mem
}

// TestStaging: RDMA WRITE from staging memory lands in the peer's region
// byte for byte, RDMA READ into it brings the region's bytes, each in one
// work request whatever its size; ranges outside the staging memory, or
// another vconn's staging, are refused; Close deregisters it (released
// once, the bytes no longer counted) and later operations fail.
func TestStaging(t *testing.T) {
	a, b := testEngines(t, wire.Faults{}, Config{})
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	va, vb, err := Pair(ctx, a, b, VConnOptions{}, VConnOptions{})
	if err != nil {
		t.Fatal(err)
	}
	const size = 200_000
	r, err := vb.Export(ctx, size, AccessRead|AccessWrite, nil)
	if err != nil {
		t.Fatal(err)
	}
	exported(t, va, r.ID())
	mem := mapShared(t, 256<<10)
	var released atomic.Int32
	st, err := va.Stage(mem, func() { released.Add(1) })
	if err != nil {
		t.Fatal(err)
	}
	if got := a.Stats().RegisteredBytes; got != 256<<10 {
		t.Fatalf("registered %d bytes, want the staging's %d", got, 256<<10)
	}
	for i := range mem {
		mem[i] = byte(i*7 + i>>9)
	}
	posts := a.Stats().WRsPosted
	if err := va.WriteFrom(ctx, r.ID(), 3, st, 5, size-3); err != nil {
		t.Fatal(err)
	}
	if n := a.Stats().WRsPosted - posts; n != 1 {
		t.Errorf("a write of %d bytes from staging memory posted %d work requests, want 1", size-3, n)
	}
	if got := r.Bytes()[3:]; !bytes.Equal(got, mem[5:5+size-3]) {
		t.Fatal("the peer's region does not hold what staging memory had")
	}
	for i := range r.Bytes() {
		r.Bytes()[i] = byte(i ^ 0x5a)
	}
	if err := va.ReadInto(ctx, r.ID(), 10, st, 1000, size-10); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(mem[1000:1000+size-10], r.Bytes()[10:]) {
		t.Fatal("staging memory does not hold what the peer's region had")
	}
	for _, x := range []struct{ at, n int }{{-1, 1}, {0, 256<<10 + 1}, {256 << 10, 1}} {
		if err := va.WriteFrom(ctx, r.ID(), 0, st, x.at, x.n); !errors.Is(err, verbs.ErrInvalid) {
			t.Errorf("WriteFrom of %d bytes at %d: %v, want ErrInvalid", x.n, x.at, err)
		}
	}
	if err := va.WriteFrom(ctx, r.ID(), size-1, st, 0, 2); !errors.Is(err, ErrRegionAccess) {
		t.Errorf("WriteFrom past the region: %v, want ErrRegionAccess", err)
	}
	if err := vb.ReadInto(ctx, r.ID(), 0, st, 0, 1); !errors.Is(err, verbs.ErrInvalid) {
		t.Errorf("another vconn's staging memory: %v, want ErrInvalid", err)
	}
	if err := st.Close(); err != nil {
		t.Fatal(err)
	}
	if n, reg := released.Load(), a.Stats().RegisteredBytes; n != 1 || reg != 0 {
		t.Fatalf("after Close: released ran %d times, %d bytes registered; want 1 and 0", n, reg)
	}
	if err := va.WriteFrom(ctx, r.ID(), 0, st, 0, 1); err == nil {
		t.Fatal("WriteFrom after Close succeeded")
	}
	if va.Err() != nil || vb.Err() != nil {
		t.Fatalf("vconns failed: %v, %v", va.Err(), vb.Err())
	}
}

// TestStagingLostWaitsForGrace: staging memory an abandoned operation may
// still reach stays registered after Close until its grace ends (here:
// the engine closing it early), never deregistered under a request in
// flight.
func TestStagingLostWaitsForGrace(t *testing.T) {
	a, b := testEngines(t, wire.Faults{}, Config{})
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	va, _, err := Pair(ctx, a, b, VConnOptions{}, VConnOptions{})
	if err != nil {
		t.Fatal(err)
	}
	var released atomic.Int32
	st, err := va.Stage(mapShared(t, 4096), func() { released.Add(1) })
	if err != nil {
		t.Fatal(err)
	}
	if err := st.acquire(); err != nil {
		t.Fatal(err)
	}
	st.done(true) // as rdmaStaged after abandonOp
	if err := st.Close(); err != nil {
		t.Fatal(err)
	}
	if n, reg := released.Load(), a.Stats().RegisteredBytes; n != 0 || reg != 4096 {
		t.Fatalf("closed with a request maybe in flight: released ran %d times, %d bytes registered; want 0 and 4096", n, reg)
	}
	a.releaseGraced()
	if n, reg := released.Load(), a.Stats().RegisteredBytes; n != 1 || reg != 0 {
		t.Fatalf("after the grace: released ran %d times, %d bytes registered; want 1 and 0", n, reg)
	}
}
