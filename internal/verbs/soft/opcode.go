package soft

import "github.com/rdmavisor/rdmavisor/internal/verbs/soft/roce"

// BTH opcodes are a transport base plus an operation (IBA table 38).
const (
	baseRC = 0x00
	baseUC = 0x20
	baseUD = 0x60

	opSendFirst         = 0x00
	opSendMiddle        = 0x01
	opSendLast          = 0x02
	opSendLastImm       = 0x03
	opSendOnly          = 0x04
	opSendOnlyImm       = 0x05
	opWriteFirst        = 0x06
	opWriteMiddle       = 0x07
	opWriteLast         = 0x08
	opWriteLastImm      = 0x09
	opWriteOnly         = 0x0a
	opWriteOnlyImm      = 0x0b
	opReadRequest       = 0x0c
	opReadRespFirst     = 0x0d
	opReadRespMiddle    = 0x0e
	opReadRespLast      = 0x0f
	opReadRespOnly      = 0x10
	opAck               = 0x11
	opUDSendOnly        = 0x04 // with baseUD: 0x64
	opUDSendOnlyImm     = 0x05 // with baseUD: 0x65
	opcodeTransportMask = 0xe0
)

func split(op roce.Opcode) (base, code uint8) {
	return uint8(op) & opcodeTransportMask, uint8(op) &^ opcodeTransportMask
}

// AETH syndromes (IBA 9.7.5.2.3): the top three bits say ACK, RNR NAK or
// NAK; the low five carry a credit count, an RNR timer or a NAK code.
const (
	synACK         = 0x00
	synRNR         = 0x20
	synNAK         = 0x60
	synKindMask    = 0x60
	synValueMask   = 0x1f
	synAckNoCredit = 0x1f // "invalid credit count": end-to-end credits unused

	nakPSNSeqErr    = 0
	nakInvalidReq   = 1
	nakRemoteAccess = 2
	nakRemoteOp     = 3
)

// startsMessage and endsMessage classify a SEND or RDMA WRITE packet's
// operation code (the opcode less its transport) by its place in the
// message.
func startsMessage(code uint8) bool {
	switch code {
	case opSendFirst, opSendOnly, opSendOnlyImm, opWriteFirst, opWriteOnly, opWriteOnlyImm:
		return true
	}
	return false
}

func endsMessage(code uint8) bool {
	switch code {
	case opSendLast, opSendLastImm, opSendOnly, opSendOnlyImm, opWriteLast, opWriteLastImm, opWriteOnly, opWriteOnlyImm:
		return true
	}
	return false
}

// continues reports whether code may come next at the responder: the next
// packet of the SEND or WRITE in progress, or, between messages, the start
// of one.
func (r *responder) continues(code uint8) bool {
	switch {
	case r.inSend:
		return code == opSendMiddle || code == opSendLast || code == opSendLastImm
	case r.inWrite:
		return code == opWriteMiddle || code == opWriteLast || code == opWriteLastImm
	}
	return startsMessage(code)
}
