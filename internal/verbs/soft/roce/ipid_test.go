package roce

import (
	"encoding/binary"
	"errors"
	"testing"
)

// TestDecodeRecoversIPID: a packet sealed the way rxe seals it, with a
// nonzero IPv4 id (DF set), decodes; the same packet with any covered bit
// flipped does not, and the id is the one the sender chose.
func TestDecodeRecoversIPID(t *testing.T) {
	src := Endpoint{GID: gid("10.99.0.2"), Port: 0xc123}
	dst := Endpoint{GID: gid("10.99.0.1"), Port: DefaultPort}
	for _, size := range []int{0, 1, 100, 1024, 4096} {
		for _, id := range []uint16{0, 1, 0x8000, 0x1234, 0xffff} {
			h := Header{Opcode: RCSendOnly, PKey: 0xffff, DestQPN: 0x11, PSN: 7}
			payload := make([]byte, size)
			for i := range payload {
				payload[i] = byte(i*7 + 3)
			}
			b := make([]byte, MaxPacketLen(4096))
			n, err := Encode(b, &h, payload, src, dst)
			if err != nil {
				t.Fatal(err)
			}
			b = b[:n]
			crc, _ := icrc(b, &src, &dst, id, ipv4Flags)
			binary.LittleEndian.PutUint32(b[n-ICRCLen:], crc)
			crc0, _ := icrc(b, &src, &dst, 0, ipv4Flags)
			if got, ok := solveIPID(crc0, crc, n); !ok || got != id {
				t.Errorf("size %d id %#x: solved %#x, %v", size, id, got, ok)
			}
			var g Header
			if id != 0 {
				// From the port the receiver shares, a packet must carry id 0.
				if _, err := Decode(b, &g, dst, dst); !errors.Is(err, ErrICRC) {
					t.Errorf("size %d id %#x from port %d: Decode %v, want ErrICRC", size, id, dst.Port, err)
				}
			}
			if _, err := Decode(b, &g, src, dst); err != nil {
				t.Errorf("size %d id %#x: Decode: %v", size, id, err)
			}
			for _, bit := range []int{0, 8*BTHLen - 1, 8 * (n - 1)} {
				b[bit/8] ^= 1 << (bit % 8)
				if _, err := Decode(b, &g, src, dst); !errors.Is(err, ErrICRC) && !errors.Is(err, ErrOpcode) {
					t.Errorf("size %d id %#x bit %d flipped: Decode %v, want ErrICRC", size, id, bit, err)
				}
				b[bit/8] ^= 1 << (bit % 8)
			}
		}
	}
}
