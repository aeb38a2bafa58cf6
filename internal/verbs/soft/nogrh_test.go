package soft

import (
	"errors"
	"net/netip"
	"strings"
	"testing"

	"github.com/rdmavisor/rdmavisor/internal/verbs"
	"github.com/rdmavisor/rdmavisor/internal/verbs/soft/wire"
)

// TestRoCEOnly: the soft device is a RoCE port (link layer Ethernet, no
// LID) and refuses InfiniBand's LID-routed vectors, in an address handle
// and in a QP's path, saying why.
func TestRoCEOnly(t *testing.T) {
	fb := wire.NewFabric(wire.Faults{})
	t.Cleanup(func() { _ = fb.Close() })
	g := verbs.GIDFromAddr(netip.MustParseAddr("10.1.0.9"))
	w, err := fb.Attach(g)
	if err != nil {
		t.Fatal(err)
	}
	d, err := Open(Config{Wire: w})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = d.Close() })
	if a := d.Attr(); a.LinkLayer != verbs.LinkLayerEthernet || a.LID != 0 {
		t.Fatalf("link layer %v, LID %#x; want Ethernet, none", a.LinkLayer, a.LID)
	}
	pd, err := d.AllocPD()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = pd.Close() })
	ib := verbs.AHAttr{NoGRH: true, DLID: 5, PortNum: 1}
	if _, err := pd.CreateAH(&ib); !errors.Is(err, verbs.ErrInvalid) || !strings.Contains(err.Error(), "RoCE") {
		t.Errorf("CreateAH without a GRH: %v; want ErrInvalid naming RoCE", err)
	}
	cq, err := d.CreateCQ(16)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cq.Close() })
	qp, err := pd.CreateQP(&verbs.QPInitAttr{Type: verbs.QPTypeRC, SendCQ: cq, RecvCQ: cq, Cap: verbs.QPCap{MaxSendWR: 4, MaxRecvWR: 4, MaxSendSGE: 1, MaxRecvSGE: 1}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = qp.Close() })
	err = verbs.ConnectQP(qp, verbs.Remote{GID: g, QPN: qp.QPN(), LID: 5}, verbs.PathOptions{LinkLayer: verbs.LinkLayerInfiniBand})
	if !errors.Is(err, verbs.ErrInvalid) || !strings.Contains(err.Error(), "RoCE") {
		t.Errorf("an InfiniBand path on the soft device: %v; want ErrInvalid naming RoCE", err)
	}
}
