package soft

import (
	"net/netip"
	"testing"

	"github.com/rdmavisor/rdmavisor/internal/verbs"
	"github.com/rdmavisor/rdmavisor/internal/verbs/soft/wire"
	vt "github.com/rdmavisor/rdmavisor/internal/verbs/verbstest"
)

func mwDevices(t *testing.T) (verbs.Device, verbs.Device) {
	fb := wire.NewFabric(wire.Faults{})
	t.Cleanup(func() { _ = fb.Close() })
	var devs [2]verbs.Device
	for i := range devs {
		w, err := fb.Attach(verbs.GIDFromAddr(netip.AddrFrom4([4]byte{10, 3, 0, byte(1 + i)})))
		if err != nil {
			t.Fatal(err)
		}
		devs[i] = openOn(t, w, i)
	}
	return devs[0], devs[1]
}

// TestMWWindowBounds: the soft provider checks a request against the
// window, not only its region, as IBA (C10-75, o9-19) and mlx5 do: bytes
// of the region outside the window are refused. (The kernel's rxe checks
// the region only; the conformance suite tests windows that end with their
// region.)
func TestMWWindowBounds(t *testing.T) {
	da, db := mwDevices(t)
	for _, c := range []struct {
		name   string
		access verbs.Access
		raddr  func(mr verbs.MR) uint64
		op     verbs.WROpcode
	}{
		{"PastEnd", verbs.AccessRemoteWrite, func(mr verbs.MR) uint64 { return mr.Addr() + 1024 + 4096 - 10 }, verbs.WRRDMAWrite},
		{"BeforeStart", verbs.AccessRemoteWrite, func(mr verbs.MR) uint64 { return mr.Addr() + 1024 - 10 }, verbs.WRRDMAWrite},
		{"ZeroBasedPastEnd", verbs.AccessRemoteRead | verbs.AccessZeroBased, func(verbs.MR) uint64 { return 4096 - 10 }, verbs.WRRDMARead},
	} {
		t.Run(c.name, func(t *testing.T) {
			p := vt.NewPair(t, da, db, vt.PairConfig{})
			src := vt.RegMR(t, p.PDA, 8192, verbs.AccessLocalWrite)
			mr := vt.RegMR(t, p.PDB, 8192, verbs.AccessLocalWrite|verbs.AccessMWBind)
			mw := vt.AllocMW(t, p.PDB)
			key := vt.BindMW(t, p.B, p.CQB, mw, mr, 1024, 4096, c.access)
			if !isMWKey(key) || !isMWKey(mw.RKey()) || key>>8 != mw.Handle() {
				t.Fatalf("window key %#x (handle %#x) is not from the window table", key, mw.Handle())
			}
			vt.MustPostSend(t, p.A, vt.RDMAWR(1, c.op, c.raddr(mr), key, vt.SGE(src, 0, 100)))
			vt.CheckWCs(t, vt.WaitCQ(t, p.CQA, 1, 5e9), verbs.WC{WRID: 1, Status: verbs.WCRemAccessErr, QPN: p.A.QPN()})
		})
	}
}

// TestMWQPClose: closing the QP a window is bound on frees the window: its
// region can be deregistered and the window bound again on another QP.
func TestMWQPClose(t *testing.T) {
	da, db := mwDevices(t)
	p := vt.NewPair(t, da, db, vt.PairConfig{})
	mr := vt.RegMR(t, p.PDB, 8192, verbs.AccessLocalWrite|verbs.AccessMWBind)
	mw := vt.AllocMW(t, p.PDB)
	old := vt.BindMW(t, p.B, p.CQB, mw, mr, 0, 4096, verbs.AccessRemoteWrite)
	if err := p.B.Close(); err != nil {
		t.Fatal(err)
	}
	q := vt.CreateQP(t, p.PDB, verbs.QPInitAttr{Type: verbs.QPTypeRC, SendCQ: p.CQB, RecvCQ: p.CQB, Cap: vt.DefaultCap})
	a2 := vt.CreateQP(t, p.PDA, verbs.QPInitAttr{Type: verbs.QPTypeRC, SendCQ: p.CQA, RecvCQ: p.CQA, Cap: vt.DefaultCap})
	vt.Connect(t, a2, q, da, db, vt.ConnectOptions{})
	key := vt.BindMW(t, q, p.CQB, mw, mr, 0, 4096, verbs.AccessRemoteWrite)
	if key == old {
		t.Fatalf("rebind kept key %#x", key)
	}
	vt.InvalidateMW(t, q, p.CQB, key)
	if err := mr.Close(); err != nil {
		t.Fatalf("MR.Close after its window's QP closed and the window was invalidated: %v", err)
	}
}
