package roce

import (
	"fmt"
	"testing"
)

// TestNoAllocs: the hot path allocates nothing.
func TestNoAllocs(t *testing.T) {
	h := Header{Opcode: RCWriteOnlyImm, DestQPN: 1, PSN: 2, VA: 3, RKey: 4, DMALen: 5, Imm: 6}
	payload := payloadOf(4093)
	buf := make([]byte, MaxPacketLen(len(payload)))
	for _, ends := range [][2]Endpoint{{v4a, v4b}, {v6a, v6b}} {
		src, dst := ends[0], ends[1]
		n, _ := Encode(buf, &h, payload, src, dst)
		pkt := buf[:n]
		var got Header
		bad := make([]byte, n)
		copy(bad, pkt)
		bad[20] ^= 1
		for name, f := range map[string]func(){
			"Encode":     func() { Encode(buf, &h, payload, src, dst) },
			"PutHeaders": func() { PutHeaders(buf, &h) },
			"Seal":       func() { Seal(buf, HeaderLen(h.Opcode), len(payload), src, dst) },
			"Decode":     func() { Decode(pkt, &got, src, dst) },
			"Decode bad": func() { Decode(bad, &got, src, dst) },
		} {
			if a := testing.AllocsPerRun(100, f); a != 0 {
				t.Errorf("%s allocates %v times per call", name, a)
			}
		}
	}
}

func BenchmarkEncode(b *testing.B) {
	for _, size := range []int{64, 4096} {
		b.Run(fmt.Sprint(size), func(b *testing.B) {
			h := Header{Opcode: RCSendOnly, DestQPN: 0x11, PSN: 1, AckReq: true}
			payload := payloadOf(size)
			buf := make([]byte, MaxPacketLen(size))
			b.ReportAllocs()
			b.SetBytes(int64(size))
			for b.Loop() {
				if _, err := Encode(buf, &h, payload, v4a, v4b); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

func BenchmarkDecode(b *testing.B) {
	for _, size := range []int{64, 4096} {
		b.Run(fmt.Sprint(size), func(b *testing.B) {
			pkt := mustEncode(Header{Opcode: RCSendOnly, DestQPN: 0x11, PSN: 1, AckReq: true}, payloadOf(size), v4a, v4b)
			var h Header
			b.ReportAllocs()
			b.SetBytes(int64(size))
			for b.Loop() {
				if _, err := Decode(pkt, &h, v4a, v4b); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// BenchmarkICRC isolates the pseudo header, which runs through the
// package's table CRC rather than crc32.Update.
func BenchmarkICRC(b *testing.B) {
	for _, ends := range []struct {
		name     string
		src, dst Endpoint
	}{{"IPv4", v4a, v4b}, {"IPv6", v6a, v6b}} {
		b.Run(ends.name, func(b *testing.B) {
			pkt := mustEncode(Header{Opcode: RCAck}, nil, ends.src, ends.dst)
			b.ReportAllocs()
			for b.Loop() {
				icrc(pkt, &ends.src, &ends.dst, ipv4ID, ipv4Flags)
			}
		})
	}
}
