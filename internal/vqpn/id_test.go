package vqpn

import (
	"testing"
)

func TestIDLayout(t *testing.T) {
	tests := []struct {
		name    string
		v       VQPN
		g       Gen
		wantID  ID
		wantV   VQPN
		wantStr string
	}{
		{"zero", 0, 0, 0x00000000, 0, "0x000000/0"},
		{"first", 1, 1, 0x00000101, 1, "0x000001/1"},
		{"vQPN 0 keeps gen", 0, 7, 0x00000007, 0, "0x000000/7"},
		{"max vQPN", MaxVQPN, 255, 0xFFFFFFFF, MaxVQPN, "0xffffff/255"},
		{"max vQPN gen 0", MaxVQPN, 0, 0xFFFFFF00, MaxVQPN, "0xffffff/0"},
		{"mid", 0x123456, 0x78, 0x12345678, 0x123456, "0x123456/120"},
		{"high bits dropped", 0xAB123456, 0x78, 0x12345678, 0x123456, "0x123456/120"},
		{"1<<24 wraps to 0", 1 << 24, 9, 0x00000009, 0, "0x000000/9"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			id := MakeID(tt.v, tt.g)
			if id != tt.wantID {
				t.Fatalf("MakeID(%#x, %d) = %#x, want %#x", tt.v, tt.g, uint32(id), uint32(tt.wantID))
			}
			if id.VQPN() != tt.wantV || id.Gen() != tt.g {
				t.Errorf("split %#x = (%#x, %d), want (%#x, %d)", uint32(id), id.VQPN(), id.Gen(), tt.wantV, tt.g)
			}
			if got := id.String(); got != tt.wantStr {
				t.Errorf("String() = %q, want %q", got, tt.wantStr)
			}
			if imm := Imm(id); imm != uint32(tt.wantID) || FromImm(imm) != id {
				t.Errorf("Imm round trip: Imm = %#x, FromImm = %#x", imm, uint32(FromImm(imm)))
			}
			for _, slot := range []uint32{0, 1, 0xDEADBEEF, ^uint32(0)} {
				w := WRID(id, slot)
				if w != uint64(tt.wantID)<<32|uint64(slot) {
					t.Errorf("WRID(%v, %#x) = %#x", id, slot, w)
				}
				gid, gslot := SplitWRID(w)
				if gid != id || gslot != slot {
					t.Errorf("SplitWRID(%#x) = (%v, %#x), want (%v, %#x)", w, gid, gslot, id, slot)
				}
			}
		})
	}
}

func TestIDValid(t *testing.T) {
	tests := []struct {
		id   ID
		want bool
	}{
		{0, false},                    // zeroed imm or wr_id high half
		{MakeID(0, 1), false},         // vQPN 0 reserved
		{MakeID(0, 255), false},       // vQPN 0 reserved
		{MakeID(1, 0), false},         // gen 0 never issued
		{MakeID(MaxVQPN, 0), false},   // gen 0 never issued
		{MakeID(1, 1), true},          // first ID a table issues
		{MakeID(MaxVQPN, 255), true},  // all ones
		{MakeID(MaxVQPN, 1), true},    // max vQPN
		{MakeID(0x800000, 128), true}, // top vQPN bit
	}
	for _, tt := range tests {
		if got := tt.id.Valid(); got != tt.want {
			t.Errorf("%v.Valid() = %v, want %v", tt.id, got, tt.want)
		}
	}
	if VQPN(0).Valid() || !VQPN(1).Valid() || !MaxVQPN.Valid() || (MaxVQPN + 1).Valid() {
		t.Error("VQPN.Valid wrong at 0, 1, MaxVQPN or MaxVQPN+1")
	}
	// A wr_id with a zero high half (e.g. a bare slot number) is invalid.
	if id, _ := SplitWRID(0x00000000FFFFFFFF); id.Valid() {
		t.Errorf("wr_id with zero high half decoded to valid %v", id)
	}
}

// Every generation round-trips through imm_data and wr_id, at the edge vQPNs.
func TestAllGenerations(t *testing.T) {
	for _, v := range []VQPN{1, 2, 0x7FFFFF, 0x800000, MaxVQPN - 1, MaxVQPN} {
		for g := range 256 {
			id := MakeID(v, Gen(g))
			if id.VQPN() != v || id.Gen() != Gen(g) {
				t.Fatalf("MakeID(%#x, %d) split to (%#x, %d)", v, g, id.VQPN(), id.Gen())
			}
			if FromImm(Imm(id)) != id {
				t.Fatalf("imm round trip of %v", id)
			}
			if gid, slot := SplitWRID(WRID(id, uint32(g)*0x01010101)); gid != id || slot != uint32(g)*0x01010101 {
				t.Fatalf("wr_id round trip of %v", id)
			}
		}
	}
}

func TestGenNext(t *testing.T) {
	seen := make(map[Gen]bool)
	g := Gen(0) // a slot never allocated
	for i := range 255 {
		g = g.next()
		if g == 0 {
			t.Fatalf("step %d issued generation 0", i)
		}
		if seen[g] {
			t.Fatalf("step %d repeated generation %d before a full cycle", i, g)
		}
		seen[g] = true
	}
	if g != 255 || g.next() != 1 {
		t.Fatalf("after 255 steps gen = %d, next = %d; want 255, 1", g, g.next())
	}
}

func TestEncodeAllocs(t *testing.T) {
	var sink uint64
	n := testing.AllocsPerRun(1000, func() {
		id := MakeID(VQPN(sink)|1, Gen(sink))
		imm := Imm(id)
		w := WRID(FromImm(imm), uint32(sink))
		gid, slot := SplitWRID(w)
		sink += uint64(gid.VQPN()) + uint64(gid.Gen()) + uint64(slot)
	})
	if n != 0 {
		t.Errorf("encode/decode allocates %v per run, want 0", n)
	}
}

func FuzzSplitWRID(f *testing.F) {
	for _, w := range []uint64{
		0,
		1,
		0x00000000FFFFFFFF,
		0x0000010100000000,
		0xFFFFFF00FFFFFFFF,
		0xFFFFFFFFFFFFFFFF,
		0x12345678DEADBEEF,
		0x8000000080000000,
	} {
		f.Add(w)
	}
	f.Fuzz(func(t *testing.T, w uint64) {
		id, slot := SplitWRID(w)
		if got := WRID(id, slot); got != w {
			t.Fatalf("WRID(SplitWRID(%#x)) = %#x", w, got)
		}
		v, g := id.VQPN(), id.Gen()
		if v > MaxVQPN {
			t.Fatalf("vQPN %#x exceeds 24 bits", v)
		}
		if MakeID(v, g) != id {
			t.Fatalf("MakeID(%#x, %d) != %v", v, g, id)
		}
		if FromImm(Imm(id)) != id || FromImm(uint32(w>>32)) != id {
			t.Fatalf("imm round trip of %v", id)
		}
		if id.Valid() != (v != 0 && g != 0) {
			t.Fatalf("%v.Valid() = %v", id, id.Valid())
		}
		_ = id.String()
	})
}
