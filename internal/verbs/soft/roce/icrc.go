package roce

import (
	"encoding/binary"
	"hash/crc32"

	"github.com/rdmavisor/rdmavisor/internal/verbs"
)

// DefaultPort is the IANA UDP port of RoCEv2.
const DefaultPort = 4791

// Endpoint is one end of the UDP flow that carries a packet. The ICRC
// covers both ends' addresses and ports, so sender and receiver must pass
// the same pair: the sender its own address and port as src, the receiver
// the address and port the datagram came from.
type Endpoint struct {
	GID  verbs.GID // the IP address; IPv4 as an IPv4-mapped address
	Port uint16    // UDP port
}

// The IPv4 identification and flags/fragment-offset word the pseudo header
// assumes: see the package doc.
const (
	ipv4ID    = 0
	ipv4Flags = 0x4000 // DF
)

// maxPacketLen is the largest UDP payload an IPv4 datagram holds; the
// lengths in the pseudo header must not overflow.
const maxPacketLen = 65535 - 20 - 8

const protoUDP = 17

// rxeSeed is rxe's starting CRC register: crc32_le(0xffffffff, eight 0xff
// bytes), the masked LRH folded in.
const rxeSeed = 0xdebb20e3

func isIPv4(g *verbs.GID) bool {
	return binary.BigEndian.Uint64(g[0:8]) == 0 && binary.BigEndian.Uint32(g[8:12]) == 0xffff
}

// icrc returns the ICRC of pkt, a whole packet from the BTH to the ICRC
// (whose own 4 bytes it does not read), sent from src to dst in an IPv4
// datagram with the given identification and flags word, or an IPv6 one.
// ok is false when src and dst are of different families. len(pkt) must be
// in [BTHLen+ICRCLen, maxPacketLen].
func icrc(pkt []byte, src, dst *Endpoint, id, flags uint16) (crc uint32, ok bool) {
	v4 := isIPv4(&src.GID)
	if v4 != isIPv4(&dst.GID) {
		return 0, false
	}
	n := len(pkt)
	var ph [40 + 8 + BTHLen]byte // IPv6 is the larger header
	var ip int
	if v4 {
		binary.BigEndian.PutUint32(ph[0:], 0x45ff<<16|uint32(20+8+n)) // version, IHL, TOS masked, total length
		binary.BigEndian.PutUint16(ph[4:], id)
		binary.BigEndian.PutUint16(ph[6:], flags)
		binary.BigEndian.PutUint32(ph[8:], 0xff<<24|protoUDP<<16|0xffff) // TTL masked, protocol, checksum masked
		copy(ph[12:16], src.GID[12:])
		copy(ph[16:20], dst.GID[12:])
		ip = 20
	} else {
		binary.BigEndian.PutUint32(ph[0:], 0x6fffffff)                       // version; traffic class, flow label masked
		binary.BigEndian.PutUint32(ph[4:], uint32(8+n)<<16|protoUDP<<8|0xff) // payload length, next header, hop limit masked
		copy(ph[8:24], src.GID[:])
		copy(ph[24:40], dst.GID[:])
		ip = 40
	}
	u := ph[ip : ip+8+BTHLen]
	binary.BigEndian.PutUint16(u[0:], src.Port)
	binary.BigEndian.PutUint16(u[2:], dst.Port)
	binary.BigEndian.PutUint32(u[4:], uint32(8+n)<<16|0xffff) // length, checksum masked
	copy(u[8:], pkt[:BTHLen])
	u[8+4] = 0xff // resv8a: FECN, BECN and reserved bits
	r := crcUpdate(rxeSeed, ph[:ip+8+BTHLen])
	// crc32.Update works on the inverted register and inverts its result,
	// which is the ICRC.
	return crc32.Update(^r, crc32.IEEETable, pkt[BTHLen:n-ICRCLen]), true
}

// crcTab is the slicing-by-8 table of the reflected IEEE polynomial.
var crcTab = func() (t [8][256]uint32) {
	for i := range 256 {
		c := uint32(i)
		for range 8 {
			c = c>>1 ^ crc32.IEEE&-(c&1)
		}
		t[0][i] = c
	}
	for i := range 256 {
		c := t[0][i]
		for j := 1; j < 8; j++ {
			c = t[0][c&0xff] ^ c>>8
			t[j][i] = c
		}
	}
	return t
}()

// crcUpdate advances the CRC register r (not inverted: Linux's crc32_le) over
// p. Unlike crc32.Update it keeps p on the caller's stack.
func crcUpdate(r uint32, p []byte) uint32 {
	t := &crcTab
	for len(p) >= 8 {
		r ^= binary.LittleEndian.Uint32(p)
		r = t[0][p[7]] ^ t[1][p[6]] ^ t[2][p[5]] ^ t[3][p[4]] ^
			t[4][r>>24] ^ t[5][r>>16&0xff] ^ t[6][r>>8&0xff] ^ t[7][r&0xff]
		p = p[8:]
	}
	for _, v := range p {
		r = t[0][byte(r)^v] ^ r>>8
	}
	return r
}
