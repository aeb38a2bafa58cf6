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

// TestExportMem: a region over the caller's memory is that memory: what
// the caller writes there the peer reads with RDMA READ, what the peer
// writes with RDMA WRITE the caller reads there, byte for byte. Closed,
// it is deregistered (released runs once, the bytes stop counting) and
// left mapped, the caller's to unmap. Memory the device cannot register
// (read-only, for a writable region) fails the export, with released run
// and nothing counted.
func TestExportMem(t *testing.T) {
	a, b := testEngines(t, wire.Faults{}, Config{})
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	va, vb, err := Pair(ctx, a, b, VConnOptions{}, VConnOptions{})
	if err != nil {
		t.Fatal(err)
	}
	const size = 64<<10 + 3
	mem, err := unix.Mmap(-1, 0, size, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED|unix.MAP_ANON)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Munmap(mem)
	var released atomic.Int32
	r, err := va.ExportMem(ctx, mem, AccessRead|AccessWrite, func() { released.Add(1) })
	if err != nil {
		t.Fatal(err)
	}
	if verbs.AddrOf(r.Bytes()) != verbs.AddrOf(mem) || r.Len() != size {
		t.Fatalf("the region is %d bytes at %#x, not the caller's %d at %#x", r.Len(), verbs.AddrOf(r.Bytes()), size, verbs.AddrOf(mem))
	}
	exported(t, vb, r.ID())
	if got := a.Stats().RegisteredBytes; got != size {
		t.Fatalf("registered %d bytes, want %d", got, size)
	}
	pat := func(n int, seed byte) []byte {
		p := make([]byte, n)
		for i := range p {
			p[i] = seed + byte(i*7)
		}
		return p
	}
	copy(mem, pat(size, 1))
	got := make([]byte, size)
	if err := vb.Read(ctx, r.ID(), 0, got); err != nil || !bytes.Equal(got, mem) {
		t.Fatalf("the peer's read of what the caller wrote: %v (equal: %v)", err, bytes.Equal(got, mem))
	}
	if err := vb.Write(ctx, r.ID(), 5, pat(size-5, 2)); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(mem[5:], pat(size-5, 2)) || !bytes.Equal(mem[:5], pat(5, 1)) {
		t.Fatal("the caller's memory does not hold what the peer wrote, or more was written")
	}
	if err := r.Close(); err != nil {
		t.Fatal(err)
	}
	waitFor(t, func() bool { return a.Stats().RegisteredBytes == 0 }, "the region deregistered")
	if n := released.Load(); n != 1 {
		t.Fatalf("released ran %d times, want 1", n)
	}
	copy(mem, "still mapped") // the caller's until it unmaps it
	if _, err := r.ReadAt(got[:1], 0); !errors.Is(err, ErrNoRegion) {
		t.Errorf("ReadAt after the deregistration: %v, want ErrNoRegion", err)
	}

	if err := unix.Mprotect(mem, unix.PROT_READ); err != nil {
		t.Fatal(err)
	}
	released.Store(0)
	if _, err := va.ExportMem(ctx, mem, AccessRead, func() { released.Add(1) }); !errors.Is(err, verbs.ErrFault) {
		t.Errorf("export of read-only memory: %v, want ErrFault", err)
	}
	if n, reg := released.Load(), a.Stats().RegisteredBytes; n != 1 || reg != 0 {
		t.Errorf("after a failed export: released ran %d times, %d bytes registered; want 1 and 0", n, reg)
	}
	if va.Err() != nil || vb.Err() != nil {
		t.Fatalf("vconns failed: %v, %v", va.Err(), vb.Err())
	}
}
