package verbstest

import (
	"errors"
	"os"
	"slices"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/rdmavisor/rdmavisor/internal/verbs"
)

// testRegMRMem: memory the caller mapped, registered with RegMRMem at an
// unaligned address, is the MR's (Bytes, Addr): a peer's RDMA WRITE lands
// in it and its RDMA READ reads what the caller wrote there, and nothing
// outside it is touched. Deregistering leaves it mapped and the caller's.
// Refused as ibv_reg_mr refuses: empty memory and remote write without
// local write (ErrInvalid); a read-only page for an access that writes,
// and a page with no access for any (ErrFault, EFAULT). Read-only memory
// registers for remote reads.
func testRegMRMem(t *testing.T, f Factory) {
	devs := openDevices(t, f, 2, Options{})
	p := NewPair(t, devs[0], devs[1], PairConfig{})
	page := os.Getpagesize()
	mem := mapMemory(t, 4*page)
	Fill(mem, 0xD5)
	before := slices.Clone(mem)
	lo, hi := 100, 100+2*page+7
	sub := mem[lo:hi]
	mr := RegMRMem(t, p.PDB, sub, remote)
	src := RegMR(t, p.PDA, 4*page, local)

	Fill(src.Bytes()[:len(sub)], 41)
	MustPostSend(t, p.A, RDMAWR(1, verbs.WRRDMAWrite, mr.Addr(), mr.RKey(), SGE(src, 0, len(sub))))
	CheckWCs(t, WaitCQ(t, p.CQA, 1, waitDone), verbs.WC{WRID: 1, Opcode: verbs.WCRDMAWrite, QPN: p.A.QPN()})
	expectBytes(t, "the caller's memory after the peer's write", sub, Pattern(len(sub), 41))
	expectBytes(t, "before the registered memory", mem[:lo], before[:lo])
	expectBytes(t, "after the registered memory", mem[hi:], before[hi:])

	Fill(sub, 42) // the caller writes its own memory; the peer reads it
	MustPostSend(t, p.A, RDMAWR(2, verbs.WRRDMARead, mr.Addr()+1, mr.RKey(), SGE(src, page, len(sub)-1)))
	CheckWCs(t, WaitCQ(t, p.CQA, 1, waitDone), verbs.WC{WRID: 2, Opcode: verbs.WCRDMARead, QPN: p.A.QPN()})
	expectBytes(t, "the peer's read of the caller's memory", src.Bytes()[page:page+len(sub)-1], Pattern(len(sub), 42)[1:])

	if err := mr.Close(); err != nil {
		t.Fatalf("close the MR: %v", err)
	}
	Fill(sub, 43) // still mapped, still writable: no fault
	expectBytes(t, "the caller's memory after deregistration", sub, Pattern(len(sub), 43))

	refuse := func(what string, b []byte, access verbs.Access, target error) {
		t.Helper()
		mr, err := p.PDB.RegMRMem(b, access)
		if err == nil {
			_ = mr.Close()
		}
		if !errors.Is(err, target) {
			t.Errorf("RegMRMem of %s: %v, want an error matching %q", what, err, target)
		}
	}
	refuse("nil", nil, local, verbs.ErrInvalid)
	refuse("no bytes", mem[:0], local, verbs.ErrInvalid)
	refuse("memory for remote write without local write", mem[:page], verbs.AccessRemoteWrite, verbs.ErrInvalid)

	if err := unix.Mprotect(mem[page:2*page], unix.PROT_READ); err != nil {
		t.Fatal(err)
	}
	for _, a := range []verbs.Access{local, remote, verbs.AccessMWBind} {
		refuse("a read-only page for an access that writes", mem[10:3*page], a, verbs.ErrFault)
	}
	ro := RegMRMem(t, p.PDB, mem[page:2*page], verbs.AccessRemoteRead)
	MustPostSend(t, p.A, RDMAWR(3, verbs.WRRDMARead, ro.Addr(), ro.RKey(), SGE(src, 0, 64)))
	CheckWCs(t, WaitCQ(t, p.CQA, 1, waitDone), verbs.WC{WRID: 3, Opcode: verbs.WCRDMARead, QPN: p.A.QPN()})
	expectBytes(t, "the peer's read of read-only memory", src.Bytes()[:64], mem[page:page+64])

	// Memory with no access at all is not a case here: rxe (ib_umem_get)
	// pins it for a read-only registration, as the kernel may read it; the
	// soft device, which reads memory itself, refuses it
	// (soft.TestRegMRMemNoAccess).
	ExpectIdle(t, p.CQB, waitIdle)
}

// mapMemory maps n bytes read-write outside the Go heap, unmapped at the
// end of the test (after what the test registered in them is closed,
// which was registered later).
func mapMemory(t testing.TB, n int) []byte {
	t.Helper()
	mem, err := verbs.AllocMemory(n)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := verbs.FreeMemory(mem); err != nil {
			t.Errorf("unmap: %v", err)
		}
	})
	return mem
}

// RegMRMem registers mem with access, closed at the end of the test, and
// checks that the MR's Bytes and Addr are mem's.
func RegMRMem(t testing.TB, pd verbs.PD, mem []byte, access verbs.Access) verbs.MR {
	t.Helper()
	mr, err := pd.RegMRMem(mem, access)
	if err != nil {
		t.Fatalf("RegMRMem(%d bytes at %#x, %#x): %v", len(mem), verbs.AddrOf(mem), uint32(access), err)
	}
	closeLater(t, "MR", mr)
	if b := mr.Bytes(); len(b) != len(mem) || verbs.AddrOf(b) != verbs.AddrOf(mem) || mr.Addr() != verbs.AddrOf(mem) {
		t.Fatalf("MR: %d bytes at %#x, Addr %#x; want mem's %d bytes at %#x", len(b), verbs.AddrOf(b), mr.Addr(), len(mem), verbs.AddrOf(mem))
	}
	return mr
}
