package wire

import (
	"bytes"
	"encoding/hex"
	"testing"
)

func TestHeaderRoundTrip(t *testing.T) {
	for _, h := range []Header{
		{Type: Data, Flags: FlagFirst | FlagLast | FlagImm, Credit: 40, Length: 5, Seq: 7, Imm: 0xdeadbeef},
		{Type: Data, Flags: FlagFirst, Credit: 1 << 31, Length: 1 << 20, Seq: ^uint32(0)},
		{Type: Data, Flags: 0},
		{Type: Credit, Flags: FlagFirst | FlagLast, Credit: 9, Arg: 3},
		{Type: Credit, Flags: FlagFirst | FlagLast | FlagGap, Credit: 9, Arg: 3, Length: 7},
		{Type: Credit, Flags: FlagFirst | FlagLast | FlagGap, Arg: ^uint32(0), Length: 2}, // across the wrap
		{Type: Export, Flags: FlagFirst | FlagLast, Arg: 12},
		{Type: Unexported, Flags: FlagFirst | FlagLast, Arg: 12},
	} {
		var b [HeaderLen]byte
		h.Put(b[:])
		var got Header
		if err := got.Parse(b[:]); err != nil || got != h {
			t.Errorf("%v: parsed as %v, %v", &h, &got, err)
		}
	}
}

// TestHeaderGolden pins the byte layout: a change here is a change of the
// protocol between engines, which two agents of different versions speak.
func TestHeaderGolden(t *testing.T) {
	for _, tc := range []struct {
		name string
		h    Header
		hex  string
	}{
		{"data with imm", Header{Type: Data, Flags: FlagFirst | FlagLast | FlagImm, Credit: 0x28, Length: 5, Seq: 7, Imm: 0xdeadbeef, Arg: 3},
			"01070000000000280000000500000007deadbeef00000003"},
		{"grant with gap", Header{Type: Credit, Flags: FlagFirst | FlagLast | FlagGap, Credit: 1, Length: 12, Arg: 10},
			"020b0000000000010000000c00000000000000000000000a"},
		{"bundle", BundleHeader(3, 4, 100), "080300000000000000000064000000030000000400000000"},
	} {
		var b [HeaderLen]byte
		tc.h.Put(b[:])
		if got := hex.EncodeToString(b[:]); got != tc.hex {
			t.Errorf("%s: %s, want %s", tc.name, got, tc.hex)
		}
	}
}

func TestHeaderRejects(t *testing.T) {
	valid := func() []byte {
		var b [HeaderLen]byte
		(&Header{Type: Fin, Flags: FlagFirst | FlagLast}).Put(b[:])
		return b[:]
	}
	gap := func(b []byte) []byte {
		(&Header{Type: Credit, Flags: FlagFirst | FlagLast | FlagGap, Arg: 10, Length: 12}).Put(b)
		return b
	}
	for name, mutate := range map[string]func([]byte) []byte{
		"gap on data":           func(b []byte) []byte { b = gap(b); b[0] = byte(Data); return b },
		"gap on a FIN":          func(b []byte) []byte { b = gap(b); b[0] = byte(Fin); return b },
		"empty gap":             func(b []byte) []byte { b = gap(b); b[11] = 10; return b },
		"gap ending before":     func(b []byte) []byte { b = gap(b); b[11] = 3; return b },
		"short":                 func(b []byte) []byte { return b[:HeaderLen-1] },
		"type 0":                func(b []byte) []byte { b[0] = 0; return b },
		"unknown type":          func(b []byte) []byte { b[0] = 99; return b },
		"unknown flag":          func(b []byte) []byte { b[1] |= 0x80; return b },
		"reserved set":          func(b []byte) []byte { b[2] = 1; return b },
		"chunked control":       func(b []byte) []byte { b[1] = FlagFirst; return b },
		"control without flags": func(b []byte) []byte { b[1] = 0; return b },
		"bundle with imm":       func(b []byte) []byte { b[0] = byte(Bundle); b[1] |= FlagImm; return b },
	} {
		var h Header
		if err := h.Parse(mutate(valid())); err == nil {
			t.Errorf("%s: accepted", name)
		}
	}
}

// FuzzHeader: Parse never panics, and what it accepts re-encodes to the
// same bytes and reads the same through Raw.
func FuzzHeader(f *testing.F) {
	for _, h := range []Header{
		{Type: Data, Flags: FlagFirst | FlagLast, Length: 3},
		{Type: Credit, Flags: FlagFirst | FlagLast, Credit: 5},
		{Type: Credit, Flags: FlagFirst | FlagLast | FlagGap, Arg: 4, Length: 9},
		{Type: Reset, Flags: FlagFirst | FlagLast},
		BundleHeader(7, 2, 60),
	} {
		var b [HeaderLen]byte
		h.Put(b[:])
		f.Add(b[:])
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		var h Header
		if h.Parse(b) != nil {
			return
		}
		var out [HeaderLen]byte
		h.Put(out[:])
		if !bytes.Equal(out[:], b[:HeaderLen]) {
			t.Fatalf("re-encoded %x as %x", b[:HeaderLen], out)
		}
		r := Raw(b)
		if r.Type() != h.Type || r.Whole() != h.Whole() || r.Last() != h.Last() || r.Length() != h.Length ||
			r.Seq() != h.Seq || r.Count() != h.Count() || r.Ack() != h.Ack() {
			t.Fatalf("Raw reads %x otherwise than Parse: %v", b[:HeaderLen], &h)
		}
	})
}

// The in-place accessors read and write the fields Parse and Put do.
func TestRaw(t *testing.T) {
	var b [HeaderLen]byte
	h := DataHeader(5, 77, 9, true)
	h.SetChunk(true, true)
	h.Arg = 41
	h.Put(b[:])
	r := Raw(b[:])
	if r.Type() != Data || !r.Whole() || !r.Last() || r.Seq() != 77 || r.Ack() != 41 || r.Length() != 5 {
		t.Fatalf("raw %v: type %d whole %v last %v seq %d ack %d", &h, r.Type(), r.Whole(), r.Last(), r.Seq(), r.Ack())
	}
	r.SetCredit(1000)
	r.SetAck(42)
	var got Header
	if err := got.Parse(b[:]); err != nil || got.Credit != 1000 || got.Ack() != 42 {
		t.Fatalf("after SetCredit/SetAck: %v, %v (ack %d)", &got, err, got.Ack())
	}
	if imm, ok := got.AppImm(); !ok || imm != 9 {
		t.Fatalf("immediate %d, %v", imm, ok)
	}

	g := ControlHeader(Credit)
	g.Arg = 10
	g.Put(b[:])
	Raw(b[:]).SetGap(12)
	if err := got.Parse(b[:]); err != nil {
		t.Fatal(err)
	}
	if end, ok := got.Gap(); !ok || end != 12 || got.Ack() != 10 {
		t.Fatalf("gap: end %d, %v, ack %d", end, ok, got.Ack())
	}

	bh := BundleHeader(3, 4, 100)
	bh.Put(b[:])
	if err := got.Parse(b[:]); err != nil || got.Count() != 4 || Raw(b[:]).Count() != 4 || got.Seq != 3 || got.Length != 100 {
		t.Fatalf("bundle: %v, %v", &got, err)
	}
	eh := RegionHeader(Export, 12)
	eh.Put(b[:])
	if err := got.Parse(b[:]); err != nil || got.Region() != 12 {
		t.Fatalf("export: %v, %v", &got, err)
	}
}

// SetChunk marks first, middle and last chunks, and keeps the immediate.
func TestSetChunk(t *testing.T) {
	for _, tc := range []struct{ first, last, whole bool }{{true, false, false}, {false, false, false}, {false, true, false}, {true, true, true}} {
		h := DataHeader(10, 1, 2, true)
		h.SetChunk(true, true)
		h.SetChunk(tc.first, tc.last)
		if h.First() != tc.first || h.Last() != tc.last || h.Whole() != tc.whole || h.Flags&FlagImm == 0 {
			t.Errorf("SetChunk(%v, %v): flags %#x", tc.first, tc.last, h.Flags)
		}
	}
}
