package roce

import (
	"math/rand/v2"
	"net/netip"

	"github.com/rdmavisor/rdmavisor/internal/verbs"
)

func gid(s string) verbs.GID { return verbs.GIDFromAddr(netip.MustParseAddr(s)) }

// Endpoint pairs the tests send between: a → b.
var (
	v4a = Endpoint{GID: gid("10.0.0.1"), Port: 49152}
	v4b = Endpoint{GID: gid("10.0.0.2"), Port: DefaultPort}
	v6a = Endpoint{GID: gid("fd00::1"), Port: 50000}
	v6b = Endpoint{GID: gid("fd00::2"), Port: DefaultPort}
)

// validOpcodes lists every opcode the package speaks, by the IBA table,
// independently of the package's own table.
var validOpcodes = func() []Opcode {
	var ops []Opcode
	for op := RCSendFirst; op <= RCAck; op++ {
		ops = append(ops, op)
	}
	for op := UCSendFirst; op <= UCWriteOnlyImm; op++ {
		ops = append(ops, op)
	}
	return append(ops, UDSendOnly, UDSendOnlyImm)
}()

// randHeader returns a header for op with random values in every field op
// carries and zero in the others, as Decode fills it (but PadCount, which
// depends on the payload).
func randHeader(r *rand.Rand, op Opcode) Header {
	h := Header{
		Opcode:  op,
		SE:      r.IntN(2) == 0,
		MigReq:  r.IntN(2) == 0,
		PKey:    uint16(r.Uint32()),
		FECN:    r.IntN(2) == 0,
		BECN:    r.IntN(2) == 0,
		DestQPN: r.Uint32() & Mask24,
		AckReq:  r.IntN(2) == 0,
		PSN:     r.Uint32() & Mask24,
	}
	if op.HasRETH() {
		h.VA, h.RKey, h.DMALen = r.Uint64(), r.Uint32(), r.Uint32()
	}
	if op.HasAETH() {
		h.Syndrome, h.MSN = uint8(r.Uint32()), r.Uint32()&Mask24
	}
	if op.HasImm() {
		h.Imm = r.Uint32()
	}
	if op.HasDETH() {
		h.QKey, h.SrcQPN = r.Uint32(), r.Uint32()&Mask24
	}
	return h
}

// mustEncode encodes or panics; for building test inputs.
func mustEncode(h Header, payload []byte, src, dst Endpoint) []byte {
	b := make([]byte, MaxPacketLen(len(payload)))
	n, err := Encode(b, &h, payload, src, dst)
	if err != nil {
		panic(err)
	}
	return b[:n]
}

func payloadOf(n int) []byte {
	p := make([]byte, n)
	for i := range p {
		p[i] = byte(i*7 + 1)
	}
	return p
}

// reseal recomputes the ICRC of a hand-modified packet with the reference
// implementation, so a test reaches the checks after the ICRC.
func reseal(b []byte, src, dst Endpoint) []byte {
	putICRC(b, refWireICRC(b, src, dst))
	return b
}
