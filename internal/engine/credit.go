package engine

import (
	"github.com/rdmavisor/rdmavisor/internal/engine/wire"
	"sync/atomic"
)

// grant records a credit grant from the peer, and reschedules a vconn that
// waited for it. A grant is the peer's receive buffers released, which
// are at most the credited messages this vconn sent (sent, never past
// limit), plus its window, at most MaxCredits (engines of one service
// share it): one past limit+MaxCredits was never made, and is cut to
// that. grant reports false for such a grant.
func (vc *VConn) grant(credit uint32) bool {
	ok := true
	lim := vc.limit.Load()
	if max := uint32(vc.e.cfg.MaxCredits); int32(credit-lim) > int32(max) {
		credit, ok = lim+max, false
	}
	if wire.Advance(&vc.limit, credit) && !vc.ring.empty() {
		vc.schedule()
	}
	return ok
}

// takeCredit counts a message that took one of the receive credits this
// vconn granted, and reports whether the peer had one: a message past the
// last grant made (advertised, which only grows while the vconn is open)
// was sent without credit. The peer's messages are counted once each
// whichever poller receives them, so taken never passes advertised unless
// the peer overran: receiving, the vconn holds at most its window of
// messages, MaxCredits (see VConn.taken).
func (vc *VConn) takeCredit() bool {
	return int32(vc.taken.Add(1)-vc.advertised.Load()) <= 0
}

// overrun fails a vconn whose peer sent beyond its credits; the caller
// drops the message.
func (p *poller) overrun(vc *VConn) {
	p.reject(RejectCredit)
	vc.fail(ErrCreditOverrun)
}

func (vc *VConn) returnCredits(n uint32) {
	if n == 0 {
		return
	}
	c := vc.consumed.Add(n)
	adv := vc.advertised.Load()
	w := vc.window.Load()
	if c == adv {
		// The sender used every credit granted and the application read
		// it all: the window, not the reader, limits the vconn.
		w = vc.growWindow(w)
	}
	if c+w-adv >= w/2 && vc.state.Load() == stateOpen {
		if !vc.creditDue.Swap(true) {
			vc.schedule()
		}
	}
}

// windowBudget is the budget a vconn's window grows from: that of the
// receive buffers its messages use, the datagram SRQ's for Auto (whose
// small messages land there), the SRQ's for the rest.
func (vc *VConn) windowBudget() *atomic.Int64 {
	if vc.tr == Auto {
		return &vc.e.windowBudget[1]
	}
	return &vc.e.windowBudget[0]
}

// growWindow doubles the credit window w if MaxCredits and the engine's
// budget allow; it returns the window now. Only returnCredits grows it,
// and a grant made from it is never taken back: windows shrink only when
// their vconns end (see shrinkWindow).
func (vc *VConn) growWindow(w uint32) uint32 {
	if 2*w > uint32(vc.e.cfg.MaxCredits) || vc.state.Load() != stateOpen {
		return w
	}
	b := vc.windowBudget()
	if b.Add(-int64(w)) < 0 {
		b.Add(int64(w))
		return w
	}
	if !vc.window.CompareAndSwap(w, 2*w) {
		b.Add(int64(w)) // another release grew it first
		return vc.window.Load()
	}
	return 2 * w
}

// shrinkWindow gives a released vconn's window growth back to the budget.
func (vc *VConn) shrinkWindow() {
	if w := vc.window.Swap(uint32(vc.e.cfg.Credits)); w > uint32(vc.e.cfg.Credits) {
		vc.windowBudget().Add(int64(w) - int64(vc.e.cfg.Credits))
	}
}

// stampCredit writes the current grant into a queued buffer's header, and
// on an Auto vconn's data and grants the acknowledgement too; no separate
// grant is due after it.
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
	g := vc.consumed.Load() + vc.window.Load()
	h := wire.Raw(b)
	h.SetCredit(g)
	// Stores only on change: an atomic store is a full barrier, which
	// waits for every store before it, cache misses included.
	if vc.advertised.Load() != g {
		vc.advertised.Store(g)
	}
	if t := h.Type(); vc.tr == Auto && (t == wire.Data || t == wire.Credit || t == wire.Bundle) {
		if vc.ackDue.Load() {
			vc.ackDue.Store(false)
		}
		h.SetAck(vc.ackValue())
	}
}
