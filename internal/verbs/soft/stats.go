package soft

import "sync/atomic"

// Stats are a device's counters. Malformed or unexpected packets are dropped
// and counted here, never allowed to disturb a QP.
type Stats struct {
	rxPackets, rxMalformed, rxUnknownQP, rxWrongState, rxWrongSource atomic.Uint64
	rxDuplicate, rxOutOfSequence, rxQKeyMismatch, rxNoRecvDrop       atomic.Uint64
	rxErrors                                                         atomic.Uint64
	txPackets, txErrors, retransmits, timeouts                       atomic.Uint64
	naksSent, rnrNaksSent, acksSent, cqOverruns                      atomic.Uint64
	qpCacheMisses, rxDupReadDropped                                  atomic.Uint64
}

// StatsSnapshot is a copy of a device's counters.
type StatsSnapshot struct {
	RxPackets        uint64 // packets taken from the wire
	RxMalformed      uint64 // failed to decode (length, opcode, ICRC): dropped
	RxUnknownQP      uint64 // no such destination QP: dropped
	RxWrongState     uint64 // QP not in a state that accepts the packet: dropped
	RxWrongSource    uint64 // from a GID or with an opcode the QP is not connected to: dropped
	RxDuplicate      uint64 // PSN already executed (re-ACKed, not re-executed, except reads)
	RxDupReadDropped uint64 // of those, READs that asked for no read it executed: dropped
	RxOutOfSequence  uint64 // PSN ahead of the expected one (NAKed on RC, dropped on UC)
	RxQKeyMismatch   uint64 // UD Q_Key did not match: dropped
	RxNoRecvDrop     uint64 // UC/UD message with no receive posted: dropped
	RxErrors         uint64 // errors from the wire's Recv
	TxPackets        uint64
	TxErrors         uint64 // Send errors from the wire
	Retransmits      uint64 // go-back-N restarts (timeouts, sequence NAKs, RNR retries)
	Timeouts         uint64 // retransmit timer expiries
	NAKsSent         uint64
	RNRNAKsSent      uint64
	ACKsSent         uint64
	CQOverruns       uint64 // completions dropped because a CQ was full
	// With the NIC model (Config.NIC) only:
	RxRingDrops   uint64 // arrived while the receive ring was full: dropped (the wire's DropQueueFull)
	QPCacheMisses uint64 // packets whose QP context was not cached
}

func (s *Stats) snapshot() StatsSnapshot {
	return StatsSnapshot{
		RxPackets: s.rxPackets.Load(), RxMalformed: s.rxMalformed.Load(), RxUnknownQP: s.rxUnknownQP.Load(),
		RxWrongState: s.rxWrongState.Load(), RxWrongSource: s.rxWrongSource.Load(), RxDuplicate: s.rxDuplicate.Load(),
		RxOutOfSequence: s.rxOutOfSequence.Load(), RxQKeyMismatch: s.rxQKeyMismatch.Load(), RxNoRecvDrop: s.rxNoRecvDrop.Load(),
		RxErrors: s.rxErrors.Load(), TxPackets: s.txPackets.Load(), TxErrors: s.txErrors.Load(),
		Retransmits: s.retransmits.Load(), Timeouts: s.timeouts.Load(), NAKsSent: s.naksSent.Load(),
		RNRNAKsSent: s.rnrNaksSent.Load(), ACKsSent: s.acksSent.Load(), CQOverruns: s.cqOverruns.Load(),
		QPCacheMisses: s.qpCacheMisses.Load(), RxDupReadDropped: s.rxDupReadDropped.Load(),
	}
}
