package roce

import "encoding/binary"

// Decode checks the packet b (a UDP payload: BTH to ICRC) received from src
// by dst, fills h with its headers and returns its payload, which aliases b
// and excludes pad and ICRC. It checks, in this order: that the packet is no
// shorter than a BTH and ICRC and no longer than a UDP datagram holds, the
// ICRC (so a corrupted bit anywhere the ICRC covers is ErrICRC), the
// transport version, the opcode, the length against the opcode's headers,
// the pad count and pad bytes. On error h is not modified.
func Decode(b []byte, h *Header, src, dst Endpoint) ([]byte, error) {
	n := len(b)
	if n < BTHLen+ICRCLen {
		return nil, ErrTruncated
	}
	if n > maxPacketLen {
		return nil, ErrLength
	}
	crc, ok := icrc(b, &src, &dst, ipv4ID, ipv4Flags)
	if !ok {
		return nil, ErrAddrFamily
	}
	if want := binary.LittleEndian.Uint32(b[n-ICRCLen:]); crc != want && !rxeICRC(crc, want, n, &src, &dst) {
		return nil, ErrICRC
	}
	if b[1]&0x0f != 0 {
		return nil, ErrVersion
	}
	op := Opcode(b[0])
	info := &ops[op]
	if info.flags == 0 {
		return nil, ErrOpcode
	}
	hl := int(info.hdrLen)
	if n < hl+ICRCLen {
		return nil, ErrTruncated
	}
	body := n - hl - ICRCLen // payload and pad
	if body&3 != 0 || body > 0 && info.flags&fPayload == 0 {
		return nil, ErrLength
	}
	pad := int(b[1] >> 4 & 3)
	if pad > body {
		return nil, ErrPad
	}
	end := hl + body - pad
	for _, v := range b[end : hl+body] {
		if v != 0 {
			return nil, ErrPad
		}
	}

	f := info.flags
	*h = Header{
		Opcode:   op,
		SE:       b[1]&0x80 != 0,
		MigReq:   b[1]&0x40 != 0,
		PadCount: uint8(pad),
		PKey:     binary.BigEndian.Uint16(b[2:]),
		FECN:     b[4]&0x80 != 0,
		BECN:     b[4]&0x40 != 0,
		DestQPN:  binary.BigEndian.Uint32(b[4:]) & Mask24,
		AckReq:   b[8]&0x80 != 0,
		PSN:      binary.BigEndian.Uint32(b[8:]) & Mask24,
	}
	off := BTHLen
	if f&fDeth != 0 {
		h.QKey = binary.BigEndian.Uint32(b[off:])
		h.SrcQPN = binary.BigEndian.Uint32(b[off+4:]) & Mask24
		off += DETHLen
	}
	if f&fReth != 0 {
		h.VA = binary.BigEndian.Uint64(b[off:])
		h.RKey = binary.BigEndian.Uint32(b[off+8:])
		h.DMALen = binary.BigEndian.Uint32(b[off+12:])
		off += RETHLen
	}
	if f&fAeth != 0 {
		a := binary.BigEndian.Uint32(b[off:])
		h.Syndrome = uint8(a >> 24)
		h.MSN = a & Mask24
		off += AETHLen
	}
	if f&fImm != 0 {
		h.Imm = binary.BigEndian.Uint32(b[off:])
	}
	return b[hl:end:end], nil
}

// rxeICRC reports whether a packet of n bytes from src to dst whose ICRC
// is want, not the crc computed for the IPv4 id 0 that Seal assumes, was
// sent with another id: rxe numbers its datagrams and sends from a port of
// its own; the id is not ours to see (ipid.go). A packet from the port we
// share with our peers was sent the way Seal assumes, with id 0. Off the
// hot path: Decode calls it only for an ICRC that does not match.
func rxeICRC(crc, want uint32, n int, src, dst *Endpoint) bool {
	if src.Port == dst.Port || !isIPv4(&src.GID) {
		return false
	}
	_, ok := solveIPID(crc, want, n)
	return ok
}
