// Package engine multiplexes many logical connections (vconns) over a few
// shared queue pairs per peer node.
//
// Per device, an Engine holds one PD, a registered buffer pool in size
// classes, an SRQ shared by all its RC QPs, and pollers: goroutines that own
// a CQ each, post the work the vconns queue (many WRs per doorbell), poll
// completions and demultiplex them. A poller busy-polls while there is work
// and sleeps on the CQ's completion channel when idle, so an idle engine
// burns no CPU.
//
// Per peer node, a Peer holds P RC QPs created on first use and shared by
// every vconn to that peer (each side sends on the QPs it created, so the
// two sides never race to set up the same pair; a node pair has 2P RC QPs
// whatever the number of connections).
//
// Per vconn, a VConn has a vQPN (package vqpn) that travels in imm_data of
// two-sided operations and in wr_id of everything it posts, so a completion
// is demultiplexed by one table lookup that also checks the generation: a
// completion for a closed vconn whose vQPN was reused is dropped and
// counted, never delivered to the new owner. A vconn queues its messages in
// a single-producer ring the poller drains; receive credits bound how many
// SRQ buffers one vconn may hold, so a slow reader cannot drain the SRQ
// shared by all.
//
// Message framing: every SEND carries a 24-byte header (header.go) with the
// message type, the sender's credit grant, the message length and sequence,
// and the application's own immediate (imm_data itself is the vQPN). A
// message longer than a receive buffer travels as several chunks on the same
// QP, in order, and is reassembled by the receiver.
package engine
