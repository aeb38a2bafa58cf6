package roce

import (
	"testing"

	"github.com/rdmavisor/rdmavisor/internal/verbs"
)

// Positions of a packet in its message.
const (
	F = "first"
	M = "middle"
	L = "last"
	O = "only"
)

// ibaOpcodes is IBA table 38 and rxe_opcode.c written out, independently of
// the package's table: each opcode's name, header length, headers, whether
// it may carry a payload, position and operation.
var ibaOpcodes = []struct {
	op                           Opcode
	name                         string
	hdrLen                       int
	reth, aeth, imm, deth, pay   bool
	pos                          string
	send, write, rreq, rresp, ak bool
}{
	{RCSendFirst, "RC_SEND_FIRST", 12, false, false, false, false, true, F, true, false, false, false, false},
	{RCSendMiddle, "RC_SEND_MIDDLE", 12, false, false, false, false, true, M, true, false, false, false, false},
	{RCSendLast, "RC_SEND_LAST", 12, false, false, false, false, true, L, true, false, false, false, false},
	{RCSendLastImm, "RC_SEND_LAST_WITH_IMMEDIATE", 16, false, false, true, false, true, L, true, false, false, false, false},
	{RCSendOnly, "RC_SEND_ONLY", 12, false, false, false, false, true, O, true, false, false, false, false},
	{RCSendOnlyImm, "RC_SEND_ONLY_WITH_IMMEDIATE", 16, false, false, true, false, true, O, true, false, false, false, false},
	{RCWriteFirst, "RC_RDMA_WRITE_FIRST", 28, true, false, false, false, true, F, false, true, false, false, false},
	{RCWriteMiddle, "RC_RDMA_WRITE_MIDDLE", 12, false, false, false, false, true, M, false, true, false, false, false},
	{RCWriteLast, "RC_RDMA_WRITE_LAST", 12, false, false, false, false, true, L, false, true, false, false, false},
	{RCWriteLastImm, "RC_RDMA_WRITE_LAST_WITH_IMMEDIATE", 16, false, false, true, false, true, L, false, true, false, false, false},
	{RCWriteOnly, "RC_RDMA_WRITE_ONLY", 28, true, false, false, false, true, O, false, true, false, false, false},
	{RCWriteOnlyImm, "RC_RDMA_WRITE_ONLY_WITH_IMMEDIATE", 32, true, false, true, false, true, O, false, true, false, false, false},
	{RCReadRequest, "RC_RDMA_READ_REQUEST", 28, true, false, false, false, false, O, false, false, true, false, false},
	{RCReadResponseFirst, "RC_RDMA_READ_RESPONSE_FIRST", 16, false, true, false, false, true, F, false, false, false, true, false},
	{RCReadResponseMiddle, "RC_RDMA_READ_RESPONSE_MIDDLE", 12, false, false, false, false, true, M, false, false, false, true, false},
	{RCReadResponseLast, "RC_RDMA_READ_RESPONSE_LAST", 16, false, true, false, false, true, L, false, false, false, true, false},
	{RCReadResponseOnly, "RC_RDMA_READ_RESPONSE_ONLY", 16, false, true, false, false, true, O, false, false, false, true, false},
	{RCAck, "RC_ACKNOWLEDGE", 16, false, true, false, false, false, O, false, false, false, false, true},
	{UCSendFirst, "UC_SEND_FIRST", 12, false, false, false, false, true, F, true, false, false, false, false},
	{UCSendMiddle, "UC_SEND_MIDDLE", 12, false, false, false, false, true, M, true, false, false, false, false},
	{UCSendLast, "UC_SEND_LAST", 12, false, false, false, false, true, L, true, false, false, false, false},
	{UCSendLastImm, "UC_SEND_LAST_WITH_IMMEDIATE", 16, false, false, true, false, true, L, true, false, false, false, false},
	{UCSendOnly, "UC_SEND_ONLY", 12, false, false, false, false, true, O, true, false, false, false, false},
	{UCSendOnlyImm, "UC_SEND_ONLY_WITH_IMMEDIATE", 16, false, false, true, false, true, O, true, false, false, false, false},
	{UCWriteFirst, "UC_RDMA_WRITE_FIRST", 28, true, false, false, false, true, F, false, true, false, false, false},
	{UCWriteMiddle, "UC_RDMA_WRITE_MIDDLE", 12, false, false, false, false, true, M, false, true, false, false, false},
	{UCWriteLast, "UC_RDMA_WRITE_LAST", 12, false, false, false, false, true, L, false, true, false, false, false},
	{UCWriteLastImm, "UC_RDMA_WRITE_LAST_WITH_IMMEDIATE", 16, false, false, true, false, true, L, false, true, false, false, false},
	{UCWriteOnly, "UC_RDMA_WRITE_ONLY", 28, true, false, false, false, true, O, false, true, false, false, false},
	{UCWriteOnlyImm, "UC_RDMA_WRITE_ONLY_WITH_IMMEDIATE", 32, true, false, true, false, true, O, false, true, false, false, false},
	{UDSendOnly, "UD_SEND_ONLY", 20, false, false, false, true, true, O, true, false, false, false, false},
	{UDSendOnlyImm, "UD_SEND_ONLY_WITH_IMMEDIATE", 24, false, false, true, true, true, O, true, false, false, false, false},
}

func TestOpcodes(t *testing.T) {
	tests := ibaOpcodes
	if len(tests) != len(validOpcodes) {
		t.Fatalf("table has %d opcodes, validOpcodes %d", len(tests), len(validOpcodes))
	}
	seen := map[Opcode]bool{}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			op := tt.op
			seen[op] = true
			if !op.Valid() || op.String() != tt.name || HeaderLen(op) != tt.hdrLen {
				t.Errorf("Valid %v String %q HeaderLen %d, want true %q %d", op.Valid(), op.String(), HeaderLen(op), tt.name, tt.hdrLen)
			}
			if op.HasRETH() != tt.reth || op.HasAETH() != tt.aeth || op.HasImm() != tt.imm || op.HasDETH() != tt.deth || op.HasPayload() != tt.pay {
				t.Errorf("RETH %v AETH %v Imm %v DETH %v payload %v, want %v %v %v %v %v",
					op.HasRETH(), op.HasAETH(), op.HasImm(), op.HasDETH(), op.HasPayload(), tt.reth, tt.aeth, tt.imm, tt.deth, tt.pay)
			}
			pos := map[string]bool{F: op.IsFirst(), M: op.IsMiddle(), L: op.IsLast(), O: op.IsOnly()}
			for p, v := range pos {
				if v != (p == tt.pos) {
					t.Errorf("Is%s = %v, want position %s", p, v, tt.pos)
				}
			}
			if op.StartsMessage() != (tt.pos == F || tt.pos == O) || op.EndsMessage() != (tt.pos == L || tt.pos == O) {
				t.Errorf("StartsMessage %v EndsMessage %v at position %s", op.StartsMessage(), op.EndsMessage(), tt.pos)
			}
			if op.IsSend() != tt.send || op.IsWrite() != tt.write || op.IsReadRequest() != tt.rreq || op.IsReadResponse() != tt.rresp || op.IsAck() != tt.ak {
				t.Errorf("send %v write %v readreq %v readresp %v ack %v", op.IsSend(), op.IsWrite(), op.IsReadRequest(), op.IsReadResponse(), op.IsAck())
			}
			if op.IsResponse() != (tt.rresp || tt.ak) {
				t.Errorf("IsResponse = %v", op.IsResponse())
			}
			want := map[string]verbs.QPType{"RC": verbs.QPTypeRC, "UC": verbs.QPTypeUC, "UD": verbs.QPTypeUD}[tt.name[:2]]
			if op.Transport() != want {
				t.Errorf("Transport = %v, want %v", op.Transport(), want)
			}
		})
	}
	for i := range 256 {
		op := Opcode(i)
		if seen[op] {
			continue
		}
		if op.Valid() || HeaderLen(op) != 0 || op.Transport() != 0 || op.HasPayload() || op.IsOnly() || op.IsSend() {
			t.Errorf("%#x: not an opcode we speak, but Valid %v HeaderLen %d", i, op.Valid(), HeaderLen(op))
		}
		if s := op.String(); s == "" || s[0] != 'O' {
			t.Errorf("%#x: String %q", i, s)
		}
	}
}

func TestSyndrome(t *testing.T) {
	tests := []struct {
		syn   uint8
		kind  AckKind
		value uint8
	}{
		{AckSyndrome(0), KindAck, 0},
		{AckSyndrome(CreditsInvalid), KindAck, 0x1f},
		{AckSyndrome(0x25), KindAck, 5}, // credits are 5 bits
		{RNRNakSyndrome(14), KindRNRNak, 14},
		{NakSyndrome(NakPSNSequence), KindNak, 0},
		{NakSyndrome(NakInvalidRequest), KindNak, 1},
		{NakSyndrome(NakRemoteAccess), KindNak, 2},
		{NakSyndrome(NakRemoteOperational), KindNak, 3},
		{NakSyndrome(NakInvalidRDRequest), KindNak, 4},
		{0x40, KindReserved, 0},
		{0x80 | 0x61, KindNak, 1}, // bit 7 is reserved
	}
	for _, tt := range tests {
		h := Header{Opcode: RCAck, Syndrome: tt.syn}
		if k, v := h.AckKind(); k != tt.kind || v != tt.value {
			t.Errorf("syndrome %#02x: %v/%d, want %v/%d", tt.syn, k, v, tt.kind, tt.value)
		}
	}
	// IBA table 44: the bit patterns.
	if RNRNakSyndrome(0x1f) != 0b0011_1111 || NakSyndrome(NakRemoteAccess) != 0b0110_0010 || AckSyndrome(3) != 0b0000_0011 {
		t.Error("syndrome bit patterns differ from IBA table 44")
	}
	for s := range 256 {
		k, v := ParseSyndrome(uint8(s))
		if uint8(k)<<5|v != uint8(s)&0x7f {
			t.Errorf("ParseSyndrome(%#x) = %v, %d", s, k, v)
		}
	}
}

// TestOpcodeLengths holds Decode to IBA's packet length rules for every
// opcode in ibaOpcodes, by hand-built packets: headers of exactly the
// opcode's length, a payload only where the opcode carries one, a length a
// multiple of 4, and pad bytes taken from the payload.
func TestOpcodeLengths(t *testing.T) {
	packet := func(op Opcode, hdrLen, body, pad int) []byte {
		b := make([]byte, hdrLen+body+ICRCLen)
		b[0], b[1] = byte(op), byte(pad<<4)
		return reseal(b, v4a, v4b)
	}
	for _, tt := range ibaOpcodes {
		t.Run(tt.name, func(t *testing.T) {
			tests := []struct {
				name      string
				b         []byte
				wantErr   error
				wantBytes int
			}{
				{"headers only", packet(tt.op, tt.hdrLen, 0, 0), nil, 0},
				{"4 bytes of payload", packet(tt.op, tt.hdrLen, 4, 0), map[bool]error{true: nil, false: ErrLength}[tt.pay], 4},
				{"1 byte and 3 of pad", packet(tt.op, tt.hdrLen, 4, 3), map[bool]error{true: nil, false: ErrLength}[tt.pay], 1},
				{"2 bytes unaligned", packet(tt.op, tt.hdrLen, 2, 0), ErrLength, 0},
				{"pad over an empty payload", packet(tt.op, tt.hdrLen, 0, 1), ErrPad, 0},
			}
			if tt.hdrLen > BTHLen {
				// An extended header cut short; a cut BTH is TestDecodeTruncated's.
				tests = append(tests, struct {
					name      string
					b         []byte
					wantErr   error
					wantBytes int
				}{"extended headers cut by 4", packet(tt.op, tt.hdrLen-4, 0, 0), ErrTruncated, 0})
			}
			for _, c := range tests {
				var h Header
				p, err := Decode(c.b, &h, v4a, v4b)
				if err != c.wantErr {
					t.Errorf("%s (%d bytes): %v, want %v", c.name, len(c.b), err, c.wantErr)
					continue
				}
				if err == nil && (len(p) != c.wantBytes || h.Opcode != tt.op) {
					t.Errorf("%s: %v with %d bytes of payload, want %v with %d", c.name, h.Opcode, len(p), tt.op, c.wantBytes)
				}
			}
		})
	}
}

// TestRequestOpcode checks RequestOpcode against ibaOpcodes for every
// transport, work request and position: the answer is the one opcode of that
// transport, operation and position (with immediate data on the last packet
// of a *_WITH_IMM request), or not ok where IBA has none.
func TestRequestOpcode(t *testing.T) {
	kinds := []struct {
		wr  verbs.WROpcode
		imm bool
		is  func(send, write, rreq bool) bool
	}{
		{verbs.WRSend, false, func(s, _, _ bool) bool { return s }},
		{verbs.WRSendWithImm, true, func(s, _, _ bool) bool { return s }},
		{verbs.WRRDMAWrite, false, func(_, w, _ bool) bool { return w }},
		{verbs.WRRDMAWriteWithImm, true, func(_, w, _ bool) bool { return w }},
		{verbs.WRRDMARead, false, func(_, _, r bool) bool { return r }},
		{verbs.WROpcode(99), false, func(_, _, _ bool) bool { return false }},
	}
	transports := map[verbs.QPType]string{verbs.QPTypeRC: "RC", verbs.QPTypeUC: "UC", verbs.QPTypeUD: "UD", 0: "none"}
	positions := []struct {
		first, last bool
		pos         string
	}{{true, false, F}, {false, false, M}, {false, true, L}, {true, true, O}}
	found := 0
	for tr, prefix := range transports {
		for _, k := range kinds {
			for _, p := range positions {
				var want Opcode
				ok := false
				for _, o := range ibaOpcodes {
					if o.name[:2] == prefix && k.is(o.send, o.write, o.rreq) && o.pos == p.pos && o.imm == (k.imm && p.last) {
						if ok {
							t.Fatalf("ibaOpcodes: both %v and %v match", want, o.op)
						}
						want, ok = o.op, true
					}
				}
				got, gotOK := RequestOpcode(tr, k.wr, p.first, p.last)
				if gotOK != ok || ok && got != want {
					t.Errorf("RequestOpcode(%s, %v, first %v, last %v) = %v, %v; want %v, %v", prefix, k.wr, p.first, p.last, got, gotOK, want, ok)
				}
				if ok {
					found++
				}
			}
		}
	}
	// On RC and UC each of the 4 SEND and WRITE requests has an opcode at
	// each of the 4 positions; then the whole READ on RC and UD's 2 SENDs.
	if want := 2*4*4 + 1 + 2; found != want {
		t.Errorf("%d combinations have an opcode, want %d", found, want)
	}
}
