package roce

import (
	"bytes"
	"math/rand/v2"
	"testing"
)

// TestRoundTrip encodes every opcode with every payload length from 0 to
// 4096 (so every pad value) and random header fields, and decodes it back.
func TestRoundTrip(t *testing.T) {
	payload := payloadOf(4096)
	buf := make([]byte, MaxPacketLen(4096))
	for _, op := range validOpcodes {
		t.Run(op.String(), func(t *testing.T) {
			r := rand.New(rand.NewPCG(uint64(op), 7))
			maxLen := 4096
			if !op.HasPayload() {
				maxLen = 0
			}
			for n := 0; n <= maxLen; n++ {
				src, dst := v4a, v4b
				if n%3 == 1 {
					src, dst = v6a, v6b
				}
				want := randHeader(r, op)
				want.PadCount = uint8(-n & 3)
				clear(buf)
				plen, err := Encode(buf, &want, payload[:n], src, dst)
				if err != nil {
					t.Fatalf("%d bytes: Encode: %v", n, err)
				}
				if wantLen := HeaderLen(op) + n + int(want.PadCount) + ICRCLen; plen != wantLen || plen%4 != 0 {
					t.Fatalf("%d bytes: length %d, want %d", n, plen, wantLen)
				}
				if plen > MaxPacketLen(n) {
					t.Fatalf("%d bytes: length %d > MaxPacketLen %d", n, plen, MaxPacketLen(n))
				}
				if pad := buf[HeaderLen(op)+n : plen-ICRCLen]; !bytes.Equal(pad, make([]byte, len(pad))) {
					t.Fatalf("%d bytes: pad % x", n, pad)
				}
				var got Header
				p, err := Decode(buf[:plen], &got, src, dst)
				if err != nil {
					t.Fatalf("%d bytes: Decode: %v", n, err)
				}
				if got != want {
					t.Fatalf("%d bytes: decoded\n%+v\nwant\n%+v", n, got, want)
				}
				if !bytes.Equal(p, payload[:n]) {
					t.Fatalf("%d bytes: payload differs", n)
				}
				if n > 0 && &p[0] != &buf[HeaderLen(op)] || cap(p) != n {
					t.Fatalf("%d bytes: payload does not alias the packet, or its cap %d reaches past it", n, cap(p))
				}
			}
		})
	}
}

// TestEncodeInPlace: the provider builds payload in the buffer and Seals.
func TestEncodeInPlace(t *testing.T) {
	h := Header{Opcode: RCWriteOnlyImm, DestQPN: 0x123456, PSN: 0xabcdef, VA: 0x1000, RKey: 7, DMALen: 5, Imm: 9}
	buf := make([]byte, MaxPacketLen(5))
	hl, err := PutHeaders(buf, &h)
	if err != nil || hl != HeaderLen(RCWriteOnlyImm) {
		t.Fatalf("PutHeaders = %d, %v", hl, err)
	}
	copy(buf[hl:], "hello")
	buf[hl+5] = 0xaa // garbage where the pad goes
	n, err := Seal(buf, hl, 5, v4a, v4b)
	if err != nil {
		t.Fatal(err)
	}
	if want := mustEncode(h, []byte("hello"), v4a, v4b); !bytes.Equal(buf[:n], want) {
		t.Fatalf("PutHeaders+Seal\n% x\nEncode\n% x", buf[:n], want)
	}
	// Encode with the payload already in place (overlapping copy).
	n2, err := Encode(buf, &h, buf[hl:hl+5], v4a, v4b)
	if err != nil || !bytes.Equal(buf[:n2], buf[:n]) {
		t.Fatalf("Encode in place: %v", err)
	}
}

func TestMaxPacketLen(t *testing.T) {
	for _, mtu := range []int{0, 1, 256, 1024, 4096} {
		for _, op := range validOpcodes {
			n := mtu
			if !op.HasPayload() {
				n = 0
			}
			h := Header{Opcode: op}
			b := make([]byte, MaxPacketLen(mtu))
			if _, err := Encode(b, &h, make([]byte, n), v4a, v4b); err != nil {
				t.Errorf("mtu %d %v: %v", mtu, op, err)
			}
		}
	}
	if got := MaxPacketLen(4096); got != 32+4096+4 {
		t.Errorf("MaxPacketLen(4096) = %d", got)
	}
	if MaxPacketLen(-1) != MaxPacketLen(0) {
		t.Error("MaxPacketLen(-1)")
	}
}
