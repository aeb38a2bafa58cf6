package roce

import (
	"bytes"
	"encoding/binary"
	"math/rand/v2"
	"testing"
)

// fuzzEnds picks the endpoints of a fuzz input.
func fuzzEnds(mode uint8) (src, dst Endpoint) {
	if mode&1 != 0 {
		return v6a, v6b
	}
	return v4a, v4b
}

// seedPackets are valid packets of each transport and header layout, plus
// edge cases, for the fuzzers' corpora.
func seedPackets() [][]byte {
	r := rand.New(rand.NewPCG(5, 6))
	var out [][]byte
	for i, op := range validOpcodes {
		n := 0
		if op.HasPayload() {
			n = i % 9
		}
		src, dst := v4a, v4b
		out = append(out, mustEncode(randHeader(r, op), payloadOf(n), src, dst))
	}
	return out
}

// FuzzDecode: Decode never panics; a packet it accepts re-encodes to the
// same bytes, but for reserved bits, which Decode ignores and Encode
// zeroes. mode bit 0 selects IPv6 endpoints; bit 1 recomputes the input's
// ICRC first, so that the fuzzer reaches the checks behind it.
func FuzzDecode(f *testing.F) {
	for _, p := range seedPackets() {
		f.Add(p, uint8(0))
		f.Add(p, uint8(2))
		f.Add(p[:len(p)-1], uint8(2))
	}
	for _, g := range goldenPackets {
		if g.src != v4a && g.src != v6a {
			continue // the fuzzer sends a → b only
		}
		mode := uint8(0)
		if !isIPv4(&g.src.GID) {
			mode = 1
		}
		f.Add(mustEncode(g.h, []byte(g.payload), g.src, g.dst), mode)
	}
	f.Add([]byte{}, uint8(0))
	f.Add(make([]byte, 16), uint8(2))
	f.Add([]byte{0x11, 0x30, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0}, uint8(2)) // ACK, pad count 3, no AETH room
	f.Add([]byte{0x64, 0x01, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0}, uint8(3))             // version 1
	f.Fuzz(func(t *testing.T, pkt []byte, mode uint8) {
		src, dst := fuzzEnds(mode)
		if mode&2 != 0 && len(pkt) >= BTHLen+ICRCLen && len(pkt) <= maxPacketLen {
			pkt = reseal(bytes.Clone(pkt), src, dst)
		}
		var h Header
		payload, err := Decode(pkt, &h, src, dst)
		if err != nil {
			if payload != nil || h != (Header{}) {
				t.Fatalf("error %v with payload %v, header %+v", err, payload, h)
			}
			return
		}
		hl := HeaderLen(h.Opcode)
		if len(payload) > 0 && &payload[0] != &pkt[hl] {
			t.Fatal("payload does not alias the packet")
		}
		if hl+len(payload)+int(h.PadCount)+ICRCLen != len(pkt) {
			t.Fatalf("lengths: header %d payload %d pad %d, packet %d", hl, len(payload), h.PadCount, len(pkt))
		}
		out := make([]byte, len(pkt))
		n, err := Encode(out, &h, payload, src, dst)
		if err != nil {
			t.Fatalf("re-encoding %+v: %v", h, err)
		}
		want := bytes.Clone(pkt)
		want[4] &= 0xc0 // resv6
		want[8] &= 0x80 // resv7
		if h.Opcode.HasDETH() {
			want[BTHLen+4] = 0 // DETH resv8
		}
		if !bytes.Equal(want, pkt) {
			reseal(want, src, dst)
		}
		// Decode also takes a packet sealed for an IPv4 id other than 0,
		// as rxe's are (ipid.go: about one ICRC in 65,536 fits some id),
		// and re-encoding seals for id 0: such a packet's ICRC differs,
		// and nothing else may.
		cmp := n
		if crc, _ := icrc(pkt, &src, &dst, ipv4ID, ipv4Flags); crc != binary.LittleEndian.Uint32(pkt[len(pkt)-ICRCLen:]) {
			cmp = n - ICRCLen
		}
		if n != len(want) || !bytes.Equal(out[:cmp], want[:cmp]) {
			t.Fatalf("re-encoded\n% x\nreceived (reserved bits cleared)\n% x", out[:n], want)
		}
	})
}

// FuzzEncode: any header and payload either encode or fail with the error
// the fields call for, and what encodes decodes back to the same header
// (restricted to the opcode's headers) and payload.
func FuzzEncode(f *testing.F) {
	r := rand.New(rand.NewPCG(8, 9))
	for i, op := range validOpcodes {
		h := randHeader(r, op)
		f.Add(uint8(op), uint8(i), h.PKey, h.DestQPN, h.PSN, h.VA, h.RKey, h.DMALen, h.Syndrome, h.MSN, h.Imm, h.QKey, h.SrcQPN, payloadOf(i%5))
	}
	f.Add(uint8(0x12), uint8(0), uint16(0), uint32(0), uint32(0), uint64(0), uint32(0), uint32(0), uint8(0), uint32(0), uint32(0), uint32(0), uint32(0), []byte{})
	f.Add(uint8(RCAck), uint8(0xff), uint16(0xffff), uint32(1<<24), uint32(1<<24), uint64(0), uint32(0), uint32(0), uint8(0xff), uint32(1<<24), uint32(0), uint32(0), uint32(0), []byte{1})
	f.Fuzz(func(t *testing.T, op, flags uint8, pkey uint16, qpn, psn uint32, va uint64, rkey, dmalen uint32,
		syn uint8, msn, imm, qkey, srcqp uint32, payload []byte) {
		h := Header{
			Opcode: Opcode(op), SE: flags&1 != 0, MigReq: flags&2 != 0, FECN: flags&4 != 0, BECN: flags&8 != 0,
			AckReq: flags&16 != 0, TVer: flags >> 7, PadCount: flags >> 5 & 3,
			PKey: pkey, DestQPN: qpn, PSN: psn, VA: va, RKey: rkey, DMALen: dmalen,
			Syndrome: syn, MSN: msn, Imm: imm, QKey: qkey, SrcQPN: srcqp,
		}
		src, dst := fuzzEnds(flags >> 6)
		o := h.Opcode
		var want error
		switch {
		case !o.Valid():
			want = ErrOpcode
		case h.TVer != 0:
			want = ErrVersion
		case qpn > Mask24 || psn > Mask24 || o.HasAETH() && msn > Mask24 || o.HasDETH() && srcqp > Mask24:
			want = ErrRange
		case len(payload) > 0 && !o.HasPayload():
			want = ErrLength
		}
		buf := make([]byte, MaxPacketLen(len(payload)))
		n, err := Encode(buf, &h, payload, src, dst)
		if err != want {
			t.Fatalf("Encode(%+v) = %v, want %v", h, err, want)
		}
		if err != nil {
			return
		}
		var got Header
		p, err := Decode(buf[:n], &got, src, dst)
		if err != nil {
			t.Fatalf("Decode: %v", err)
		}
		h.PadCount = uint8(-len(payload) & 3)
		if !o.HasRETH() {
			h.VA, h.RKey, h.DMALen = 0, 0, 0
		}
		if !o.HasAETH() {
			h.Syndrome, h.MSN = 0, 0
		}
		if !o.HasImm() {
			h.Imm = 0
		}
		if !o.HasDETH() {
			h.QKey, h.SrcQPN = 0, 0
		}
		if got != h || !bytes.Equal(p, payload) {
			t.Fatalf("decoded %+v %x, want %+v %x", got, p, h, payload)
		}
	})
}
