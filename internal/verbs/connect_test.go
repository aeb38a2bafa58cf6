package verbs

import (
	"errors"
	"net/netip"
	"strings"
	"testing"
)

// TestAddressVector: RoCE (and an unspecified link layer) gets a GRH to
// the peer's GID, as before InfiniBand was supported; InfiniBand gets a
// path within the subnet: no GRH, the peer's LID, the SL and path bits
// asked, and a refusal of a LID no unicast port has.
func TestAddressVector(t *testing.T) {
	g := GIDFromAddr(netip.MustParseAddr("10.0.0.2"))
	r := Remote{GID: g, LID: 0x1a}
	for _, ll := range []LinkLayer{LinkLayerEthernet, LinkLayerUnspecified} {
		av, err := AddressVector(ll, r, 3, 0)
		if err != nil || av != (AHAttr{DGID: g, PortNum: 1, HopLimit: 64, SL: 3}) {
			t.Errorf("%v: %+v, %v; want a GRH to %v", ll, av, err, g)
		}
	}
	av, err := AddressVector(LinkLayerInfiniBand, r, 5, 1)
	if err != nil || av != (AHAttr{NoGRH: true, DLID: 0x1a, SL: 5, SrcPathBits: 1, PortNum: 1}) {
		t.Errorf("InfiniBand: %+v, %v; want DLID 0x1a without a GRH", av, err)
	}
	for _, bad := range []struct {
		lid     uint16
		sl, bit uint8
		why     string
	}{
		{0, 0, 0, "not a unicast LID"},
		{0xc000, 0, 0, "not a unicast LID"},
		{0xffff, 0, 0, "not a unicast LID"},
		{1, 16, 0, "service level 16"},
		{1, 0, 0x80, "source path bits"},
	} {
		_, err := AddressVector(LinkLayerInfiniBand, Remote{GID: g, LID: bad.lid}, bad.sl, bad.bit)
		if !errors.Is(err, ErrInvalid) || !strings.Contains(err.Error(), bad.why) {
			t.Errorf("LID %#x SL %d bits %#x: %v; want ErrInvalid, %q", bad.lid, bad.sl, bad.bit, err, bad.why)
		}
	}
	if _, err := AddressVector(LinkLayerInfiniBand, Remote{GID: g, LID: MaxUnicastLID}, 15, 0x7f); err != nil {
		t.Errorf("the highest unicast LID, SL 15, path bits 0x7f: %v", err)
	}
}

// recordQP is a QP that keeps what Modify was given.
type recordQP struct {
	QP
	typ   QPType
	attrs []QPAttr
}

func (q *recordQP) Type() QPType { return q.typ }
func (q *recordQP) QPN() uint32  { return 7 }
func (q *recordQP) Modify(a *QPAttr, mask QPAttrMask) error {
	if err := CheckQPAttr(a, mask); err != nil {
		return err
	}
	q.attrs = append(q.attrs, *a)
	return nil
}

// TestConnectQPInfiniBand: ConnectQP's RTR path follows the link layer in
// PathOptions, and refuses an InfiniBand peer without a LID before any
// transition.
func TestConnectQPInfiniBand(t *testing.T) {
	g := GIDFromAddr(netip.MustParseAddr("10.0.0.2"))
	q := &recordQP{typ: QPTypeRC}
	if err := ConnectQP(q, Remote{GID: g, QPN: 9, LID: 0x33}, PathOptions{LinkLayer: LinkLayerInfiniBand, SL: 2}); err != nil {
		t.Fatal(err)
	}
	if len(q.attrs) != 3 || q.attrs[1].AH != (AHAttr{NoGRH: true, DLID: 0x33, SL: 2, PortNum: 1}) {
		t.Fatalf("transitions %+v: want RTR with DLID 0x33, no GRH", q.attrs)
	}
	q = &recordQP{typ: QPTypeUC}
	if err := ConnectQP(q, Remote{GID: g, QPN: 9}, PathOptions{}); err != nil || q.attrs[1].AH.NoGRH || q.attrs[1].AH.DGID != g {
		t.Fatalf("RoCE: %v, %+v; want a GRH to %v", err, q.attrs, g)
	}
	q = &recordQP{typ: QPTypeRC}
	err := ConnectQP(q, Remote{GID: g, QPN: 9}, PathOptions{LinkLayer: LinkLayerInfiniBand})
	if !errors.Is(err, ErrInvalid) || !strings.Contains(err.Error(), "subnet manager") || len(q.attrs) != 0 {
		t.Fatalf("a peer without a LID: %v after %d transitions; want ErrInvalid before any", err, len(q.attrs))
	}
}
