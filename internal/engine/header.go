package engine

import (
	"encoding/binary"
	"errors"
	"fmt"
)

// headerLen is the engine header at the start of every SEND payload.
//
//	0      type
//	1      flags (flagFirst, flagLast, flagImm; flagGap on a credit grant)
//	2..3   reserved, zero
//	4..7   credit: receive credits the sender has granted, cumulative
//	8..11  length: the whole message's length (data messages); with
//	       flagGap, the first sequence number past the gap
//	12..15 seq: the message's sequence number on its vconn
//	16..19 imm: the application's immediate (flagImm); a bundle's count
//	20..23 arg: the region's id (export, unexport, unexported); the
//	       acknowledgement (an Auto vconn's data, bundles and grants)
//
// Fields that mean different things by type are read and written through
// the accessors named for each meaning, below; only put and parse know
// the offsets.
const headerLen = 24

const (
	offType   = 0
	offFlags  = 1
	offCredit = 4
	offLength = 8
	offSeq    = 12
	offImm    = 16
	offArg    = 20
)

type msgType uint8

const (
	msgData       msgType = 1 // application data (one chunk of a message)
	msgCredit     msgType = 2 // a credit grant and nothing else
	msgFin        msgType = 3 // the sender closed its side: no more data follows
	msgExport     msgType = 4 // a region the sender exports to this vconn (payload: regionAd)
	msgUnexport   msgType = 5 // the region with id arg is no longer exported
	msgReset      msgType = 6 // the sender aborted the vconn
	msgUnexported msgType = 7 // the sender stopped using region arg (answers msgUnexport)
	msgBundle     msgType = 8 // whole data messages, imm of them, each with its header (bundle.go)
)

const (
	flagFirst = 1 << 0
	flagLast  = 1 << 1
	flagImm   = 1 << 2
	// flagGap, on an Auto vconn's credit grant: the sequence numbers from
	// its acknowledgement (arg) up to length are missing while later ones
	// arrived.
	flagGap = 1 << 3
)

type header struct {
	typ    msgType
	flags  uint8
	credit uint32
	length uint32
	seq    uint32
	imm    uint32
	arg    uint32
}

// Headers by meaning.

// dataHeader starts the header of a data message of length bytes.
func dataHeader(length, seq, imm uint32, hasImm bool) header {
	h := header{typ: msgData, length: length, seq: seq, imm: imm}
	if hasImm {
		h.flags |= flagImm
	}
	return h
}

// controlHeader is the header of a control message; regionOf a region's
// messages (export, unexport, unexported).
func controlHeader(t msgType) header { return header{typ: t, flags: flagFirst | flagLast} }

func regionHeader(t msgType, id uint32) header {
	h := controlHeader(t)
	h.arg = id
	return h
}

// bundleHeader heads a bundle of count messages, numbered from seq, in
// length bytes.
func bundleHeader(seq, count, length uint32) header {
	h := controlHeader(msgBundle)
	h.seq, h.imm, h.length = seq, count, length
	return h
}

func (h *header) whole() bool { return h.flags&(flagFirst|flagLast) == flagFirst|flagLast }

// appImm is a data message's application immediate.
func (h *header) appImm() (uint32, bool) { return h.imm, h.flags&flagImm != 0 }

// ack is the acknowledgement an Auto vconn's data, bundle or grant carries.
func (h *header) ack() uint32 { return h.arg }

// region is the id of the region an export, unexport or unexported names.
func (h *header) region() uint32 { return h.arg }

// gap reports the end of a gap a grant reports (flagGap): the first
// sequence number past it.
func (h *header) gap() (end uint32, ok bool) { return h.length, h.flags&flagGap != 0 }

// count is how many messages a bundle carries.
func (h *header) count() uint32 { return h.imm }

// rawHeader reads and writes single fields of an encoded header in place:
// the poller classifies and stamps queued buffers without decoding them.
type rawHeader []byte

func (b rawHeader) typ() msgType { return msgType(b[offType]) }

func (b rawHeader) whole() bool { return b[offFlags]&(flagFirst|flagLast) == flagFirst|flagLast }

func (b rawHeader) last() bool { return b[offFlags]&flagLast != 0 }

// length is a data message's whole length (in every chunk).
func (b rawHeader) length() uint32 { return binary.BigEndian.Uint32(b[offLength:]) }

func (b rawHeader) seq() uint32 { return binary.BigEndian.Uint32(b[offSeq:]) }

func (b rawHeader) count() uint32 { return binary.BigEndian.Uint32(b[offImm:]) }

func (b rawHeader) ack() uint32 { return binary.BigEndian.Uint32(b[offArg:]) }

func (b rawHeader) setCredit(c uint32) { binary.BigEndian.PutUint32(b[offCredit:], c) }

func (b rawHeader) setAck(a uint32) { binary.BigEndian.PutUint32(b[offArg:], a) }

// setGap marks a grant as reporting a gap that ends at end.
func (b rawHeader) setGap(end uint32) {
	b[offFlags] |= flagGap
	binary.BigEndian.PutUint32(b[offLength:], end)
}

var (
	errShortHeader = errors.New("engine: message shorter than its header")
	errBadHeader   = errors.New("engine: malformed message header")
)

func (h *header) put(b []byte) {
	_ = b[headerLen-1]
	b[offType] = byte(h.typ)
	b[offFlags] = h.flags
	b[2], b[3] = 0, 0
	binary.BigEndian.PutUint32(b[offCredit:], h.credit)
	binary.BigEndian.PutUint32(b[offLength:], h.length)
	binary.BigEndian.PutUint32(b[offSeq:], h.seq)
	binary.BigEndian.PutUint32(b[offImm:], h.imm)
	binary.BigEndian.PutUint32(b[offArg:], h.arg)
}

// parse decodes and validates a header: a peer's bytes are not trusted.
func (h *header) parse(b []byte) error {
	if len(b) < headerLen {
		return errShortHeader
	}
	h.typ = msgType(b[offType])
	h.flags = b[offFlags]
	h.credit = binary.BigEndian.Uint32(b[offCredit:])
	h.length = binary.BigEndian.Uint32(b[offLength:])
	h.seq = binary.BigEndian.Uint32(b[offSeq:])
	h.imm = binary.BigEndian.Uint32(b[offImm:])
	h.arg = binary.BigEndian.Uint32(b[offArg:])
	if h.typ < msgData || h.typ > msgBundle || h.flags&^(flagFirst|flagLast|flagImm|flagGap) != 0 || b[2] != 0 || b[3] != 0 {
		return errBadHeader
	}
	if h.typ != msgData && h.flags&(flagFirst|flagLast) != flagFirst|flagLast {
		return errBadHeader // control messages are single chunks
	}
	if h.flags&flagGap != 0 && (h.typ != msgCredit || int32(h.length-h.arg) <= 0) {
		return errBadHeader // a gap is reported on a grant, and ends past its start
	}
	if h.typ == msgBundle && h.flags&flagImm != 0 {
		return errBadHeader // a bundle's messages carry their own immediates
	}
	return nil
}

func (h *header) String() string {
	return fmt.Sprintf("type=%d flags=%#x credit=%d len=%d seq=%d", h.typ, h.flags, h.credit, h.length, h.seq)
}
