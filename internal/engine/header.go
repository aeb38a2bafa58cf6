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
//	20..23 arg: type-specific (export: region id)
const headerLen = 24

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

var (
	errShortHeader = errors.New("engine: message shorter than its header")
	errBadHeader   = errors.New("engine: malformed message header")
)

func (h *header) put(b []byte) {
	_ = b[headerLen-1]
	b[0] = byte(h.typ)
	b[1] = h.flags
	b[2], b[3] = 0, 0
	binary.BigEndian.PutUint32(b[4:], h.credit)
	binary.BigEndian.PutUint32(b[8:], h.length)
	binary.BigEndian.PutUint32(b[12:], h.seq)
	binary.BigEndian.PutUint32(b[16:], h.imm)
	binary.BigEndian.PutUint32(b[20:], h.arg)
}

// parse decodes and validates a header: a peer's bytes are not trusted.
func (h *header) parse(b []byte) error {
	if len(b) < headerLen {
		return errShortHeader
	}
	h.typ = msgType(b[0])
	h.flags = b[1]
	h.credit = binary.BigEndian.Uint32(b[4:])
	h.length = binary.BigEndian.Uint32(b[8:])
	h.seq = binary.BigEndian.Uint32(b[12:])
	h.imm = binary.BigEndian.Uint32(b[16:])
	h.arg = binary.BigEndian.Uint32(b[20:])
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
