// Package credit owns a vconn's receive-credit window: how many receive
// buffers the peer may fill before this side's application reads, the
// grants that tell the peer so, and the growth of the window from a budget
// the engine's vconns share. A credit is a receive buffer, not a message
// (an Auto bundle of several messages takes one).
//
// Both ends of a vconn keep one: the sender a Limit (what the peer granted,
// which its messages may not pass), the receiver a Window (what it granted,
// and what its application released) and a Taken count (what the peer's
// messages took). Grants are cumulative serial numbers (format.Advance), so
// a lost or reordered grant is made good by the next one.
//
// It is pure and lock-free: no verbs, no goroutines of its own. Each method
// says which of the engine's goroutines may call it; the fields are atomics
// because a vconn's poller, the pollers that receive its peer's messages
// and its application's readers all reach them.
package credit

import (
	"sync/atomic"

	"github.com/rdmavisor/rdmavisor/internal/engine/format"
)

// Limit is the send side: the credits the peer granted, cumulative. The
// sender may have sent, cumulatively, up to Load() credited messages.
type Limit struct{ v atomic.Uint32 }

// Init sets the limit to the starting window, before the vconn is shared.
func (l *Limit) Init(credits uint32) { l.v.Store(credits) }

// Load is the limit now. Any goroutine.
func (l *Limit) Load() uint32 { return l.v.Load() }

// Grant records a credit grant from the peer and reports whether it moved
// the limit (then the sender may have more to send) and whether it was
// possible. A grant is the peer's receive buffers released, which are at
// most the credited messages sent (never past the limit), plus its window,
// at most max (MaxCredits; engines of one service share it): one past
// limit+max was never made, and is cut to that, ok false.
//
// Any poller that receives the peer's messages calls it, several at once
// perhaps: the limit only moves forward.
func (l *Limit) Grant(credit, max uint32) (moved, ok bool) {
	ok = true
	if lim := l.v.Load(); int32(credit-lim) > int32(max) {
		credit, ok = lim+max, false
	}
	return format.Advance(&l.v, credit), ok
}

// Window is the receive side: the credits granted and the buffers the
// application released, both cumulative, and the window between them.
type Window struct {
	consumed   atomic.Uint32 // receive buffers released
	advertised atomic.Uint32 // the last grant sent
	size       atomic.Uint32 // credits granted beyond consumed: Credits, grown up to MaxCredits
}

// Init sets the starting window, before the vconn is shared.
func (w *Window) Init(credits uint32) {
	w.advertised.Store(credits)
	w.size.Store(credits)
}

// Size is the window now; Consumed the buffers released; Advertised the
// last grant stamped. Any goroutine.
func (w *Window) Size() uint32       { return w.size.Load() }
func (w *Window) Consumed() uint32   { return w.consumed.Load() }
func (w *Window) Advertised() uint32 { return w.advertised.Load() }

// Stamp returns the grant to write into a message about to be posted and
// records it as advertised. Only the vconn's poller calls it (it stamps
// what it posts), so the grants it sends only grow.
func (w *Window) Stamp() uint32 {
	g := w.consumed.Load() + w.size.Load()
	// Stores only on change: an atomic store is a full barrier, which
	// waits for every store before it, cache misses included.
	if w.advertised.Load() != g {
		w.advertised.Store(g)
	}
	return g
}

// Release counts n receive buffers released, and reports whether a grant
// is due: half the window is used. A sender that used every credit granted
// while the application read it all is limited by the window, not by the
// reader: the window doubles then, if max and the budget allow and the
// vconn is open. Any goroutine that releases a message calls it (the
// application's reader, or a poller dropping one).
func (w *Window) Release(n, max uint32, b *Budget, open bool) (due bool) {
	if n == 0 {
		return false
	}
	c := w.consumed.Add(n)
	adv := w.advertised.Load()
	size := w.size.Load()
	if c == adv && open {
		size = w.grow(size, max, b)
	}
	return c+size-adv >= size/2 && open
}

// grow doubles the window size if max and the budget allow, and returns
// the window now. A grant made from it is never taken back: windows shrink
// only when their vconns end (Shrink).
func (w *Window) grow(size, max uint32, b *Budget) uint32 {
	if 2*size > max {
		return size
	}
	if b.v.Add(-int64(size)) < 0 {
		b.v.Add(int64(size))
		return size
	}
	if !w.size.CompareAndSwap(size, 2*size) {
		b.v.Add(int64(size)) // another release grew it first
		return w.size.Load()
	}
	return 2 * size
}

// Shrink gives a window's growth beyond credits back to the budget. The
// goroutine that releases the vconn calls it, once.
func (w *Window) Shrink(credits uint32, b *Budget) {
	if s := w.size.Swap(credits); s > credits {
		b.v.Add(int64(s) - int64(credits))
	}
}

// Taken counts the peer's messages that took a receive credit.
type Taken struct{ v atomic.Uint32 }

// Take counts a message that took one of the credits w granted, and
// reports whether the peer had one: a message past the last grant made
// (advertised, which only grows while the vconn is open) was sent without
// credit. Each of the peer's messages is counted once, by whichever poller
// receives it, so taken passes advertised only if the peer overran.
func (t *Taken) Take(w *Window) bool {
	return int32(t.v.Add(1)-w.advertised.Load()) <= 0
}

// Load is the count now. Any goroutine.
func (t *Taken) Load() uint32 { return t.v.Load() }

// Budget is the window growth the vconns that share it may still take: the
// engine keeps one per SRQ, half its receive buffers.
type Budget struct{ v atomic.Int64 }

// Init sets the budget, before any vconn uses it.
func (b *Budget) Init(n int64) { b.v.Store(n) }

// Left is what is left. Any goroutine.
func (b *Budget) Left() int64 { return b.v.Load() }
