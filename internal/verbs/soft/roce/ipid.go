package roce

import "hash/crc32"

// Recovering the IPv4 identification a received packet's ICRC covers.
//
// rxe numbers its IPv4 datagrams (__ip_select_ident, DF set) and covers the
// number it chose with the ICRC, but a UDP socket does not deliver the IP
// header. The CRC is affine in its input, so the ICRC of the packet with id
// v differs from the one with id 0 by a linear function of v that depends
// only on how many bytes follow the id: solving that for v (16 unknowns, 32
// equations) either finds the one id that makes the ICRC check out, or
// proves there is none. A corrupted packet is then still caught unless the
// corruption happens to look like an id: the check keeps 16 of its 32 bits
// for IPv4 packets from rxe. Decode solves only for packets from a source
// port other than the receiver's: a peer of ours sends from the port we
// share, with id 0, and its packets keep all 32 bits.

// ipIDOffset is where the id sits in the ICRC's input: after the 8 bytes
// standing for the LRH and the first 4 bytes of the IPv4 header.
const ipIDOffset = 8 + 4

// multModP returns a·b modulo the reflected IEEE polynomial (zlib's
// multmodp): the bit of x^0 is the top bit.
func multModP(a, b uint32) uint32 {
	var p uint32
	for m := uint32(1) << 31; m != 0; m >>= 1 {
		if a&m != 0 {
			p ^= b
		}
		if b&1 != 0 {
			b = b>>1 ^ crc32.IEEE
		} else {
			b >>= 1
		}
	}
	return p
}

// xPow8n returns x^(8n) modulo the polynomial: what running n zero bytes
// through a CRC register (without inversion) multiplies it by.
func xPow8n(n int) uint32 {
	p := uint32(1) << 31  // x^0
	sq := uint32(1) << 23 // x^8
	for ; n > 0; n >>= 1 {
		if n&1 != 0 {
			p = multModP(sq, p)
		}
		sq = multModP(sq, sq)
	}
	return p
}

// idBasis[i] is the raw CRC register (zero start, no inversion) after the
// two id bytes with only bit i of the id set: big-endian on the wire, so
// bit i lives in byte 1-i/8.
var idBasis = func() (b [16]uint32) {
	for i := range 16 {
		v := uint16(1) << i
		b[i] = crcUpdate(0, []byte{byte(v >> 8), byte(v)})
	}
	return b
}()

// solveIPID returns the id v such that the ICRC of a packet of n bytes (BTH
// to ICRC) computed with id v is want, given got, its ICRC with id 0; ok is
// false when no id does it.
func solveIPID(got, want uint32, n int) (v uint16, ok bool) {
	// Bytes of the ICRC's input after the id: the rest of the 8+20+8-byte
	// pseudo header and the packet without its ICRC.
	after := 8 + 20 + 8 + n - ICRCLen - ipIDOffset - 2
	op := xPow8n(after)
	var rows [16]uint32 // column vectors of the map, reduced as we go
	var ids [16]uint16  // which ids each reduced vector stands for
	r := got ^ want
	var sol uint16
	used := 0
	for i := range 16 {
		c, id := multModP(op, idBasis[i]), uint16(1)<<i
		for j := range used {
			if c&lowBit(rows[j]) != 0 {
				c ^= rows[j]
				id ^= ids[j]
			}
		}
		if c == 0 {
			continue // cannot happen: the map is injective
		}
		rows[used], ids[used] = c, id
		used++
	}
	// Eliminate r against the pivots (the lowest set bit of each row, kept
	// distinct by the reduction above, which runs in pivot order).
	for j := range used {
		if r&lowBit(rows[j]) != 0 {
			r ^= rows[j]
			sol ^= ids[j]
		}
	}
	return sol, r == 0
}

func lowBit(x uint32) uint32 { return x & -x }
