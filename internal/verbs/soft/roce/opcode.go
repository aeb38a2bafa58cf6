package roce

import (
	"fmt"

	"github.com/rdmavisor/rdmavisor/internal/verbs"
)

// Opcode is the BTH opcode (IBA table 38): the transport in bits 7-5, the
// operation in bits 4-0.
type Opcode uint8

// The opcodes this package speaks.
const (
	RCSendFirst          Opcode = 0x00
	RCSendMiddle         Opcode = 0x01
	RCSendLast           Opcode = 0x02
	RCSendLastImm        Opcode = 0x03
	RCSendOnly           Opcode = 0x04
	RCSendOnlyImm        Opcode = 0x05
	RCWriteFirst         Opcode = 0x06
	RCWriteMiddle        Opcode = 0x07
	RCWriteLast          Opcode = 0x08
	RCWriteLastImm       Opcode = 0x09
	RCWriteOnly          Opcode = 0x0a
	RCWriteOnlyImm       Opcode = 0x0b
	RCReadRequest        Opcode = 0x0c
	RCReadResponseFirst  Opcode = 0x0d
	RCReadResponseMiddle Opcode = 0x0e
	RCReadResponseLast   Opcode = 0x0f
	RCReadResponseOnly   Opcode = 0x10
	RCAck                Opcode = 0x11

	UCSendFirst    Opcode = 0x20
	UCSendMiddle   Opcode = 0x21
	UCSendLast     Opcode = 0x22
	UCSendLastImm  Opcode = 0x23
	UCSendOnly     Opcode = 0x24
	UCSendOnlyImm  Opcode = 0x25
	UCWriteFirst   Opcode = 0x26
	UCWriteMiddle  Opcode = 0x27
	UCWriteLast    Opcode = 0x28
	UCWriteLastImm Opcode = 0x29
	UCWriteOnly    Opcode = 0x2a
	UCWriteOnlyImm Opcode = 0x2b

	UDSendOnly    Opcode = 0x64
	UDSendOnlyImm Opcode = 0x65
)

// Header lengths in bytes.
const (
	BTHLen   = 12 // Base Transport Header
	RETHLen  = 16 // RDMA Extended Transport Header
	AETHLen  = 4  // ACK Extended Transport Header
	ImmDtLen = 4  // Immediate Data
	DETHLen  = 8  // Datagram Extended Transport Header
	ICRCLen  = 4  // Invariant CRC
)

// Per-opcode properties, as rxe_opcode.c's masks.
const (
	fReth uint16 = 1 << iota
	fAeth
	fImm
	fDeth
	fPayload
	fFirst
	fMiddle
	fLast
	fOnly
	fSend
	fWrite
	fReadReq
	fReadResp
	fAck
)

type opInfo struct {
	flags  uint16 // 0: not an opcode this package speaks
	hdrLen uint8
	name   string
}

var ops = buildOps()

func buildOps() (t [256]opInfo) {
	// The SEND and RDMA WRITE opcodes that RC and UC share, by offset.
	common := [...]struct {
		name  string
		flags uint16
	}{
		{"SEND_FIRST", fSend | fPayload | fFirst},
		{"SEND_MIDDLE", fSend | fPayload | fMiddle},
		{"SEND_LAST", fSend | fPayload | fLast},
		{"SEND_LAST_WITH_IMMEDIATE", fSend | fPayload | fLast | fImm},
		{"SEND_ONLY", fSend | fPayload | fOnly},
		{"SEND_ONLY_WITH_IMMEDIATE", fSend | fPayload | fOnly | fImm},
		{"RDMA_WRITE_FIRST", fWrite | fPayload | fFirst | fReth},
		{"RDMA_WRITE_MIDDLE", fWrite | fPayload | fMiddle},
		{"RDMA_WRITE_LAST", fWrite | fPayload | fLast},
		{"RDMA_WRITE_LAST_WITH_IMMEDIATE", fWrite | fPayload | fLast | fImm},
		{"RDMA_WRITE_ONLY", fWrite | fPayload | fOnly | fReth},
		{"RDMA_WRITE_ONLY_WITH_IMMEDIATE", fWrite | fPayload | fOnly | fReth | fImm},
	}
	set := func(op Opcode, name string, flags uint16) {
		n := BTHLen
		if flags&fReth != 0 {
			n += RETHLen
		}
		if flags&fAeth != 0 {
			n += AETHLen
		}
		if flags&fImm != 0 {
			n += ImmDtLen
		}
		if flags&fDeth != 0 {
			n += DETHLen
		}
		t[op] = opInfo{flags: flags, hdrLen: uint8(n), name: name}
	}
	for i, c := range common {
		set(RCSendFirst+Opcode(i), "RC_"+c.name, c.flags)
		set(UCSendFirst+Opcode(i), "UC_"+c.name, c.flags)
	}
	set(RCReadRequest, "RC_RDMA_READ_REQUEST", fReadReq|fOnly|fReth)
	set(RCReadResponseFirst, "RC_RDMA_READ_RESPONSE_FIRST", fReadResp|fPayload|fFirst|fAeth)
	set(RCReadResponseMiddle, "RC_RDMA_READ_RESPONSE_MIDDLE", fReadResp|fPayload|fMiddle)
	set(RCReadResponseLast, "RC_RDMA_READ_RESPONSE_LAST", fReadResp|fPayload|fLast|fAeth)
	set(RCReadResponseOnly, "RC_RDMA_READ_RESPONSE_ONLY", fReadResp|fPayload|fOnly|fAeth)
	set(RCAck, "RC_ACKNOWLEDGE", fAck|fOnly|fAeth)
	set(UDSendOnly, "UD_SEND_ONLY", fSend|fPayload|fOnly|fDeth)
	set(UDSendOnlyImm, "UD_SEND_ONLY_WITH_IMMEDIATE", fSend|fPayload|fOnly|fDeth|fImm)
	return t
}

func (o Opcode) has(f uint16) bool { return ops[o].flags&f != 0 }

// Valid reports whether o is an opcode this package speaks.
func (o Opcode) Valid() bool { return ops[o].flags != 0 }

// String returns the IBA name with the transport prefix, as rxe_opcode.c
// spells it: "RC_SEND_ONLY", "UD_SEND_ONLY_WITH_IMMEDIATE".
func (o Opcode) String() string {
	if n := ops[o].name; n != "" {
		return n
	}
	return fmt.Sprintf("Opcode(%#02x)", uint8(o))
}

// HeaderLen returns the length of the BTH and the extended headers that
// follow it for op, or 0 when op is not Valid.
func HeaderLen(op Opcode) int { return int(ops[op].hdrLen) }

// HasRETH reports whether op carries an RDMA Extended Transport Header
// (RDMA WRITE FIRST and ONLY, RDMA READ request).
func (o Opcode) HasRETH() bool { return o.has(fReth) }

// HasAETH reports whether op carries an ACK Extended Transport Header
// (ACKNOWLEDGE, RDMA READ response FIRST, LAST and ONLY).
func (o Opcode) HasAETH() bool { return o.has(fAeth) }

// HasImm reports whether op carries Immediate Data.
func (o Opcode) HasImm() bool { return o.has(fImm) }

// HasDETH reports whether op carries a Datagram Extended Transport Header
// (the UD opcodes).
func (o Opcode) HasDETH() bool { return o.has(fDeth) }

// HasPayload reports whether op may carry a payload: every opcode but the
// RDMA READ request and ACKNOWLEDGE. The payload may still be empty.
func (o Opcode) HasPayload() bool { return o.has(fPayload) }

// IsFirst reports whether op is a *_FIRST opcode.
//
// IsFirst, IsMiddle, IsLast and IsOnly partition the valid opcodes by where
// the packet sits in its message: exactly one is true. The RDMA READ request
// and ACKNOWLEDGE are single-packet, IsOnly. StartsMessage and EndsMessage
// group FIRST with ONLY and LAST with ONLY.
func (o Opcode) IsFirst() bool { return o.has(fFirst) }

// IsMiddle reports whether op is a *_MIDDLE opcode.
func (o Opcode) IsMiddle() bool { return o.has(fMiddle) }

// IsLast reports whether op is a *_LAST or *_LAST_WITH_IMMEDIATE opcode.
func (o Opcode) IsLast() bool { return o.has(fLast) }

// IsOnly reports whether op is a whole message in one packet: *_ONLY,
// *_ONLY_WITH_IMMEDIATE, RDMA READ request, ACKNOWLEDGE.
func (o Opcode) IsOnly() bool { return o.has(fOnly) }

// StartsMessage reports whether op begins a message: IsFirst or IsOnly.
func (o Opcode) StartsMessage() bool { return o.has(fFirst | fOnly) }

// EndsMessage reports whether op ends a message: IsLast or IsOnly.
func (o Opcode) EndsMessage() bool { return o.has(fLast | fOnly) }

// IsSend reports whether op is a SEND opcode of any transport.
func (o Opcode) IsSend() bool { return o.has(fSend) }

// IsWrite reports whether op is an RDMA WRITE opcode of any transport.
func (o Opcode) IsWrite() bool { return o.has(fWrite) }

// IsReadRequest reports whether op is the RDMA READ request.
func (o Opcode) IsReadRequest() bool { return o.has(fReadReq) }

// IsReadResponse reports whether op is an RDMA READ response opcode.
func (o Opcode) IsReadResponse() bool { return o.has(fReadResp) }

// IsAck reports whether op is ACKNOWLEDGE.
func (o Opcode) IsAck() bool { return o.has(fAck) }

// IsResponse reports whether op travels from responder to requester (RDMA
// READ responses and ACKNOWLEDGE) rather than carrying a request.
func (o Opcode) IsResponse() bool { return o.has(fReadResp | fAck) }

// Transport returns the service op belongs to: verbs.QPTypeRC, QPTypeUC or
// QPTypeUD, or 0 when op is not Valid.
func (o Opcode) Transport() verbs.QPType {
	if !o.Valid() {
		return 0
	}
	switch o >> 5 {
	case 0:
		return verbs.QPTypeRC
	case 1:
		return verbs.QPTypeUC
	default: // 3: UD
		return verbs.QPTypeUD
	}
}

// RequestOpcode returns the opcode of one packet of a work request of kind
// wr on transport t; first and last say where the packet sits in its
// message (both, for a message of one packet). Only the last packet of a
// message with immediate data carries it. ok is false where IBA has no such
// packet: an RDMA READ request that is not whole or not on RC, anything on
// UD but a whole SEND, an unknown kind or transport. (0 is RC_SEND_FIRST,
// so it cannot say "none".)
func RequestOpcode(t verbs.QPType, wr verbs.WROpcode, first, last bool) (op Opcode, ok bool) {
	if wr == verbs.WRRDMARead {
		return RCReadRequest, t == verbs.QPTypeRC && first && last
	}
	// The arithmetic follows IBA table 38's layout: the RDMA WRITE opcodes
	// follow the SEND ones in the same order, each *_WITH_IMMEDIATE follows
	// its plain opcode, and the transports differ by bits 7-5 alone.
	// TestRequestOpcode holds it to the IBA opcode list.
	var o Opcode
	switch {
	case first && last:
		o = RCSendOnly
	case first:
		o = RCSendFirst
	case last:
		o = RCSendLast
	default:
		o = RCSendMiddle
	}
	switch wr {
	case verbs.WRSend, verbs.WRSendWithImm:
	case verbs.WRRDMAWrite, verbs.WRRDMAWriteWithImm:
		o += RCWriteFirst - RCSendFirst
	default:
		return 0, false
	}
	if last && (wr == verbs.WRSendWithImm || wr == verbs.WRRDMAWriteWithImm) {
		o++
	}
	switch t {
	case verbs.QPTypeRC:
	case verbs.QPTypeUC:
		o += UCSendFirst - RCSendFirst
	case verbs.QPTypeUD:
		if o != RCSendOnly && o != RCSendOnlyImm {
			return 0, false
		}
		o += UDSendOnly - RCSendOnly
	default:
		return 0, false
	}
	return o, true
}
