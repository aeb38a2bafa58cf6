package roce

import (
	"bytes"
	"testing"
)

// Golden packets, checked by hand against the IBA layout (vol. 1, 9.2-9.3:
// BTH, then DETH, RETH, AETH, ImmDt in that order, all big-endian) and, for
// the ICRC, against the reference implementation of icrc_test.go.
//
// BTH (12 bytes):
//
//	byte 0     opcode
//	byte 1     SE(7) MigReq(6) PadCnt(5-4) TVer(3-0)
//	bytes 2-3  P_Key
//	byte 4     FECN(7) BECN(6) reserved(5-0)    (resv8a)
//	bytes 5-7  DestQP
//	byte 8     AckReq(7) reserved(6-0)
//	bytes 9-11 PSN
var goldenPackets = []struct {
	name     string
	h        Header
	payload  string
	src, dst Endpoint
	wire     string
}{
	{
		name: "RC SEND_ONLY, 3 bytes, pad 1",
		h:    Header{Opcode: RCSendOnly, AckReq: true, PKey: 0xffff, DestQPN: 0x11, PSN: 1},
		// 10.0.0.1:49152 → 10.0.0.2:4791
		src: v4a, dst: v4b, payload: "hi!",
		wire: `04            opcode RC_SEND_ONLY
		       10            SE 0, MigReq 0, PadCnt 1, TVer 0
		       ffff          P_Key
		       00 000011     resv8a, DestQP 0x11
		       80 000001     AckReq, PSN 1
		       686921        "hi!"
		       00            pad
		       c5916fcc      ICRC 0xcc6f91c5, little-endian`,
	},
	{
		name: "RC RDMA_WRITE_FIRST with RETH",
		h: Header{Opcode: RCWriteFirst, MigReq: true, PKey: 0xffff, DestQPN: 0x123456, PSN: 0xfffffe,
			VA: 0x00007f0012345678, RKey: 0xdeadbeef, DMALen: 8192},
		src: v4a, dst: v4b, payload: "\x01\x02\x03\x04",
		wire: `06            opcode RC_RDMA_WRITE_FIRST
		       40            MigReq, PadCnt 0
		       ffff          P_Key
		       00 123456     DestQP
		       00 fffffe     PSN
		       00007f0012345678  RETH VA
		       deadbeef          RETH R_Key
		       00002000          RETH DMA Length 8192
		       01020304      payload
		       38759a74      ICRC 0x749a7538`,
	},
	{
		name: "RC ACKNOWLEDGE with AETH",
		h: Header{Opcode: RCAck, PKey: 0xffff, DestQPN: 0x12, PSN: 0xabcd,
			Syndrome: AckSyndrome(CreditsInvalid), MSN: 7},
		// 10.0.0.2:4791 → 10.0.0.1:49152, the way back
		src: v4b, dst: v4a,
		wire: `11            opcode RC_ACKNOWLEDGE
		       00
		       ffff
		       00 000012     DestQP
		       00 00abcd     PSN
		       1f 000007     AETH: syndrome ACK with credit count 0b11111, MSN 7
		       eed4f824      ICRC 0x24f8d4ee`,
	},
	{
		name: "UD SEND_ONLY_WITH_IMMEDIATE over IPv6, pad 2",
		h: Header{Opcode: UDSendOnlyImm, SE: true, PKey: 0xffff, DestQPN: 0x42,
			QKey: 0x80010000, SrcQPN: 0x33, Imm: 0xcafef00d},
		// [fd00::1]:50000 → [fd00::2]:4791
		src: v6a, dst: v6b, payload: "ping!!",
		wire: `65            opcode UD_SEND_ONLY_WITH_IMMEDIATE
		       a0            SE, PadCnt 2
		       ffff
		       00 000042     DestQP
		       00 000000     PSN 0
		       80010000      DETH Q_Key
		       00 000033     DETH reserved, SrcQP
		       cafef00d      ImmDt
		       70696e672121  "ping!!"
		       0000          pad
		       06db0a7b      ICRC 0x7b0adb06`,
	},
}

// hexFields reads the first field of each line as hex.
func hexFields(s string) []byte {
	var out []byte
	for _, line := range bytes.Split([]byte(s), []byte("\n")) {
		f := bytes.Fields(line)
		// Leading fields that are hex make up the bytes; the comment starts
		// at the first field that is not.
		for _, w := range f {
			if len(w)%2 != 0 || !isHex(w) {
				break
			}
			out = append(out, unhex(string(w))...)
		}
	}
	return out
}

func isHex(w []byte) bool {
	for _, c := range w {
		if !('0' <= c && c <= '9' || 'a' <= c && c <= 'f') {
			return false
		}
	}
	return true
}

func TestGolden(t *testing.T) {
	for _, g := range goldenPackets {
		t.Run(g.name, func(t *testing.T) {
			want := hexFields(g.wire)
			got := mustEncode(g.h, []byte(g.payload), g.src, g.dst)
			if !bytes.Equal(got, want) {
				t.Fatalf("Encode\n% x\nwant\n% x", got, want)
			}
			if icrc := refWireICRC(want, g.src, g.dst); !bytes.Equal(want[len(want)-4:], []byte{byte(icrc), byte(icrc >> 8), byte(icrc >> 16), byte(icrc >> 24)}) {
				t.Fatalf("golden ICRC is not the reference's %#08x", icrc)
			}
			var h Header
			p, err := Decode(want, &h, g.src, g.dst)
			wantH := g.h
			wantH.PadCount = uint8(-len(g.payload) & 3)
			if err != nil || h != wantH || string(p) != g.payload {
				t.Fatalf("Decode = %v, %+v, %q", err, h, p)
			}
		})
	}
}
