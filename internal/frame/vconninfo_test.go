package frame

import (
	"testing"

	"github.com/rdmavisor/rdmavisor/internal/transport"
)

// TestVConnInfo pins the wire encoding: transport.Kind's numbers are the
// protocol's, so renumbering the kinds fails here.
func TestVConnInfo(t *testing.T) {
	for _, tc := range []struct {
		v        VConnInfo
		arg2     uint64
		name     string
		reliable bool
	}{
		{VConnInfo{}, 0, "", true}, // an agent that does not say
		{VConnInfo{transport.RC, 65536}, 0x1_0001_0000, "rc", true},
		{VConnInfo{transport.UC, 16360}, 0x2_0000_3fe8, "uc", false},
		{VConnInfo{transport.UD, 4072}, 0x3_0000_0fe8, "ud", false},
		{VConnInfo{transport.Auto, 0xffffffff}, 0x4_ffff_ffff, "auto", true},
	} {
		if got := tc.v.Arg2(); got != tc.arg2 {
			t.Errorf("%+v: arg2 %#x, want %#x", tc.v, got, tc.arg2)
		}
		if got := VConnInfoOf(tc.arg2); got != tc.v {
			t.Errorf("VConnInfoOf(%#x) = %+v, want %+v", tc.arg2, got, tc.v)
		}
		if s := tc.v.Transport.String(); s != tc.name {
			t.Errorf("%d: String %q, want %q", tc.v.Transport, s, tc.name)
		}
		if r := tc.v.Transport.Reliable(); r != tc.reliable {
			t.Errorf("%v: Reliable %v, want %v", tc.v.Transport, r, tc.reliable)
		}
	}
	if tr := transport.Kind(9); tr.String() != "Transport(9)" || tr.Reliable() {
		t.Errorf("an unknown transport: %q, reliable %v", tr, tr.Reliable())
	}
}
