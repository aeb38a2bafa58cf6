package engine

import (
	"github.com/rdmavisor/rdmavisor/internal/engine/credit"
	"github.com/rdmavisor/rdmavisor/internal/engine/format"
	"github.com/rdmavisor/rdmavisor/internal/transport"
)

// The credit window itself is package credit's; here the engine wires it
// to the vconn: which budget it grows from, who is rescheduled when a
// grant comes or falls due, and where grants are stamped.

// grant records a credit grant from the peer, and reschedules a vconn that
// waited for it; it reports false for a grant the peer could not have made
// (credit.Limit.Grant). Any poller that receives the peer's messages.
func (vc *VConn) grant(c uint32) bool {
	moved, ok := vc.limit.Grant(c, uint32(vc.e.cfg.MaxCredits))
	if moved {
		// Cleared before the ring is read, as the sender pushes before it
		// reads the flag (scheduleData): one of the two schedules the data.
		if vc.creditWait.Load() {
			vc.creditWait.Store(false)
		}
		if !vc.ring.empty() {
			vc.schedule()
		}
	}
	return ok
}

// takeCredit counts a message that took one of the receive credits this
// vconn granted, and reports whether the peer had one (credit.Taken).
// Receiving, the vconn holds at most its window of messages, MaxCredits.
// Any poller that receives the peer's messages.
func (vc *VConn) takeCredit() bool { return vc.taken.Take(&vc.window) }

// overrun fails a vconn whose peer sent beyond its credits; the caller
// drops the message.
func (p *poller) overrun(vc *VConn) {
	p.reject(RejectCredit)
	vc.fail(ErrCreditOverrun)
}

// returnCredits gives back the credits of n released receive buffers, and
// has the poller send a grant once half the window is used. Whoever
// releases a message: the application's reader, or a poller.
func (vc *VConn) returnCredits(n uint32) {
	if n == 0 {
		return // a datagram's: most UC and UD messages
	}
	open := vc.state.Load() == stateOpen
	if vc.window.Release(n, uint32(vc.e.cfg.MaxCredits), vc.windowBudget(), open) && !vc.creditDue.Swap(true) {
		vc.schedule()
	}
}

// windowBudget is the budget a vconn's window grows from: that of the
// receive buffers its messages use, the datagram SRQ's for Auto (whose
// small messages land there), the SRQ's for the rest.
func (vc *VConn) windowBudget() *credit.Budget {
	if vc.tr == transport.Auto {
		return &vc.e.windowBudget[1]
	}
	return &vc.e.windowBudget[0]
}

// stampCredit writes the current grant into a queued buffer's header, and
// on an Auto vconn's data and grants the acknowledgement too; no separate
// grant is due after it. Only the vconn's poller, as it posts b.
func (vc *VConn) stampCredit(b []byte) {
	// The grant goes out with b, so none is due after it; but a release
	// after the grant is read sets creditDue again, and must find it
	// cleared already, or its credits would never be granted: clear
	// first, read second. (Cleared after the read, a release between the
	// two was lost, and a sender waiting for those credits waited
	// forever.) Likewise the acknowledgement.
	if vc.creditDue.Load() {
		vc.creditDue.Store(false)
	}
	h := format.Raw(b)
	h.SetCredit(vc.window.Stamp())
	if t := h.Type(); vc.tr == transport.Auto && (t == format.Data || t == format.Credit || t == format.Bundle) {
		if vc.ackDue.Load() {
			vc.ackDue.Store(false)
		}
		h.SetAck(vc.ackValue())
	}
}
