package roce

import "encoding/binary"

// PutHeaders writes the BTH and the extended headers of h.Opcode at the
// start of b and returns their length, HeaderLen(h.Opcode). The pad count
// is written as 0 (h.PadCount is ignored): Seal sets it.
func PutHeaders(b []byte, h *Header) (int, error) {
	op := h.Opcode
	info := &ops[op]
	if info.flags == 0 {
		return 0, ErrOpcode
	}
	if h.TVer != 0 {
		return 0, ErrVersion
	}
	f := info.flags
	if h.DestQPN > Mask24 || h.PSN > Mask24 ||
		f&fAeth != 0 && h.MSN > Mask24 || f&fDeth != 0 && h.SrcQPN > Mask24 {
		return 0, ErrRange
	}
	n := int(info.hdrLen)
	if len(b) < n {
		return 0, ErrShortBuffer
	}
	b = b[:n]
	b[0] = byte(op)
	b[1] = bit(h.SE, 7) | bit(h.MigReq, 6)
	binary.BigEndian.PutUint16(b[2:], h.PKey)
	binary.BigEndian.PutUint32(b[4:], uint32(bit(h.FECN, 7)|bit(h.BECN, 6))<<24|h.DestQPN)
	binary.BigEndian.PutUint32(b[8:], uint32(bit(h.AckReq, 7))<<24|h.PSN)
	off := BTHLen
	if f&fDeth != 0 {
		binary.BigEndian.PutUint32(b[off:], h.QKey)
		binary.BigEndian.PutUint32(b[off+4:], h.SrcQPN) // resv8 is the top byte
		off += DETHLen
	}
	if f&fReth != 0 {
		binary.BigEndian.PutUint64(b[off:], h.VA)
		binary.BigEndian.PutUint32(b[off+8:], h.RKey)
		binary.BigEndian.PutUint32(b[off+12:], h.DMALen)
		off += RETHLen
	}
	if f&fAeth != 0 {
		binary.BigEndian.PutUint32(b[off:], uint32(h.Syndrome)<<24|h.MSN)
		off += AETHLen
	}
	if f&fImm != 0 {
		binary.BigEndian.PutUint32(b[off:], h.Imm)
	}
	return n, nil
}

func bit(v bool, n uint) byte {
	if v {
		return 1 << n
	}
	return 0
}

// Seal finishes a packet whose headers (hdrLen bytes, from PutHeaders) and
// payload (payloadLen bytes at b[hdrLen:]) are in place: it sets the BTH pad
// count, zeroes the pad up to a 4-byte boundary, appends the ICRC for a
// datagram from src to dst, and returns the packet's length, the UDP payload
// to send. b must hold up to 3 pad bytes and the ICRC after the payload.
func Seal(b []byte, hdrLen, payloadLen int, src, dst Endpoint) (int, error) {
	if hdrLen < BTHLen || hdrLen > len(b) {
		if hdrLen >= BTHLen {
			return 0, ErrShortBuffer
		}
		return 0, ErrLength
	}
	op := Opcode(b[0])
	if !op.Valid() {
		return 0, ErrOpcode
	}
	if HeaderLen(op) != hdrLen || payloadLen < 0 || payloadLen > maxPacketLen ||
		payloadLen > 0 && !op.HasPayload() {
		return 0, ErrLength
	}
	pad := -payloadLen & 3
	n := hdrLen + payloadLen + pad + ICRCLen
	if n > maxPacketLen {
		return 0, ErrLength
	}
	if n > len(b) {
		return 0, ErrShortBuffer
	}
	if isIPv4(&src.GID) != isIPv4(&dst.GID) {
		return 0, ErrAddrFamily
	}
	pkt := b[:n]
	pkt[1] = pkt[1]&^0x30 | byte(pad)<<4
	clear(pkt[n-ICRCLen-pad : n-ICRCLen])
	crc, _ := icrc(pkt, &src, &dst, ipv4ID, ipv4Flags)
	binary.LittleEndian.PutUint32(pkt[n-ICRCLen:], crc)
	return n, nil
}

// Encode writes a whole packet into b: PutHeaders, the payload (which may
// overlap b) and Seal. It returns the packet's length. A buffer of
// MaxPacketLen(len(payload)) bytes is always long enough.
func Encode(b []byte, h *Header, payload []byte, src, dst Endpoint) (int, error) {
	n, err := PutHeaders(b, h)
	if err != nil {
		return 0, err
	}
	if len(payload) > 0 && !h.Opcode.HasPayload() {
		return 0, ErrLength
	}
	if n+len(payload) > len(b) {
		return 0, ErrShortBuffer
	}
	copy(b[n:], payload)
	return Seal(b, n, len(payload), src, dst)
}

// maxHeaderLen is the longest HeaderLen: RDMA WRITE ONLY with immediate.
const maxHeaderLen = BTHLen + RETHLen + ImmDtLen

// MaxPacketLen returns the longest packet (UDP payload) of any opcode with
// up to mtu bytes of payload: the size of a buffer that holds any packet on
// a path of that MTU.
func MaxPacketLen(mtu int) int {
	mtu = max(mtu, 0)
	return maxHeaderLen + (mtu+3)&^3 + ICRCLen
}
