package engine

import (
	"bytes"
	"context"
	"errors"
	"testing"
	"time"

	"github.com/rdmavisor/rdmavisor/internal/engine/format"
	"github.com/rdmavisor/rdmavisor/internal/verbs"
)

// awaitExport waits for the export message the engine sends the hostile
// node and returns the region it advertises.
func (h *hostile) awaitExport() remoteRegion {
	h.t.Helper()
	wcs := make([]verbs.WC, 16)
	deadline := time.Now().Add(5 * time.Second)
	for time.Now().Before(deadline) {
		for _, wc := range wcs[:h.cq.Poll(wcs)] {
			if wc.Opcode&verbs.WCRecv == 0 || wc.Status != verbs.WCSuccess {
				continue
			}
			off := 1<<19 + int(wc.WRID)*2048
			b := h.mr.Bytes()[off : off+int(wc.ByteLen)]
			var hd format.Header
			if err := hd.Parse(b); err != nil || hd.Type != format.Export {
				continue
			}
			p := b[format.HeaderLen:]
			ad, err := format.ParseAd(p)
			if err != nil {
				h.t.Fatal(err)
			}
			return ad
		}
		time.Sleep(100 * time.Microsecond)
	}
	h.t.Fatal("no export arrived")
	return remoteRegion{}
}

// rdma posts one RDMA WRITE (or READ) of n bytes at the hostile's buffer
// start on qp and returns its completion status.
func (h *hostile) rdma(qp verbs.QP, op verbs.WROpcode, addr uint64, rkey uint32, n int) verbs.WCStatus {
	h.t.Helper()
	wr := verbs.SendWR{WRID: 77, Opcode: op, Flags: verbs.SendSignaled, NumSGE: 1, RemoteAddr: addr, RKey: rkey,
		SG: [verbs.MaxSGE]verbs.SGE{{Addr: h.mr.Addr(), Length: uint32(n), LKey: h.mr.LKey()}}}
	return h.post(qp, wr, 10*time.Second)
}

// TestExportScopedToQP: a region is exported through a memory window bound
// on the one QP its peer vconn's requests arrive on, zero-based. The peer
// reaches it there; the same key on another QP of the same node, the
// region's real address, and the MR's own key are all refused by the
// device, whatever a hostile peer does with what it learned.
func TestExportScopedToQP(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	a, h, vc, in0, in1 := twoQPPeer(ctx, t, "10.9.0.69")
	if !a.windows {
		t.Fatal("the soft provider has no memory windows")
	}
	r, err := vc.Export(ctx, 4096, AccessRead|AccessWrite, nil)
	if err != nil {
		t.Fatal(err)
	}
	ad := h.awaitExport()
	if ad.Addr != 0 || ad.Length != 4096 || ad.RKey == r.mr.RKey() {
		t.Fatalf("export %+v: want a zero-based window of 4096 bytes with a key of its own (the MR's is %#x)", ad, r.mr.RKey())
	}
	copy(h.mr.Bytes(), "through the window")
	if st := h.rdma(in1, verbs.WRRDMAWrite, 100, ad.RKey, 18); st != verbs.WCSuccess {
		t.Fatalf("write through the window on its QP: %v", st)
	}
	got := make([]byte, 18)
	if _, err := r.ReadAt(got, 100); err != nil || !bytes.Equal(got, []byte("through the window")) {
		t.Fatalf("region holds %q (%v)", got, err)
	}
	// Each refusal fails the hostile's QP (and the engine's end of it),
	// so each uses one of its own.
	if st := h.rdma(in0, verbs.WRRDMAWrite, 100, ad.RKey, 18); st != verbs.WCRemAccessErr {
		t.Fatalf("the window's key on another QP of the peer: %v, want %v", st, verbs.WCRemAccessErr)
	}
	in2 := h.ingress(a, 2, 0) // replaces in0
	if st := h.rdma(in2, verbs.WRRDMARead, r.mr.Addr(), r.mr.RKey(), 18); st != verbs.WCRemAccessErr {
		t.Fatalf("the MR's own key at its address: %v, want %v", st, verbs.WCRemAccessErr)
	}
	if st := h.rdma(in1, verbs.WRRDMARead, r.mr.Addr(), ad.RKey, 18); st != verbs.WCRemAccessErr {
		t.Fatalf("the window's key at the region's address: %v, want %v", st, verbs.WCRemAccessErr)
	}
	if vc.Err() != nil {
		t.Fatalf("the vconn failed: %v", vc.Err())
	}
	if err := r.Close(); err != nil && !errors.Is(err, ErrClosed) {
		t.Logf("close: %v", err)
	}
}
