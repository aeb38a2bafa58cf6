package format

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
		{Type: Data, Flags: FlagFirst | FlagLast, Length: 1, Auth: 0x0123456789abcdef},
		{Type: Credit, Flags: FlagFirst | FlagLast, Auth: ^uint64(0)},
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
		{"data with imm", Header{Type: Data, Flags: FlagFirst | FlagLast | FlagImm, Credit: 0x28, Length: 5, Seq: 7, Imm: 0xdeadbeef, Arg: 3, Auth: 0x0102030405060708},
			"01070000000000280000000500000007deadbeef000000030102030405060708"},
		{"grant with gap", Header{Type: Credit, Flags: FlagFirst | FlagLast | FlagGap, Credit: 1, Length: 12, Arg: 10, Auth: 0xfedcba9876543210},
			"020b0000000000010000000c00000000000000000000000afedcba9876543210"},
		{"auto chunk sent on RC", Header{Type: Data, Flags: FlagFirst | FlagResent, Chunk: 0xbeef, Length: 5000, Seq: 9, Arg: 8},
			"0111beef00000000000013880000000900000000000000080000000000000000"},
		{"bundle", BundleHeader(3, 4, 100), "0803000000000000000000640000000300000004000000000000000000000000"},
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
		"numbered control":      func(b []byte) []byte { b[2] = 1; return b },
		"numbered grant":        func(b []byte) []byte { b[0] = byte(Credit); b[3] = 1; return b },
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
		{Type: Data, Flags: FlagFirst | FlagResent, Chunk: 300, Length: 9000, Arg: 2},
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
			r.Seq() != h.Seq || r.Count() != h.Count() || r.Ack() != h.Ack() || r.Auth() != h.Auth {
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
	r.SetAuth(0xa5a5_0000_ffff_1234)
	r.SetAutoChunkNo(0xfffe)
	var got Header
	if err := got.Parse(b[:]); err != nil || got.Credit != 1000 || got.Ack() != 42 || got.Auth != 0xa5a5_0000_ffff_1234 || r.Auth() != got.Auth || got.AutoChunkNo() != 0xfffe {
		t.Fatalf("after SetCredit/SetAck/SetAuth/SetAutoChunkNo: %v, %v (ack %d, auth %#x, chunk %d)", &got, err, got.Ack(), got.Auth, got.AutoChunkNo())
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

// Authentic accepts exactly the message that carries the secret it is
// given, and nothing for secret 0 (no pair's).
func TestAuthentic(t *testing.T) {
	const secret = 0x8badf00d_cafe0001
	msg := func(auth uint64) []byte {
		b := make([]byte, HeaderLen+3)
		(&Header{Type: Data, Flags: FlagFirst | FlagLast, Length: 3, Auth: auth}).Put(b)
		return b
	}
	for _, tc := range []struct {
		name   string
		b      []byte
		secret uint64
		want   bool
	}{
		{"its secret", msg(secret), secret, true},
		{"its secret, header alone", msg(secret)[:HeaderLen], secret, true},
		{"no secret", msg(0), secret, false},
		{"another pair's", msg(secret ^ 1<<63), secret, false},
		{"one bit off", msg(secret ^ 1), secret, false},
		{"short", msg(secret)[:HeaderLen-1], secret, false},
		{"empty", nil, secret, false},
		{"zero secret, zero auth", msg(0), 0, false},
	} {
		if got := Authentic(tc.b, tc.secret); got != tc.want {
			t.Errorf("%s: %v, want %v", tc.name, got, tc.want)
		}
	}
}

// FuzzAuthentic: Authentic never panics, and accepts a message exactly
// when it is a header's length or longer and its auth field, as Parse
// reads it, is the nonzero secret.
func FuzzAuthentic(f *testing.F) {
	for _, auth := range []uint64{0, 1, 0x8badf00d_cafe0001, ^uint64(0)} {
		b := make([]byte, HeaderLen)
		(&Header{Type: Data, Flags: FlagFirst | FlagLast, Auth: auth}).Put(b)
		f.Add(b, auth)
		f.Add(b, auth^1)
		f.Add(b[:HeaderLen-1], auth)
	}
	f.Fuzz(func(t *testing.T, b []byte, secret uint64) {
		got := Authentic(b, secret)
		want := false
		if len(b) >= HeaderLen && secret != 0 {
			want = Raw(b).Auth() == secret
			var h Header
			if h.Parse(b) == nil && h.Auth != Raw(b).Auth() {
				t.Fatalf("Parse reads auth %#x, Raw %#x", h.Auth, Raw(b).Auth())
			}
		}
		if got != want {
			t.Fatalf("Authentic(%x, %#x) = %v, want %v", b, secret, got, want)
		}
	})
}
