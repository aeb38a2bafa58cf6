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
	if err := checkICRC(b, &src, &dst); err != nil {
		return nil, err
	}
	info, end, pad, err := checkLayout(b)
	if err != nil {
		return nil, err
	}
	decodeHeaders(b, h, info.flags, pad)
	hl := int(info.hdrLen)
	return b[hl:end:end], nil
}

// checkICRC checks that b is no shorter than a BTH and ICRC and no longer
// than a UDP datagram holds, then its ICRC.
func checkICRC(b []byte, src, dst *Endpoint) error {
	n := len(b)
	if n < BTHLen+ICRCLen {
		return ErrTruncated
	}
	if n > maxPacketLen {
		return ErrLength
	}
	crc, ok := icrc(b, src, dst, ipv4ID, ipv4Flags)
	if !ok {
		return ErrAddrFamily
	}
	if want := binary.LittleEndian.Uint32(b[n-ICRCLen:]); crc != want {
		// rxe numbers its datagrams and sends from a port of its own; the
		// id is not ours to see (ipid.go). A packet from the port we share
		// with our peers was sent the way Seal assumes, with id 0.
		if src.Port == dst.Port || !isIPv4(&src.GID) {
			return ErrICRC
		}
		if _, ok := solveIPID(crc, want, n); !ok {
			return ErrICRC
		}
	}
	return nil
}

// checkLayout checks b's transport version, opcode, length against the
// opcode's headers, pad count and pad bytes. It returns the opcode's
// description, where the payload ends and the pad count.
func checkLayout(b []byte) (info *opInfo, end, pad int, err error) {
	n := len(b)
	if b[1]&0x0f != 0 {
		return nil, 0, 0, ErrVersion
	}
	info = &ops[Opcode(b[0])]
	if info.flags == 0 {
		return nil, 0, 0, ErrOpcode
	}
	hl := int(info.hdrLen)
	if n < hl+ICRCLen {
		return nil, 0, 0, ErrTruncated
	}
	body := n - hl - ICRCLen // payload and pad
	if body&3 != 0 || body > 0 && info.flags&fPayload == 0 {
		return nil, 0, 0, ErrLength
	}
	pad = int(b[1] >> 4 & 3)
	if pad > body {
		return nil, 0, 0, ErrPad
	}
	end = hl + body - pad
	for _, v := range b[end : hl+body] {
		if v != 0 {
			return nil, 0, 0, ErrPad
		}
	}
	return info, end, pad, nil
}

// decodeHeaders fills h from the BTH of b and the extended headers that the
// opcode's flags f say follow it, in their wire order.
func decodeHeaders(b []byte, h *Header, f uint16, pad int) {
	*h = Header{
		Opcode:   Opcode(b[0]),
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
}
