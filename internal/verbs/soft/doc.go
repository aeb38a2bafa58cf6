// Package soft is a software RDMA provider: the verbs interfaces implemented
// in pure Go with the semantics of real hardware, so that everything above it
// is tested against what a NIC does.
//
// Packets are RoCEv2 as the Linux rxe driver frames them (package roce) and
// travel over a wire (package wire): UDP sockets, or an in-memory fabric with
// seeded loss, duplication, reordering and delay.
//
// What it implements, and how it fails, follows the InfiniBand specification:
//   - RC: 24-bit PSNs, coalesced ACKs, PSN-sequence NAK with go-back-N, a
//     retransmit timer and retry count, RNR NAK and retry when no receive is
//     posted, NAKs for remote access errors (bad rkey, bounds, permissions)
//     after which both QPs go to ERR and outstanding work requests complete
//     with flush errors. SEND, SEND_WITH_IMM, RDMA_WRITE, RDMA_WRITE_WITH_IMM
//     and RDMA_READ, segmented at the path MTU; at most max_rd_atomic READs
//     in flight, and a duplicate READ answered again only within one of the
//     last max_dest_rd_atomic READs executed (rxe's responder resources).
//   - UC: no ACKs; a PSN gap drops the rest of the message, so a receiver
//     sees whole messages or nothing.
//   - UD: one packet no larger than the MTU (a larger post is refused), Q_Key
//     checked, 40 bytes of GRH at the head of every receive buffer.
//   - SRQs shared by many QPs; the QP state machine RESET→INIT→RTR→RTS→ERR
//     with the attribute masks libibverbs requires; posting in a state that
//     does not allow it fails.
//
// Concurrency: each QP's requester and responder state is guarded by the
// QP's mutex. A device runs one receive goroutine that decodes packets and
// drives responders (and requesters on ACKs); retransmit and RNR timers run
// on the runtime's timers. Responses the receive goroutine generates are sent
// in one batch per received batch; a requester flushes its packets before it
// releases its QP, so a QP's packets leave in PSN order.
//
// Hardware costs: with Config.NIC the receive path models a NIC's QP-context
// cache, line rate and receive ring (nic.go), paying their time against a
// virtual clock by sleeping; without it the device runs at CPU speed with
// unbounded state.
package soft
