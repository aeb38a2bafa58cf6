package engine

import (
	"bytes"
	"testing"
)

func TestHeaderRoundTrip(t *testing.T) {
	for _, h := range []header{
		{typ: msgData, flags: flagFirst | flagLast | flagImm, credit: 40, length: 5, seq: 7, imm: 0xdeadbeef},
		{typ: msgData, flags: flagFirst, credit: 1 << 31, length: 1 << 20, seq: ^uint32(0)},
		{typ: msgData, flags: 0},
		{typ: msgCredit, flags: flagFirst | flagLast, credit: 9, arg: 3},
		{typ: msgCredit, flags: flagFirst | flagLast | flagGap, credit: 9, arg: 3, length: 7},
		{typ: msgCredit, flags: flagFirst | flagLast | flagGap, arg: ^uint32(0), length: 2}, // across the wrap
		{typ: msgExport, flags: flagFirst | flagLast, arg: 12},
		{typ: msgUnexported, flags: flagFirst | flagLast, arg: 12},
	} {
		var b [headerLen]byte
		h.put(b[:])
		var got header
		if err := got.parse(b[:]); err != nil || got != h {
			t.Errorf("%v: parsed as %v, %v", &h, &got, err)
		}
	}
}

func TestHeaderRejects(t *testing.T) {
	valid := func() []byte {
		var b [headerLen]byte
		(&header{typ: msgFin, flags: flagFirst | flagLast}).put(b[:])
		return b[:]
	}
	gap := func(b []byte) []byte {
		(&header{typ: msgCredit, flags: flagFirst | flagLast | flagGap, arg: 10, length: 12}).put(b)
		return b
	}
	for name, mutate := range map[string]func([]byte) []byte{
		"gap on data":           func(b []byte) []byte { b = gap(b); b[0] = byte(msgData); return b },
		"gap on a FIN":          func(b []byte) []byte { b = gap(b); b[0] = byte(msgFin); return b },
		"empty gap":             func(b []byte) []byte { b = gap(b); b[11] = 10; return b },
		"gap ending before":     func(b []byte) []byte { b = gap(b); b[11] = 3; return b },
		"short":                 func(b []byte) []byte { return b[:headerLen-1] },
		"type 0":                func(b []byte) []byte { b[0] = 0; return b },
		"unknown type":          func(b []byte) []byte { b[0] = 99; return b },
		"unknown flag":          func(b []byte) []byte { b[1] |= 0x80; return b },
		"reserved set":          func(b []byte) []byte { b[2] = 1; return b },
		"chunked control":       func(b []byte) []byte { b[1] = flagFirst; return b },
		"control without flags": func(b []byte) []byte { b[1] = 0; return b },
	} {
		var h header
		if err := h.parse(mutate(valid())); err == nil {
			t.Errorf("%s: accepted", name)
		}
	}
}

// FuzzHeader: parse never panics, and what it accepts re-encodes to the
// same bytes.
func FuzzHeader(f *testing.F) {
	for _, h := range []header{
		{typ: msgData, flags: flagFirst | flagLast, length: 3},
		{typ: msgCredit, flags: flagFirst | flagLast, credit: 5},
		{typ: msgCredit, flags: flagFirst | flagLast | flagGap, arg: 4, length: 9},
		{typ: msgReset, flags: flagFirst | flagLast},
	} {
		var b [headerLen]byte
		h.put(b[:])
		f.Add(b[:])
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		var h header
		if h.parse(b) != nil {
			return
		}
		var out [headerLen]byte
		h.put(out[:])
		if !bytes.Equal(out[:], b[:headerLen]) {
			t.Fatalf("re-encoded %x as %x", b[:headerLen], out)
		}
	})
}

// The in-place accessors read and write the fields parse and put do.
func TestRawHeader(t *testing.T) {
	var b [headerLen]byte
	h := dataHeader(5, 77, 9, true)
	h.flags |= flagFirst | flagLast
	h.arg = 41
	h.put(b[:])
	r := rawHeader(b[:])
	if r.typ() != msgData || !r.whole() || !r.last() || r.seq() != 77 || r.ack() != 41 {
		t.Fatalf("raw %v: type %d whole %v last %v seq %d ack %d", &h, r.typ(), r.whole(), r.last(), r.seq(), r.ack())
	}
	r.setCredit(1000)
	r.setAck(42)
	var got header
	if err := got.parse(b[:]); err != nil || got.credit != 1000 || got.ack() != 42 {
		t.Fatalf("after setCredit/setAck: %v, %v (ack %d)", &got, err, got.ack())
	}
	if imm, ok := got.appImm(); !ok || imm != 9 {
		t.Fatalf("immediate %d, %v", imm, ok)
	}

	g := controlHeader(msgCredit)
	g.arg = 10
	g.put(b[:])
	rawHeader(b[:]).setGap(12)
	if err := got.parse(b[:]); err != nil {
		t.Fatal(err)
	}
	if end, ok := got.gap(); !ok || end != 12 || got.ack() != 10 {
		t.Fatalf("gap: end %d, %v, ack %d", end, ok, got.ack())
	}

	bh := bundleHeader(3, 4, 100)
	bh.put(b[:])
	if err := got.parse(b[:]); err != nil || got.count() != 4 || rawHeader(b[:]).count() != 4 || got.seq != 3 || got.length != 100 {
		t.Fatalf("bundle: %v, %v", &got, err)
	}
	eh := regionHeader(msgExport, 12)
	eh.put(b[:])
	if err := got.parse(b[:]); err != nil || got.region() != 12 {
		t.Fatalf("export: %v, %v", &got, err)
	}
}
