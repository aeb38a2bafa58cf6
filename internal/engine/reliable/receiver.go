package reliable

import (
	"sync"
	"sync/atomic"

	"github.com/rdmavisor/rdmavisor/internal/engine/format"
)

// Receiver is the receive side of an Auto vconn: it puts messages of type
// M back in sequence order, holds those that come early, and keeps what
// the acknowledgements and gap reports say.
//
// Acknowledgements are cumulative and delayed, as TCP's are: the engine
// stamps Ack on whatever it sends back (credit grants mostly), or sends
// one AckDelay after a message nothing acknowledged, or at once for a
// duplicate (the sender timed out).
//
// Every poller that receives for the vconn reaches it. The methods marked
// "mu held" need Lock; the rest lock themselves or read atomics.
type Receiver[M any] struct {
	mu         sync.Mutex
	next       atomic.Uint32 // next sequence number to accept; written under mu
	early      []held[M]     // early[i] holds seq next+1+i, if arrived
	inorder    []M           // accepted, in order, not yet handed over
	delivering bool          // someone is handing inorder over
	ackSent    atomic.Uint32 // last acknowledgement sent
	// A gap: next is missing while later messages wait in early. gapEnd
	// is the first of those; nacked the next last reported (see Hold).
	gapEnd atomic.Uint32
	nacked uint32
	gapped bool // nacked is valid
	// finLater: the peer's FIN came while a Handover was under way (Fin).
	finLater bool
}

type held[M any] struct {
	m  M
	ok bool
}

// EarlyWindow is how far past a gap messages are kept: twice what a full
// window of credits may have in flight, a bundle of messages per credit.
// What arrives beyond it is dropped, and resent.
func EarlyWindow(maxCredits int) int { return 2 * format.MaxBundle * maxCredits }

func (r *Receiver[M]) Lock()   { r.mu.Lock() }
func (r *Receiver[M]) Unlock() { r.mu.Unlock() }

// Offset is how far seq is past the next sequence number expected: 0 is
// the next, less is a duplicate, more is early. mu held.
func (r *Receiver[M]) Offset(seq uint32) int32 { return int32(seq - r.next.Load()) }

// Accepts reports whether a message d sequence numbers after the next
// expected is new and within window (EarlyWindow) of early arrivals. mu
// held.
func (r *Receiver[M]) Accepts(d int32, window int) bool {
	if d <= 0 {
		return d == 0
	}
	i := int(d) - 1
	return i < window && (i >= len(r.early) || !r.early[i].ok)
}

// FirstCopy reports whether the datagram whose first message is seq is the
// first copy of it to arrive (a resend of one that arrived took no
// credit). It locks mu.
func (r *Receiver[M]) FirstCopy(seq uint32, window int) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.Accepts(r.Offset(seq), window)
}

// Hold keeps m, d > 0 sequence numbers early (Accepts said yes), until the
// gap before it fills, and reports whether the sender should hear of the
// gap (once per gap). A datagram lost (a receive queue overflowed on the
// way) would otherwise wait for the retransmission timeout, at least
// LossyMinRTO, while the window drains and the vconn stops; told, the sender
// resends what is missing at once, as TCP's fast retransmit and RC's
// sequence-error NAK do. mu held.
func (r *Receiver[M]) Hold(d int32, m M) (report bool) {
	i := int(d) - 1
	for len(r.early) <= i {
		r.early = append(r.early, held[M]{})
	}
	r.early[i] = held[M]{m, true}
	return r.reportGap()
}

// Accept takes m, the next in sequence, and queues it for Handover with the
// run of early arrivals it releases; early moves past that run and the
// next gap, whose sequence number is then the next expected. It returns
// how many early arrivals followed m, and whether a gap remains that the
// sender has not heard of. mu held.
func (r *Receiver[M]) Accept(m M) (released int, report bool) {
	next := r.next.Load() + 1
	r.inorder = append(r.inorder, m)
	if len(r.early) > 0 {
		k := 0
		for k < len(r.early) && r.early[k].ok {
			r.inorder = append(r.inorder, r.early[k].m)
			k++
		}
		next += uint32(k)
		n := len(r.early)
		rest := copy(r.early, r.early[min(k+1, n):])
		clear(r.early[rest:n])
		r.early = r.early[:rest]
		released = k
	}
	r.next.Store(next)
	return released, len(r.early) > 0 && r.reportGap()
}

// Handover hands what Accept queued to deliver, in order, outside mu (a
// handler may send on the vconn, or take long), one goroutine at a time
// so the order holds across pollers: if another goroutine is handing over,
// it delivers these too. mu held on entry and on return; deliver may not
// call back into r.
func (r *Receiver[M]) Handover(deliver func(M)) {
	if r.delivering {
		return
	}
	r.delivering = true
	var zero M
	for i := 0; i < len(r.inorder); i++ {
		m := r.inorder[i]
		r.inorder[i] = zero
		r.mu.Unlock()
		deliver(m)
		r.mu.Lock()
	}
	r.inorder = r.inorder[:0]
	r.delivering = false
}

// Fin records the peer's FIN, which follows every message the peer sent:
// its FIN waits for its datagrams' acknowledgements, and its RC messages
// go ahead of it on their QP. lost: messages wait past a gap, so one sent
// before the FIN never came. later: a Handover is under way, and the
// messages it hands over come before the FIN; FinDue says when it is
// over. mu held.
func (r *Receiver[M]) Fin() (lost, later bool) {
	for _, h := range r.early {
		if h.ok {
			return true, false
		}
	}
	if r.delivering {
		r.finLater = true
		return false, true
	}
	return false, false
}

// FinDue reports, once, that a FIN Fin put off is due: the Handover it
// waited for is over. The goroutine that returns from Handover, mu held.
func (r *Receiver[M]) FinDue() bool {
	if !r.finLater || r.delivering {
		return false
	}
	r.finLater = false
	return true
}

// reportGap records that the next expected is missing while later
// messages wait, and reports whether it is news. mu held.
func (r *Receiver[M]) reportGap() bool {
	next := r.next.Load()
	if r.gapped && r.nacked == next {
		return false
	}
	for j := range r.early {
		if r.early[j].ok {
			r.gapEnd.Store(next + 1 + uint32(j))
			break
		}
	}
	r.nacked, r.gapped = next, true
	return true
}

// Ack is the cumulative acknowledgement to stamp on a message going out
// now, recorded as sent. The vconn's poller, as it posts.
func (r *Receiver[M]) Ack() uint32 {
	n := r.next.Load()
	if r.ackSent.Load() != n {
		r.ackSent.Store(n)
	}
	return n
}

// Next is the next sequence number expected, AckSent the last
// acknowledgement stamped, GapEnd the first sequence number past the gap
// last found (see Hold). Any goroutine.
func (r *Receiver[M]) Next() uint32    { return r.next.Load() }
func (r *Receiver[M]) AckSent() uint32 { return r.ackSent.Load() }
func (r *Receiver[M]) GapEnd() uint32  { return r.gapEnd.Load() }

// Early counts the messages held early. It locks mu.
func (r *Receiver[M]) Early() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	n := 0
	for _, h := range r.early {
		if h.ok {
			n++
		}
	}
	return n
}

// DropEarly hands drop the early arrivals, which will never be delivered:
// the vconn was released. It locks mu, and calls drop outside it.
func (r *Receiver[M]) DropEarly(drop func(M)) {
	r.mu.Lock()
	early := r.early
	r.early = nil
	r.mu.Unlock()
	for _, h := range early {
		if h.ok {
			drop(h.m)
		}
	}
}
