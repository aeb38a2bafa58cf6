package wire

import "sync/atomic"

// Stats are a wire's counters, cumulative since it was created. A packet is
// dropped for exactly one reason.
type Stats struct {
	TxPackets uint64 // packets put on the network, duplicates included
	TxBytes   uint64
	RxPackets uint64 // packets returned by Recv
	RxBytes   uint64

	DropTruncated uint64 // received packets longer than the caller's buffer
	DropOversize  uint64 // packets longer than MaxPacketLen or the path MTU, not sent
	DropUnknown   uint64 // destination GID not attached (fabric) or not reachable from this socket (UDP)
	DropQueueFull uint64 // arrived to a full receive queue (fabric) or socket buffer (UDP: SO_RXQ_OVFL, where a coalesced run counts once)
	DropLoss      uint64 // lost by the fault model
	DropClosed    uint64 // held, delayed or queued when the wire closed

	Duplicated uint64 // extra copies made by the fault model
	Reordered  uint64 // packets held back by the fault model
	Delayed    uint64 // packets the fault model delivered after a delay

	SendErrors uint64 // packets the network refused for another reason (UDP: ENOBUFS, EPERM; a failing inner wire)
}

// Dropped is the sum of the drop counters.
func (s Stats) Dropped() uint64 {
	return s.DropTruncated + s.DropOversize + s.DropUnknown + s.DropQueueFull + s.DropLoss + s.DropClosed
}

func (s *Stats) add(o *Stats) {
	s.TxPackets += o.TxPackets
	s.TxBytes += o.TxBytes
	s.RxPackets += o.RxPackets
	s.RxBytes += o.RxBytes
	s.DropTruncated += o.DropTruncated
	s.DropOversize += o.DropOversize
	s.DropUnknown += o.DropUnknown
	s.DropQueueFull += o.DropQueueFull
	s.DropLoss += o.DropLoss
	s.DropClosed += o.DropClosed
	s.Duplicated += o.Duplicated
	s.Reordered += o.Reordered
	s.Delayed += o.Delayed
	s.SendErrors += o.SendErrors
}

// counters is the concurrent form of Stats. Hot paths count into a local
// Stats and add it once per batch.
type counters struct {
	txPackets, txBytes, rxPackets, rxBytes                           atomic.Uint64
	dropTruncated, dropOversize, dropUnknown, dropQueueFull          atomic.Uint64
	dropLoss, dropClosed, duplicated, reordered, delayed, sendErrors atomic.Uint64
}

func addNZ(c *atomic.Uint64, v uint64) {
	if v != 0 {
		c.Add(v)
	}
}

func (c *counters) add(s *Stats) {
	addNZ(&c.txPackets, s.TxPackets)
	addNZ(&c.txBytes, s.TxBytes)
	addNZ(&c.rxPackets, s.RxPackets)
	addNZ(&c.rxBytes, s.RxBytes)
	addNZ(&c.dropTruncated, s.DropTruncated)
	addNZ(&c.dropOversize, s.DropOversize)
	addNZ(&c.dropUnknown, s.DropUnknown)
	addNZ(&c.dropQueueFull, s.DropQueueFull)
	addNZ(&c.dropLoss, s.DropLoss)
	addNZ(&c.dropClosed, s.DropClosed)
	addNZ(&c.duplicated, s.Duplicated)
	addNZ(&c.reordered, s.Reordered)
	addNZ(&c.delayed, s.Delayed)
	addNZ(&c.sendErrors, s.SendErrors)
}

func (c *counters) snapshot() Stats {
	return Stats{
		TxPackets: c.txPackets.Load(), TxBytes: c.txBytes.Load(),
		RxPackets: c.rxPackets.Load(), RxBytes: c.rxBytes.Load(),
		DropTruncated: c.dropTruncated.Load(), DropOversize: c.dropOversize.Load(),
		DropUnknown: c.dropUnknown.Load(), DropQueueFull: c.dropQueueFull.Load(),
		DropLoss: c.dropLoss.Load(), DropClosed: c.dropClosed.Load(),
		Duplicated: c.duplicated.Load(), Reordered: c.reordered.Load(), Delayed: c.delayed.Load(),
		SendErrors: c.sendErrors.Load(),
	}
}
