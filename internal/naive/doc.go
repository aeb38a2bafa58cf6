// Package naive is the baseline every RDMAvisor benchmark is measured
// against: one RC queue pair per connection, as an application without
// RDMAvisor builds it on the same verbs provider.
//
// Per connection (a Conn) it owns:
//   - an RC QP, connected to the peer's,
//   - a CQ of its own for the QP's send and receive completions (and so a
//     completion channel, one file descriptor, per connection),
//   - one registered region of (RecvDepth+2+SendDepth) × MaxMessage bytes:
//     RecvDepth+2 receive buffers pre-posted on the QP's own receive queue
//     and SendDepth send buffers.
//
// Nothing is shared between connections but the PD and the poller
// goroutines, so memory and device state grow with the number of
// connections: that is what the benchmarks compare with the engine's shared
// QPs and SRQ.
//
// It is a straightforward implementation, not a strawman: a send is one
// work request posted by the caller's goroutine (no hand-off to another
// goroutine), sent inline when it is at most MaxInline bytes, with a send
// completion requested every SignalEvery work requests; receive buffers
// released by the application are reposted in one batch per poll; flow
// control is credit-based, so the receive queue never runs dry (no RNR NAK
// on the fast path): each message's imm_data carries the sender's receive
// credits, and a zero-length credit message goes out when half the window
// was returned with no data to carry it.
//
// Polling: a process with thousands of connections has thousands of CQs.
// Arming and waiting on thousands of completion channels costs a system
// call per connection per sleep, so, as such applications do, a few poller
// goroutines (Config.Pollers) visit every CQ in turn, busy-polling while
// there is work and backing off to short sleeps when a whole round finds
// none. Every round costs one Poll per connection whether or not it has
// traffic: that, with the per-connection memory and the lost batching (a
// doorbell per message, an ACK stream per QP), is the real cost of the
// naive design that the benchmarks measure.
package naive
