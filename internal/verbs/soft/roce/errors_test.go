package roce

import (
	"bytes"
	"errors"
	"math/rand/v2"
	"testing"
)

// corruptionPackets covers each header layout, both families and every pad.
func corruptionPackets() []struct {
	pkt      []byte
	src, dst Endpoint
} {
	r := rand.New(rand.NewPCG(3, 4))
	var out []struct {
		pkt      []byte
		src, dst Endpoint
	}
	for i, op := range []Opcode{RCSendOnly, RCWriteOnlyImm, RCAck, RCReadRequest, RCReadResponseFirst, UCSendLastImm, UDSendOnlyImm} {
		src, dst := v4a, v4b
		if i%2 == 1 {
			src, dst = v6a, v6b
		}
		n := 0
		if op.HasPayload() {
			n = 29 + i
		}
		out = append(out, struct {
			pkt      []byte
			src, dst Endpoint
		}{mustEncode(randHeader(r, op), payloadOf(n), src, dst), src, dst})
	}
	return out
}

// TestDecodeBitFlip flips every bit of packets: each is ErrICRC, but the
// bits of the BTH's resv8a byte, which the ICRC does not cover: those are
// FECN, BECN (decoded) and reserved (ignored).
func TestDecodeBitFlip(t *testing.T) {
	for _, c := range corruptionPackets() {
		var want Header
		if _, err := Decode(c.pkt, &want, c.src, c.dst); err != nil {
			t.Fatal(err)
		}
		for i := range len(c.pkt) * 8 {
			b := bytes.Clone(c.pkt)
			b[i/8] ^= 1 << (i % 8)
			var h Header
			_, err := Decode(b, &h, c.src, c.dst)
			if i/8 != 4 {
				if err != ErrICRC {
					t.Errorf("%v: bit %d flipped: %v, want ErrICRC", want.Opcode, i, err)
				}
				continue
			}
			w := want
			switch i % 8 {
			case 7:
				w.FECN = !w.FECN
			case 6:
				w.BECN = !w.BECN
			}
			if err != nil || h != w {
				t.Errorf("%v: resv8a bit %d flipped: %v %+v", want.Opcode, i%8, err, h)
			}
		}
		// The pseudo header is covered too: the wrong address or port of
		// either end.
		for _, e := range []struct{ src, dst Endpoint }{
			{Endpoint{c.src.GID, c.src.Port + 1}, c.dst},
			{c.src, Endpoint{c.dst.GID, c.dst.Port ^ 0x8000}},
			{c.dst, c.src},
		} {
			wrong := e.src
			wrong.GID[15] ^= 1
			for _, ends := range [][2]Endpoint{{e.src, e.dst}, {wrong, e.dst}} {
				if _, err := Decode(c.pkt, new(Header), ends[0], ends[1]); err != ErrICRC {
					t.Errorf("%v: wrong endpoints %v: %v, want ErrICRC", want.Opcode, ends, err)
				}
			}
		}
	}
}

// TestDecodeTruncated: every prefix of a packet is an error, never a panic,
// and leaves the header alone.
func TestDecodeTruncated(t *testing.T) {
	for _, c := range corruptionPackets() {
		for n := range len(c.pkt) {
			h := Header{PSN: 42}
			p, err := Decode(c.pkt[:n], &h, c.src, c.dst)
			if err == nil || p != nil || h != (Header{PSN: 42}) {
				t.Errorf("%d of %d bytes: %v, payload %v, header %+v", n, len(c.pkt), err, p, h)
			}
			if n < BTHLen+ICRCLen && err != ErrTruncated {
				t.Errorf("%d bytes: %v, want ErrTruncated", n, err)
			}
		}
	}
}

// TestDecodeErrors checks the checks after the ICRC, on packets that carry
// a correct ICRC for what they hold.
func TestDecodeErrors(t *testing.T) {
	send := func(n int) []byte {
		return mustEncode(Header{Opcode: RCSendOnly, DestQPN: 5, PSN: 6}, payloadOf(n), v4a, v4b)
	}
	tests := []struct {
		name string
		pkt  []byte
		want error
	}{
		{"version 1", reseal(func() []byte { b := send(4); b[1] |= 1; return b }(), v4a, v4b), ErrVersion},
		{"version 15", reseal(func() []byte { b := send(4); b[1] |= 0xf; return b }(), v4a, v4b), ErrVersion},
		{"atomic ack 0x12", reseal(func() []byte { b := send(4); b[0] = 0x12; return b }(), v4a, v4b), ErrOpcode},
		{"cmp swap 0x13", reseal(func() []byte { b := send(28); b[0] = 0x13; return b }(), v4a, v4b), ErrOpcode},
		{"RD 0x44", reseal(func() []byte { b := send(4); b[0] = 0x44; return b }(), v4a, v4b), ErrOpcode},
		{"CNP 0x81", reseal(func() []byte { b := send(16); b[0] = 0x81; return b }(), v4a, v4b), ErrOpcode},
		{"0xff", reseal(func() []byte { b := send(0); b[0] = 0xff; return b }(), v4a, v4b), ErrOpcode},
		{"RETH cut", reseal(func() []byte { b := send(8); b[0] = byte(RCWriteOnly); return b }(), v4a, v4b), ErrTruncated},
		{"DETH+ImmDt cut", reseal(func() []byte { b := send(8); b[0] = byte(UDSendOnlyImm); return b }(), v4a, v4b), ErrTruncated},
		{"length not 4-aligned", reseal(append(send(4)[:16], 0, 0, 0, 0, 0), v4a, v4b), ErrLength},
		{"ACK with payload", reseal(func() []byte { b := send(8); b[0] = byte(RCAck); return b }(), v4a, v4b), ErrLength},
		{"read request with payload", reseal(func() []byte { b := send(20); b[0] = byte(RCReadRequest); return b }(), v4a, v4b), ErrLength},
		{"pad count over empty payload", reseal(func() []byte { b := send(0); b[1] |= 3 << 4; return b }(), v4a, v4b), ErrPad},
		{"ACK with pad count", reseal(func() []byte { b := mustEncode(Header{Opcode: RCAck}, nil, v4a, v4b); b[1] |= 1 << 4; return b }(), v4a, v4b), ErrPad},
		{"nonzero pad byte", reseal(func() []byte { b := send(1); b[len(b)-5] = 1; return b }(), v4a, v4b), ErrPad},
		{"nonzero first pad byte", reseal(func() []byte { b := send(1); b[len(b)-7] = 0x80; return b }(), v4a, v4b), ErrPad},
		{"too long for UDP", make([]byte, maxPacketLen+1), ErrLength},
		{"short", make([]byte, 15), ErrTruncated},
		{"empty", nil, ErrTruncated},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			h := Header{QKey: 1}
			_, err := Decode(tt.pkt, &h, v4a, v4b)
			if err != tt.want {
				t.Errorf("Decode = %v, want %v", err, tt.want)
			}
			if h != (Header{QKey: 1}) {
				t.Errorf("header modified on error: %+v", h)
			}
		})
	}
	if _, err := Decode(send(4), new(Header), v4a, v6b); err != ErrAddrFamily {
		t.Errorf("IPv4 to IPv6: %v, want ErrAddrFamily", err)
	}
}

// TestDecodeIgnoresReserved: reserved bits (BTH resv6, resv7, DETH resv8)
// are ignored on receipt, as IBA requires.
func TestDecodeIgnoresReserved(t *testing.T) {
	h := Header{Opcode: UDSendOnly, DestQPN: 1, PSN: 2, QKey: 3, SrcQPN: 4}
	b := mustEncode(h, payloadOf(3), v4a, v4b)
	b[4] |= 0x3f   // resv6
	b[8] |= 0x7f   // resv7
	b[12+4] = 0xa5 // DETH resv8
	reseal(b, v4a, v4b)
	var got Header
	p, err := Decode(b, &got, v4a, v4b)
	h.PadCount = 1
	if err != nil || got != h || !bytes.Equal(p, payloadOf(3)) {
		t.Fatalf("Decode = %v, %+v", err, got)
	}
}

func TestEncodeErrors(t *testing.T) {
	buf := make([]byte, 256)
	tests := []struct {
		name    string
		h       Header
		payload []byte
		want    error
	}{
		{"unknown opcode", Header{Opcode: 0x12}, nil, ErrOpcode},
		{"CNP", Header{Opcode: 0x81}, nil, ErrOpcode},
		{"version", Header{Opcode: RCSendOnly, TVer: 1}, nil, ErrVersion},
		{"QPN", Header{Opcode: RCSendOnly, DestQPN: 1 << 24}, nil, ErrRange},
		{"PSN", Header{Opcode: RCSendOnly, PSN: 1 << 24}, nil, ErrRange},
		{"MSN", Header{Opcode: RCAck, MSN: 1 << 24}, nil, ErrRange},
		{"source QPN", Header{Opcode: UDSendOnly, SrcQPN: 1 << 24}, nil, ErrRange},
		{"ACK payload", Header{Opcode: RCAck}, []byte{1}, ErrLength},
		{"read request payload", Header{Opcode: RCReadRequest}, []byte{1}, ErrLength},
	}
	for _, tt := range tests {
		if _, err := Encode(buf, &tt.h, tt.payload, v4a, v4b); err != tt.want {
			t.Errorf("%s: Encode = %v, want %v", tt.name, err, tt.want)
		}
	}
	// Fields the opcode does not carry are not checked.
	if _, err := Encode(buf, &Header{Opcode: RCSendOnly, MSN: 1 << 30, SrcQPN: 1 << 30, PadCount: 9}, nil, v4a, v4b); err != nil {
		t.Errorf("unused fields: %v", err)
	}
	if _, err := Encode(buf, &Header{Opcode: RCSendOnly}, nil, v4a, v6b); err != ErrAddrFamily {
		t.Errorf("mixed families: %v", err)
	}
	if _, err := Encode(make([]byte, 70000), &Header{Opcode: RCSendOnly}, make([]byte, maxPacketLen-12-3), v4a, v4b); err != ErrLength {
		t.Errorf("too long: %v", err)
	}
	if n, err := Encode(make([]byte, 70000), &Header{Opcode: RCSendOnly}, make([]byte, maxPacketLen-12-4-3), v4a, v4b); err != nil || n != maxPacketLen-3 {
		t.Errorf("longest: %d, %v", n, err)
	}
	// Every buffer too short is ErrShortBuffer, never a panic.
	for _, op := range validOpcodes {
		h := Header{Opcode: op}
		payload := payloadOf(5)
		if !op.HasPayload() {
			payload = nil
		}
		need := len(mustEncode(h, payload, v4a, v4b))
		for n := range need {
			if _, err := Encode(buf[:n], &h, payload, v4a, v4b); err != ErrShortBuffer {
				t.Errorf("%v into %d of %d bytes: %v", op, n, need, err)
			}
		}
	}
}

func TestSealErrors(t *testing.T) {
	b := mustEncode(Header{Opcode: RCWriteFirst}, payloadOf(8), v4a, v4b)
	tests := []struct {
		name         string
		b            []byte
		hdrLen, plen int
		want         error
	}{
		{"header shorter than BTH", b, 11, 8, ErrLength},
		{"negative header", b, -1, 8, ErrLength},
		{"header past buffer", b[:20], 28, 0, ErrShortBuffer},
		{"wrong header length", b, 12, 8, ErrLength},
		{"negative payload", b, 28, -1, ErrLength},
		{"payload past buffer", b, 28, 9, ErrShortBuffer},
		{"huge payload", b, 28, 1 << 62, ErrLength},
		{"unknown opcode", append([]byte{0x15}, b[1:]...), 28, 8, ErrOpcode},
	}
	for _, tt := range tests {
		if _, err := Seal(tt.b, tt.hdrLen, tt.plen, v4a, v4b); !errors.Is(err, tt.want) {
			t.Errorf("%s: Seal = %v, want %v", tt.name, err, tt.want)
		}
	}
}
