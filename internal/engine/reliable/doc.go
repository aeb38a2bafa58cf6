// Package reliable owns Auto's reliability state: what turns an Auto
// vconn's UC datagrams into a reliable, ordered stream. Every message
// carries a sequence number (format.Header.Seq); the receiver (Receiver)
// delivers in sequence order, holding early arrivals and dropping
// duplicates, acknowledges cumulatively on whatever it sends back, and
// reports a gap once so the sender resends it at once; the sender (Sender)
// keeps each datagram until it is acknowledged and resends it after a
// timeout that follows the measured round trip (RFC 6298), as TCP does.
//
// It is pure: no verbs, no buffers, no goroutines of its own, no clock
// reads (callers pass the time). What a datagram is, how it is posted and
// freed, and who is woken stay the engine's (engine/auto.go); a Datagram
// names its buffer with an opaque number, and a Receiver holds messages of
// any type.
//
// Ownership, as the engine uses it: a Sender belongs to the poller of its
// vconn's QPs, which alone pushes, resends and frees, so its slices take no
// lock; the pollers that receive the peer's acknowledgements only record
// them, in atomics (OnAck, OnGap). A Receiver is reached by every poller
// that receives for the vconn, under its mutex. Each method says which.
package reliable
