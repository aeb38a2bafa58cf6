package roce

import (
	"bytes"
	"encoding/binary"
	"encoding/hex"
	"hash/crc32"
	"math/rand/v2"
	"strings"
	"testing"
)

// The reference ICRC: written from rxe_icrc.c and IBA Annex A17 without the
// package's code: a bit-at-a-time CRC over a pseudo header built by masking
// real IP and UDP headers, as rxe masks the skb's.

// crc32LE is Linux's crc32_le bit by bit: the reflected IEEE 802.3
// polynomial, no inversion on entry or exit.
func crc32LE(crc uint32, p []byte) uint32 {
	for _, b := range p {
		crc ^= uint32(b)
		for range 8 {
			if crc&1 != 0 {
				crc = crc>>1 ^ 0xedb88320
			} else {
				crc >>= 1
			}
		}
	}
	return crc
}

// refICRC is rxe_icrc(): ip and udp are the headers as on the wire (20
// bytes of IPv4 or 40 of IPv6, then 8), pkt the UDP payload without its
// ICRC.
func refICRC(ip, udp, pkt []byte) uint32 {
	ps := bytes.Clone(ip)
	if len(ip) == 20 {
		ps[1] = 0xff                // tos
		ps[8] = 0xff                // ttl
		ps[10], ps[11] = 0xff, 0xff // check = CSUM_MANGLED_0
	} else {
		ps[0] |= 0x0f                          // priority = 0xf
		ps[1], ps[2], ps[3] = 0xff, 0xff, 0xff // flow_lbl
		ps[7] = 0xff                           // hop_limit
	}
	u := bytes.Clone(udp)
	u[6], u[7] = 0xff, 0xff // check = CSUM_MANGLED_0
	bth := bytes.Clone(pkt[:12])
	bth[4] = 0xff // bth->qpn |= ~BTH_QPN_MASK
	crc := crc32LE(0xffffffff, bytes.Repeat([]byte{0xff}, 8))
	crc = crc32LE(crc, ps)
	crc = crc32LE(crc, u)
	crc = crc32LE(crc, bth)
	crc = crc32LE(crc, pkt[12:])
	return ^crc
}

func ipChecksum(h []byte) uint16 {
	var s uint32
	for i := 0; i < len(h); i += 2 {
		s += uint32(h[i])<<8 | uint32(h[i+1])
	}
	for s > 0xffff {
		s = s&0xffff + s>>16
	}
	return ^uint16(s)
}

func refIPv4(src, dst []byte, id, flags uint16, tos, ttl uint8, udpLen int) []byte {
	h := make([]byte, 20)
	h[0], h[1] = 0x45, tos
	binary.BigEndian.PutUint16(h[2:], uint16(20+udpLen))
	binary.BigEndian.PutUint16(h[4:], id)
	binary.BigEndian.PutUint16(h[6:], flags)
	h[8], h[9] = ttl, 17
	copy(h[12:], src)
	copy(h[16:], dst)
	binary.BigEndian.PutUint16(h[10:], ipChecksum(h))
	return h
}

func refIPv6(src, dst []byte, tclass uint8, flow uint32, hop uint8, udpLen int) []byte {
	h := make([]byte, 40)
	binary.BigEndian.PutUint32(h, 6<<28|uint32(tclass)<<20|flow&0xfffff)
	binary.BigEndian.PutUint16(h[4:], uint16(udpLen))
	h[6], h[7] = 17, hop
	copy(h[8:], src)
	copy(h[24:], dst)
	return h
}

func refUDP(sport, dport uint16, udpLen int, check uint16) []byte {
	h := make([]byte, 8)
	binary.BigEndian.PutUint16(h, sport)
	binary.BigEndian.PutUint16(h[2:], dport)
	binary.BigEndian.PutUint16(h[4:], uint16(udpLen))
	binary.BigEndian.PutUint16(h[6:], check)
	return h
}

// refWireICRC is the ICRC rxe computes for pkt (a whole packet, ICRC slot
// included) arriving in the datagram a Linux UDP socket with
// IP_PMTUDISC_DO sends from src to dst: IPv4 id 0 and DF, and arbitrary
// values in the masked fields.
func refWireICRC(pkt []byte, src, dst Endpoint) uint32 {
	udpLen := 8 + len(pkt)
	var ip []byte
	if isIPv4(&src.GID) {
		ip = refIPv4(src.GID[12:], dst.GID[12:], 0, 0x4000, 0x02, 64, udpLen)
	} else {
		ip = refIPv6(src.GID[:], dst.GID[:], 0x8a, 0x12345, 64, udpLen)
	}
	return refICRC(ip, refUDP(src.Port, dst.Port, udpLen, 0xbeef), pkt[:len(pkt)-4])
}

// putICRC stores an ICRC as rxe does: cpu_to_le32(~crc).
func putICRC(pkt []byte, icrc uint32) { binary.LittleEndian.PutUint32(pkt[len(pkt)-4:], icrc) }

func unhex(s string) []byte {
	b, err := hex.DecodeString(strings.Join(strings.Fields(s), ""))
	if err != nil {
		panic(err)
	}
	return b
}

// TestICRCSeed checks the relation between rxe's seed, Linux's crc32_le and
// Go's crc32 that the package relies on.
func TestICRCSeed(t *testing.T) {
	ff := bytes.Repeat([]byte{0xff}, 8)
	if got := crc32LE(0xffffffff, ff); got != rxeSeed {
		t.Fatalf("crc32_le(~0, 8×0xff) = %#x, want rxe's seed %#x", got, rxeSeed)
	}
	data := []byte("any bytes at all, of any length")
	want := ^crc32LE(rxeSeed, data)
	if got := crc32.Update(^uint32(rxeSeed), crc32.IEEETable, data); got != want {
		t.Errorf("crc32.Update(^seed) = %#x, want ~crc32_le(seed) = %#x", got, want)
	}
	if got := crc32.ChecksumIEEE(append(ff, data...)); got != want {
		t.Errorf("crc32.ChecksumIEEE(8×0xff ‖ data) = %#x, want %#x", got, want)
	}
	for n := range 64 {
		p := payloadOf(n)
		if got, want := crcUpdate(0x12345678, p), crc32LE(0x12345678, p); got != want {
			t.Errorf("crcUpdate over %d bytes = %#x, want %#x", n, got, want)
		}
	}
}

// TestICRCConnectX4 checks the ICRC against a packet a ConnectX-4 Lx put on
// the wire, a CNP (opcode 0x81, BECN set), from scapy's test suite
// (test/contrib/roce.uts, "RoCE CNP captured on ConnectX-4 Lx"). The NIC
// chose IPv4 id 0x718c, so this uses the internal icrc with that id.
func TestICRCConnectX4(t *testing.T) {
	frame := unhex(`
		e41d 2dab 2bc2 7cfe 9064 3b32 0800 45c2
		003c 718c 4000 4011 9161 0a00 1101 0a00
		1201 0000 12b7 0028 0000 8100 ffff 4000
		0118 0000 0000 0000 0000 0000 0000 0000
		0000 0000 0000 82fd 002a`)
	ip, udp, pkt := frame[14:34], frame[34:42], frame[42:]
	wantWire := []byte{0x82, 0xfd, 0x00, 0x2a}
	if !bytes.Equal(pkt[len(pkt)-4:], wantWire) {
		t.Fatalf("bad capture")
	}
	if got := refICRC(ip, udp, pkt[:len(pkt)-4]); got != binary.LittleEndian.Uint32(wantWire) {
		t.Fatalf("reference ICRC %#08x, NIC's %x (little-endian)", got, wantWire)
	}
	src := Endpoint{GID: gid("10.0.17.1"), Port: 0}
	dst := Endpoint{GID: gid("10.0.18.1"), Port: DefaultPort}
	got, ok := icrc(pkt, &src, &dst, 0x718c, 0x4000)
	if !ok || got != binary.LittleEndian.Uint32(wantWire) {
		t.Fatalf("icrc = %#08x, NIC's %x (little-endian)", got, wantWire)
	}
	// The id is not in what Decode sees: it recovers it from the ICRC
	// (ipid.go), so the packet checks out and only its opcode, a CNP we do
	// not speak, is refused.
	crc0, _ := icrc(pkt, &src, &dst, 0, 0x4000)
	if id, ok := solveIPID(crc0, binary.LittleEndian.Uint32(wantWire), len(pkt)); !ok || id != 0x718c {
		t.Errorf("solveIPID on the NIC's packet = %#x, %v; want 0x718c", id, ok)
	}
	if _, err := Decode(pkt, new(Header), src, dst); err != ErrOpcode {
		t.Errorf("Decode of the NIC's packet (id 0x718c) = %v, want ErrOpcode", err)
	}
}

// TestICRCScapyUC checks the ICRC and BTH layout against scapy's UC
// SEND_ONLY example (test/contrib/roce.uts, "RoCE layer"): IPv4 id 1144,
// DF, MigReq, pad count 2, ICRC 0x78f353f3 as scapy prints it (big-endian
// reading of the wire bytes).
func TestICRCScapyUC(t *testing.T) {
	payload := []byte("F0\x81\x8b\xe2\x895\xd9\x0e\x9a\x95PT\x01\xbe\x88^P")
	h := Header{Opcode: UCSendOnly, MigReq: true, PKey: 0xffff, DestQPN: 211, PSN: 13571856}
	pkt := make([]byte, 12+20+4)
	if n, err := PutHeaders(pkt, &h); err != nil || n != 12 {
		t.Fatalf("PutHeaders = %d, %v", n, err)
	}
	copy(pkt[12:], payload)
	pkt[1] |= 2 << 4 // pad count; pad bytes are already 0
	wantBTH := unhex("24 60 ffff 00 0000d3 00 cf1710")
	if !bytes.Equal(pkt[:12], wantBTH) {
		t.Fatalf("BTH % x, want % x", pkt[:12], wantBTH)
	}
	src := Endpoint{GID: gid("192.168.0.7"), Port: 49152}
	dst := Endpoint{GID: gid("192.168.0.7"), Port: DefaultPort}
	ip := refIPv4(src.GID[12:], dst.GID[12:], 1144, 0x4000, 1, 64, 44)
	if c := binary.BigEndian.Uint16(ip[10:]); c != 0xb4d5 {
		t.Fatalf("IP checksum %#x, scapy's 0xb4d5: the reference header is off", c)
	}
	want := unhex("78f353f3")
	if got := refICRC(ip, refUDP(49152, DefaultPort, 44, 0xaca2), pkt[:32]); got != binary.LittleEndian.Uint32(want) {
		t.Fatalf("reference ICRC %#08x, want %x little-endian", got, want)
	}
	if got, _ := icrc(pkt, &src, &dst, 1144, 0x4000); got != binary.LittleEndian.Uint32(want) {
		t.Fatalf("icrc = %#08x, want %x little-endian", got, want)
	}
}

// TestICRCMatchesReference: every packet Encode makes carries the ICRC the
// reference computes over the IP and UDP headers the wire would send, for
// both families, any masked values, any pad.
func TestICRCMatchesReference(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	for _, op := range validOpcodes {
		for _, ends := range [][2]Endpoint{{v4a, v4b}, {v6a, v6b}, {v4b, v4a}} {
			for _, n := range []int{0, 1, 2, 3, 4, 5, 63, 64, 1021, 4096} {
				if !op.HasPayload() && n > 0 {
					continue
				}
				pkt := mustEncode(randHeader(r, op), payloadOf(n), ends[0], ends[1])
				want := refWireICRC(pkt, ends[0], ends[1])
				if got := binary.LittleEndian.Uint32(pkt[len(pkt)-4:]); got != want {
					t.Errorf("%v %d bytes %v→%v: ICRC %#08x, reference %#08x", op, n, ends[0].GID, ends[1].GID, got, want)
				}
			}
		}
	}
	// Different masked values in the real headers do not matter.
	pkt := mustEncode(randHeader(r, RCSendOnly), payloadOf(5), v4a, v4b)
	body := pkt[:len(pkt)-4]
	udpLen := 8 + len(pkt)
	want := binary.LittleEndian.Uint32(pkt[len(pkt)-4:])
	for _, tos := range []uint8{0, 0x03, 0xb8} {
		for _, ttl := range []uint8{1, 64, 255} {
			ip := refIPv4(v4a.GID[12:], v4b.GID[12:], 0, 0x4000, tos, ttl, udpLen)
			if got := refICRC(ip, refUDP(v4a.Port, v4b.Port, udpLen, uint16(tos)<<8|uint16(ttl)), body); got != want {
				t.Errorf("tos %#x ttl %d: reference %#08x, packet %#08x", tos, ttl, got, want)
			}
		}
	}
	pkt = mustEncode(randHeader(r, RCSendOnly), payloadOf(5), v6a, v6b)
	body, want = pkt[:len(pkt)-4], binary.LittleEndian.Uint32(pkt[len(pkt)-4:])
	for _, tc := range []uint8{0, 0xff, 0x8a} {
		for _, flow := range []uint32{0, 1, 0xfffff} {
			ip := refIPv6(v6a.GID[:], v6b.GID[:], tc, flow, uint8(flow), udpLen)
			if got := refICRC(ip, refUDP(v6a.Port, v6b.Port, udpLen, 0), body); got != want {
				t.Errorf("tclass %#x flow %#x: reference %#08x, packet %#08x", tc, flow, got, want)
			}
		}
	}
}
