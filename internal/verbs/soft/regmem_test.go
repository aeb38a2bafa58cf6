package soft

import (
	"errors"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/rdmavisor/rdmavisor/internal/verbs"
	"github.com/rdmavisor/rdmavisor/internal/verbs/soft/wire"
)

// TestRegMRMemNoAccess: memory mapped with no access is refused even for a
// read-only registration (ErrFault), where a NIC's pinning may take it
// (rxe does): this device reads and writes registered memory itself, and
// would fault on it. Memory readable but not writable still registers
// for reads (the conformance case RegMRMem).
func TestRegMRMemNoAccess(t *testing.T) {
	fb := wire.NewFabric(wire.Faults{})
	defer fb.Close()
	p := newRCPair(t, fb, verbs.MTU1024)
	pd, err := p.da.AllocPD()
	if err != nil {
		t.Fatal(err)
	}
	defer pd.Close()
	page := unix.Getpagesize()
	mem, err := verbs.AllocMemory(3 * page)
	if err != nil {
		t.Fatal(err)
	}
	defer verbs.FreeMemory(mem)
	if err := unix.Mprotect(mem[page:2*page], unix.PROT_NONE); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name   string
		b      []byte
		access verbs.Access
	}{
		{"across it, remote read", mem, verbs.AccessRemoteRead},
		{"one byte of it, no access asked", mem[page+1 : page+2], 0},
	} {
		mr, err := pd.RegMRMem(tc.b, tc.access)
		if err == nil {
			_ = mr.Close()
		}
		if !errors.Is(err, verbs.ErrFault) {
			t.Errorf("RegMRMem of a page with no access, %s: %v, want ErrFault", tc.name, err)
		}
	}
	mr, err := pd.RegMRMem(mem[:page], verbs.AccessRemoteRead)
	if err != nil {
		t.Fatalf("RegMRMem of the readable page before it: %v", err)
	}
	_ = mr.Close()
}
