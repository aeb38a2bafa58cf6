package frame

import (
	"bytes"
	"encoding/hex"
	"errors"
	"reflect"
	"testing"
)

// golden frames: the bytes on the wire, fixed by the protocol.
var golden = []struct {
	name string
	f    Frame
	hex  string
}{
	{"hello", Frame{Op: OpHello, Req: 1, Arg: Version},
		"01010000" + "00000001" + "00000000" + "00000001" + "0000000000000000" + "00000000"},
	{"dial", Frame{Op: OpDial, Req: 7, Payload: []byte("b:80")},
		"01030000" + "00000007" + "00000000" + "00000000" + "0000000000000000" + "00000004" + "623a3830"},
	{"send imm", Frame{Op: OpSend, Flags: FlagImm, Req: 0x01020304, Handle: 9, Arg: 0xdeadbeef, Payload: []byte{0xaa}},
		"01040001" + "01020304" + "00000009" + "deadbeef" + "0000000000000000" + "00000001" + "aa"},
	{"error push", Frame{Op: OpError, Handle: 3, Arg: uint32(CodePeerGone), Payload: []byte("x")},
		"010e0000" + "00000000" + "00000003" + "00000009" + "0000000000000000" + "00000001" + "78"},
	{"export memfd", Frame{Op: OpExport, Flags: FlagMemfd, Req: 3, Handle: 1, Arg: 3, Arg2: 0x1000},
		"01070004" + "00000003" + "00000001" + "00000003" + "0000000000001000" + "00000000"},
	{"stage", Frame{Op: OpStage, Req: 4, Handle: 1, Arg2: 0x40000},
		"01130000" + "00000004" + "00000001" + "00000000" + "0000000000040000" + "00000000"},
	{"write staged", Frame{Op: OpWrite, Flags: FlagMemfd, Req: 5, Handle: 1, Arg: 2, Arg2: 0x10, Payload: AppendStaged(nil, 0x10000, 0x2000)},
		"010b0004" + "00000005" + "00000001" + "00000002" + "0000000000000010" + "00000008" + "0001000000002000"},
	{"read", Frame{Op: OpRead, Req: 2, Handle: 1, Arg: 5, Arg2: 0x100, Payload: AppendLength(nil, 16)},
		"010c0000" + "00000002" + "00000001" + "00000005" + "0000000000000100" + "00000004" + "00000010"},
}

func TestGolden(t *testing.T) {
	for _, g := range golden {
		t.Run(g.name, func(t *testing.T) {
			want, err := hex.DecodeString(g.hex)
			if err != nil {
				t.Fatal(err)
			}
			got, err := Append(nil, &g.f)
			if err != nil {
				t.Fatal(err)
			}
			if !bytes.Equal(got, want) {
				t.Fatalf("encode:\n got %x\nwant %x", got, want)
			}
			f, err := Decode(want)
			if err != nil {
				t.Fatal(err)
			}
			if len(f.Payload) == 0 {
				f.Payload = g.f.Payload
			}
			if !reflect.DeepEqual(f, g.f) {
				t.Fatalf("decode: got %+v, want %+v", f, g.f)
			}
		})
	}
}

func TestDecodeErrors(t *testing.T) {
	ok, _ := Append(nil, &Frame{Op: OpSend, Payload: []byte("abc")})
	mut := func(f func(b []byte) []byte) []byte { return f(append([]byte(nil), ok...)) }
	for _, tc := range []struct {
		name string
		b    []byte
		want error
	}{
		{"empty", nil, ErrShort},
		{"short", ok[:HeaderLen-1], ErrShort},
		{"version", mut(func(b []byte) []byte { b[0] = 2; return b }), ErrVersion},
		{"op zero", mut(func(b []byte) []byte { b[1] = 0; return b }), ErrOp},
		{"op unknown", mut(func(b []byte) []byte { b[1] = 200; return b }), ErrOp},
		{"flags", mut(func(b []byte) []byte { b[2] = 0x80; return b }), ErrFlags},
		{"truncated", ok[:len(ok)-1], ErrLength},
		{"trailing", append(append([]byte(nil), ok...), 0), ErrLength},
		{"huge", mut(func(b []byte) []byte { b[24] = 0xff; return b }), ErrTooBig},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if _, err := Decode(tc.b); !errors.Is(err, tc.want) {
				t.Fatalf("Decode: %v, want %v", err, tc.want)
			}
		})
	}
	if _, err := Append(nil, &Frame{Op: OpSend, Payload: make([]byte, MaxPayload+1)}); !errors.Is(err, ErrTooBig) {
		t.Fatalf("Append of an oversized payload: %v", err)
	}
}

func TestHello(t *testing.T) {
	h := HelloInfo{Quota: 3, SendWindow: 16, MaxMessage: 60000, Node: "node-a"}
	got, err := DecodeHello(AppendHello(nil, h))
	if err != nil || got != h {
		t.Fatalf("DecodeHello: %+v, %v", got, err)
	}
	if _, err := DecodeHello([]byte{1}); !errors.Is(err, ErrPayload) {
		t.Fatalf("short hello: %v", err)
	}
}

// FuzzDecode: what Decode accepts re-encodes to the same bytes, and what
// it refuses, it refuses with one of the frame's errors; likewise for the
// payloads DecodeHello, DecodeStaged and DecodeLength parse.
func FuzzDecode(f *testing.F) {
	for _, g := range golden {
		b, _ := hex.DecodeString(g.hex)
		f.Add(b)
	}
	for _, b := range docSeeds(f) { // docs/protocol.md's examples
		f.Add(b)
	}
	f.Add([]byte{})
	f.Add([]byte{1, 4, 0, 0})
	f.Fuzz(func(t *testing.T, b []byte) {
		fr, err := Decode(b)
		if err != nil {
			if !errors.Is(err, ErrShort) && !errors.Is(err, ErrVersion) && !errors.Is(err, ErrOp) &&
				!errors.Is(err, ErrFlags) && !errors.Is(err, ErrTooBig) && !errors.Is(err, ErrLength) {
				t.Fatalf("%x: %v, none of the frame's errors", b, err)
			}
			fr.Payload = b // the payload parsers take any bytes
		} else {
			out, err := Append(nil, &fr)
			if err != nil {
				t.Fatalf("re-encode: %v", err)
			}
			if !bytes.Equal(out, b) {
				t.Fatalf("round trip:\n got %x\nwant %x", out, b)
			}
		}
		if h, err := DecodeHello(fr.Payload); err != nil {
			if !errors.Is(err, ErrPayload) {
				t.Fatalf("hello %x: %v, not ErrPayload", fr.Payload, err)
			}
		} else if out := AppendHello(nil, h); !bytes.Equal(out, fr.Payload) {
			t.Fatalf("hello %x decoded as %+v, re-encoded as %x", fr.Payload, h, out)
		}
		if off, n, err := DecodeStaged(fr.Payload); err != nil {
			if !errors.Is(err, ErrPayload) {
				t.Fatalf("staged %x: %v, not ErrPayload", fr.Payload, err)
			}
		} else if !bytes.Equal(AppendStaged(nil, off, n), fr.Payload) {
			t.Fatalf("staged %x decoded as %d, %d", fr.Payload, off, n)
		}
		if n, err := DecodeLength(fr.Payload); err != nil {
			if !errors.Is(err, ErrPayload) && !errors.Is(err, ErrTooBig) {
				t.Fatalf("length %x: %v, neither ErrPayload nor ErrTooBig", fr.Payload, err)
			}
		} else if n > MaxPayload || !bytes.Equal(AppendLength(nil, n), fr.Payload) {
			t.Fatalf("length %x decoded as %d", fr.Payload, n)
		}
	})
}
