// Package engine multiplexes many logical connections (vconns) over a few
// shared queue pairs per peer node.
//
// Its pure logic lives in packages of its own, tested without verbs, as
// quic-go keeps its frame formats (internal/wire) and its loss recovery
// (internal/ackhandler) apart from its connections: the formats of what
// engines send each other and of their work requests' ids (format), a
// vconn's receive-credit window (credit), and Auto's sequencing,
// acknowledgements and retransmission state (reliable). This package wires
// them to the device: buffers, QPs, pollers, vconns.
//
// Per device, an Engine holds one PD, a registered buffer pool in size
// classes, an SRQ shared by all its RC QPs, and pollers: goroutines that own
// a CQ each, post the work the vconns queue (many WRs per doorbell), poll
// completions and demultiplex them. A poller runs rounds while there is
// work and, when idle, parks on a channel that kicks and the CQ's
// completion events fill (verbs.Notifier, or a relay of the completion
// channel's descriptor), so an idle engine burns no CPU and wakes as fast
// as a goroutine does.
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
// messages one vconn may have queued, and once half an SRQ is held by
// queued messages the next are copied out and their buffers reposted
// (recv.go, pin), so slow readers, however many, cannot drain the SRQ
// shared by all. A credit is a buffer, not a message: an Auto bundle of
// several messages takes one. A vconn's credit window starts at
// Config.Credits and doubles, up to MaxCredits, while its sender uses all
// of it and its reader keeps up: a window must cover the grants' round
// trip, which is a few µs on a NIC and tens where pollers share cores. The
// growth comes from a budget of half the receive buffers, so windows stay
// a bounded share.
//
// Transports (Transport): RC; UC and UD, unreliable; and Auto, reliable,
// which sends what fits a chunk as UC datagrams (bundled when several are
// queued) under its own sequence numbers, cumulative acknowledgements (delayed, usually riding on credit
// grants), gap reports that resend a loss at once and a retransmission
// timeout for the rest, and longer messages over RC (auto.go; the state
// machine is package reliable).
//
// Scheduling is built for many vconns with little traffic each (100,000
// vconns round-robin: about one message per vconn per pass), where what a
// message costs is mostly its vconn's cache lines and any per-vconn work:
//   - A vconn with work waits on its QP's run queue; the poller serves each
//     queue in order until the QP is full and leaves the rest queued, so a
//     round costs in proportion to what it posts, not to how many vconns
//     wait.
//   - Each QP bounds its backlog: blocking senders wait while the vconns
//     sending on it have SQDepth messages queued (what waits for a slow
//     reader's credits does not count). Queueing more only adds latency,
//     and lets what the poller serves go cold in the cache.
//   - The fields a message touches are in a vconn's first two cache lines
//     (Send's in the first), and the poller reads the lines of the next
//     vconns it serves, and of the vconns a polled batch of receives names,
//     before handling them, so their misses overlap.
//   - A SEND's wr_id tells its completion whether it counts as a message
//     sent or is a FIN (format.Tag), so completions need neither the
//     buffer nor the vconn.
//
// Message framing: every SEND carries a 32-byte header (package format) with the
// message type, the sender's credit grant, the message length and sequence,
// the application's own immediate (imm_data itself is the vQPN), and the
// secret of the QP pair it travels on, without which the receiver drops it
// (a host spoofing the peer's address does not know it). A
// message longer than a receive buffer travels as several chunks on the same
// QP, in order, and is reassembled by the receiver. The small messages an
// Auto vconn has queued travel together as a bundle, one datagram for many.
//
// Bundles (serve.go, bundle): when an Auto vconn has several whole datagram-sized messages
// queued, the poller packs as many as fit a chunk into one datagram, as
// SCTP bundles chunks and TCP coalesces writes: one work request, one
// completion, a packet or a few, one receive buffer, where each message
// alone costs all of those. Only what is already queued is bundled;
// nothing waits for company, so a lone message goes as it came.
//
// Bundling is Auto's, as choosing the transport by size is: the engine
// decides how an Auto vconn's messages travel. The fixed transports post
// what they are given, a work request per message (per chunk), so that
// what an application asks for is what the device sees.
//
// A bundle is a format.Bundle header (length: the bytes after it; seq: its
// first message's; imm: how many messages) followed by the messages, each
// with its own format.Data header, as the sender queued them: copied after the
// header, or, for longer messages, gathered from their own buffers by the
// work request (gatherMin). It is acknowledged and resent whole, and its
// receive buffer is shared by the messages (bufPool.share) and reposted
// when the last is released. It takes one receive credit, not one per
// message: a credit stands for a receive buffer, as eRPC's stand for
// packets, so a reader behind by a window of credits holds a window of
// buffers whatever they carry, and a sender that runs out of credits
// queues, and so bundles, more messages per credit.
//
// A VConn's state is split by owner, each part a type whose fields only
// its owner's file touches (TestOwners checks it) and whose methods are
// beside it: the sender's queue (sender), the reader's queue (reader),
// what the serving poller keeps (served), the receiving poller's
// reassembly (reassembly) and Auto's reliability (autoLink). The files:
//
//   - engine.go: Engine and New; the poller's state, grouped by flow, and
//     the calls others make on a poller (kick, enqueue, repostRecv, clock,
//     throttle). config.go, pool.go: defaults; registered buffers and
//     their special slots.
//   - peer.go, qp.go: peers (epochs, failure); the shared QPs, and a
//     failed QP's cleanup.
//   - vconn.go: VConn, its layout and lifecycle (Connect, Close, Abort,
//     fail, release), schedule.
//   - send.go: the sender's queue (sender: ring, lock, sequence, waits)
//     and Send, SendImm, TrySend, SendStaged; queueEntry for one-sided markers and
//     region messages.
//   - poller.go: the poller's loop, rounds and sleep. cq.go: per round,
//     which vconns each QP serves, the doorbells, and the completions:
//     receives authenticated and demultiplexed, sends completed.
//   - serve.go: serving one vconn, top down: from its ring through
//     credits, routes and Auto's datagrams and bundles to work requests,
//     then the control messages it owes; send buffers given back.
//   - recv.go: a received message's way to the application: chunks
//     reassembled, Auto's ordering (deliverSeq), the handler or the
//     reader's queue (reader), Recv, pin, Release and receive credits.
//   - auto.go: Auto's reliability on a vconn (autoLink over package
//     reliable): acknowledgements, gap reports, retransmission timers.
//   - region.go, onesided.go: exports (memory windows); RDMA READ and
//     WRITE, staging memory. lend.go: sends from staging memory in place
//     (SendStaged), their payloads given back. stats.go: counters and
//     Stats.
package engine
