package roce

import (
	"errors"
	"fmt"
)

// Header is a packet's decoded IB transport headers. Fields of headers the
// opcode does not carry are zero after Decode and ignored by PutHeaders.
// It holds no pointers.
type Header struct {
	// BTH
	Opcode   Opcode
	SE       bool  // solicited event
	MigReq   bool  // migration state
	PadCount uint8 // pad bytes after the payload; Seal sets it
	TVer     uint8 // transport header version; always 0
	PKey     uint16
	FECN     bool // in resv8a, not covered by the ICRC
	BECN     bool // in resv8a, not covered by the ICRC
	DestQPN  uint32
	AckReq   bool
	PSN      uint32

	// RETH
	VA     uint64
	RKey   uint32
	DMALen uint32

	// AETH
	Syndrome uint8
	MSN      uint32

	// ImmDt, in host order (big-endian on the wire)
	Imm uint32

	// DETH
	QKey   uint32
	SrcQPN uint32
}

// Mask24 is the largest value of the 24-bit fields: QPNs, PSNs, MSNs.
const Mask24 = 1<<24 - 1

func (h *Header) String() string {
	s := fmt.Sprintf("%v qpn=%#x psn=%#x", h.Opcode, h.DestQPN, h.PSN)
	if h.AckReq {
		s += " ackreq"
	}
	if h.SE {
		s += " se"
	}
	if h.Opcode.HasRETH() {
		s += fmt.Sprintf(" va=%#x rkey=%#x len=%d", h.VA, h.RKey, h.DMALen)
	}
	if h.Opcode.HasAETH() {
		k, v := h.AckKind()
		s += fmt.Sprintf(" %v/%d msn=%#x", k, v, h.MSN)
	}
	if h.Opcode.HasImm() {
		s += fmt.Sprintf(" imm=%#x", h.Imm)
	}
	if h.Opcode.HasDETH() {
		s += fmt.Sprintf(" qkey=%#x srcqp=%#x", h.QKey, h.SrcQPN)
	}
	return s
}

// AckKind is the type of an AETH syndrome, its bits 6-5.
type AckKind uint8

const (
	KindAck      AckKind = 0 // value: credit count
	KindRNRNak   AckKind = 1 // value: RNR timer, IB encoding
	KindReserved AckKind = 2
	KindNak      AckKind = 3 // value: a NakCode
)

func (k AckKind) String() string {
	switch k {
	case KindAck:
		return "ACK"
	case KindRNRNak:
		return "RNR_NAK"
	case KindNak:
		return "NAK"
	}
	return "reserved"
}

// NakCode is the value of a NAK syndrome (IBA table 46).
type NakCode uint8

const (
	NakPSNSequence       NakCode = 0 // PSN sequence error
	NakInvalidRequest    NakCode = 1
	NakRemoteAccess      NakCode = 2
	NakRemoteOperational NakCode = 3
	NakInvalidRDRequest  NakCode = 4
)

func (c NakCode) String() string {
	switch c {
	case NakPSNSequence:
		return "PSN sequence error"
	case NakInvalidRequest:
		return "invalid request"
	case NakRemoteAccess:
		return "remote access error"
	case NakRemoteOperational:
		return "remote operational error"
	case NakInvalidRDRequest:
		return "invalid RD request"
	}
	return fmt.Sprintf("NakCode(%d)", uint8(c))
}

// CreditsInvalid is the credit count of an ACK that advertises no credits
// (rxe's AETH_ACK_UNLIMITED): the requester does not limit itself by them.
const CreditsInvalid = 0x1f

// AckSyndrome returns the syndrome of an ACK with a 5-bit credit count.
func AckSyndrome(credits uint8) uint8 { return credits & 0x1f }

// RNRNakSyndrome returns the syndrome of an RNR NAK with a 5-bit RNR timer
// (the IB encoding of verbs.QPAttr.MinRNRTimer).
func RNRNakSyndrome(timer uint8) uint8 { return 1<<5 | timer&0x1f }

// NakSyndrome returns the syndrome of a NAK.
func NakSyndrome(code NakCode) uint8 { return 3<<5 | uint8(code)&0x1f }

// ParseSyndrome splits an AETH syndrome into its kind and 5-bit value
// (credit count, RNR timer or NakCode). Bit 7, reserved, is ignored.
func ParseSyndrome(s uint8) (AckKind, uint8) { return AckKind(s >> 5 & 3), s & 0x1f }

// AckKind returns ParseSyndrome(h.Syndrome).
func (h *Header) AckKind() (AckKind, uint8) { return ParseSyndrome(h.Syndrome) }

// Errors. They are never wrapped, so Decode does not allocate; test with
// errors.Is all the same.
var (
	// ErrTruncated: the packet is shorter than its headers and ICRC.
	ErrTruncated = errors.New("roce: truncated packet")
	// ErrOpcode: an opcode this package does not speak.
	ErrOpcode = errors.New("roce: unsupported opcode")
	// ErrICRC: the ICRC does not match the packet and its pseudo header.
	ErrICRC = errors.New("roce: bad ICRC")
	// ErrVersion: a BTH transport header version other than 0.
	ErrVersion = errors.New("roce: unsupported transport header version")
	// ErrPad: the pad count exceeds the payload, or a pad byte is not 0.
	ErrPad = errors.New("roce: bad pad")
	// ErrLength: a length the format does not allow: payload on an opcode
	// that carries none, a packet length not a multiple of 4 or over the
	// 65507 bytes a UDP datagram holds, a header length not the opcode's.
	ErrLength = errors.New("roce: bad length")
	// ErrShortBuffer: the buffer to encode into is too small.
	ErrShortBuffer = errors.New("roce: buffer too short")
	// ErrRange: a header field does not fit its wire width.
	ErrRange = errors.New("roce: header field out of range")
	// ErrAddrFamily: one endpoint's GID is IPv4-mapped and the other's not.
	ErrAddrFamily = errors.New("roce: endpoints of different IP families")
)
