package engine

import (
	"context"
	"errors"
	"fmt"
	"io"
	"sync"

	"github.com/rdmavisor/rdmavisor/internal/engine/credit"
	"github.com/rdmavisor/rdmavisor/internal/engine/format"
	"github.com/rdmavisor/rdmavisor/internal/transport"
)

// A received message's way to the application, after cq.go admitted it:
// chunks reassembled (reassembly), Auto's sequence order (deliverSeq),
// then the handler or the reader's queue (reader, Recv), with the
// receive buffers it pins and the credits its Release gives back. The
// pollers that receive (any of them) deliver; the application reads.

// Message is one received message. Data is valid until Release.
type Message struct {
	Data    []byte
	Imm     uint32
	HasImm  bool
	shared  bool // slot holds other messages too (a bundle's)
	held    bool // slot counts in vc.e.held (not shared: see pin)
	vc      *VConn
	slot    bufSlot // receive buffer holding Data, or noSlot
	credits uint32  // credits Release gives back (a bundle's: see dropCredit)
}

// reader is a vconn's receive queue: the messages the pollers delivered
// (deliver) for Recv, the peer's FIN and why the vconn failed, all
// guarded by mu. Any poller queues; the application's reader takes. Its
// fields are touched here alone (TestOwners).
type reader struct {
	mu      sync.Mutex
	q       []Message     // a ring of n messages from head, grown as needed
	head    int           //
	n       int           //
	wake    chan struct{} // a Recv waits on it
	peerFin bool          // the peer closed
	err     error         // why the vconn failed
}

// onData delivers a whole message or adds a chunk to the one being
// reassembled.
func (p *poller) onData(vc *VConn, h *format.Header, slot bufSlot, payload []byte) {
	e := p.e
	first, last := h.First(), h.Last()
	imm, hasImm := h.AppImm()
	m := Message{vc: vc, Imm: imm, HasImm: hasImm, slot: noSlot, credits: 1}
	if slot.class() == e.dgramClass {
		// Unreliable transports: whole messages only, no credits.
		if !first || !last || uint32(len(payload)) != h.Length {
			e.stats.malformed.Add(1)
			p.rx.reposts = append(p.rx.reposts, slot)
			return
		}
		m.Data, m.slot, m.credits = payload, slot, 0
		if vc.tr == transport.Auto {
			m.credits = 1
			vc.deliverSeq(p, h.Seq, m, true)
			return
		}
		vc.deliver(p, m)
		return
	}
	// Reliable data: every chunk took a receive credit.
	if !p.inOrder(vc, h, slot) {
		return
	}
	if !vc.takeCredit() {
		p.overrun(vc)
		p.rx.reposts = append(p.rx.reposts, slot)
		return
	}
	if first && last {
		if uint32(len(payload)) != h.Length {
			p.malformed(vc, slot)
			return
		}
		m.Data, m.slot = payload, slot
		p.deliver(vc, h, m)
		return
	}
	if first && !vc.asm.start(h.Length, uint32(e.cfg.MaxMessage)) || !vc.asm.add(payload) {
		p.malformed(vc, slot)
		return
	}
	p.rx.reposts = append(p.rx.reposts, slot)
	if !last {
		vc.returnCredits(1) // the chunk is copied out: its buffer is free
		return
	}
	if m.Data = vc.asm.finish(); m.Data == nil {
		p.malformed(vc, noSlot)
		return
	}
	p.deliver(vc, h, m)
}

// deliver delivers a reliable message: in sequence on an Auto vconn.
func (p *poller) deliver(vc *VConn, h *format.Header, m Message) {
	if vc.tr == transport.Auto {
		vc.deliverSeq(p, h.Seq, m, false)
		return
	}
	vc.deliver(p, m)
}

// malformed drops a message that breaks the framing: the peer engine is
// broken, so the vconn fails rather than deliver garbage.
func (p *poller) malformed(vc *VConn, slot bufSlot) {
	p.e.stats.malformed.Add(1)
	if slot != noSlot {
		p.rx.reposts = append(p.rx.reposts, slot)
	}
	vc.returnCredits(1)
	vc.fail(errors.New("engine: malformed message from peer"))
}

// The credit window itself is package credit's; here the engine wires it
// to the vconn: which budget it grows from, who is rescheduled when a
// grant comes or falls due (stampCredit, in serve.go, stamps grants).

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

// deliverSeq delivers m (sequence seq) in order: early messages wait for
// the gap to fill, duplicates are dropped. p is the poller that received
// it (any of them); dgram says it came as a datagram, not over RC.
//
// Acknowledgements are cumulative and delayed, as TCP's are: they ride on
// the credit grants the application's releases bring (one per half
// window), or go reliable.AckDelay after a message that no grant
// acknowledged (flushAcks), or at once for a duplicate (the sender timed
// out). Acknowledging whenever the receiving poller ran out of work
// instead cost a control message every few messages whenever the receiver
// outpaced the sender, which is the usual case.
func (vc *VConn) deliverSeq(p *poller, seq uint32, m Message, dgram bool) {
	r := &vc.auto.load().rx
	r.Lock()
	d := r.Offset(seq)
	switch {
	case d < 0:
		// A retransmission of something delivered: it took no credit.
		r.Unlock()
		m.dropCredit()
		m.Release()
		vc.ackDue.Store(true)
		vc.schedule()
		return
	case d > 0 && !r.Accepts(d, vc.earlyWindow()):
		r.Unlock()
		m.dropCredit() // a duplicate, or outside the window: the sender will resend it
		m.Release()
		return
	}
	// A single datagram takes its receive credit here, where duplicates
	// are told apart under the lock, so each is counted once (a chunk
	// took its credit in onData, a bundle in onBundle).
	if dgram && !m.shared && m.credits != 0 && !vc.takeCredit() {
		r.Unlock()
		p.overrun(vc)
		m.Release()
		return
	}
	if d > 0 {
		// A peer that leaves a gap makes the messages after it wait
		// here, each in its receive buffer: they count against the SRQ
		// as queued ones do.
		p.pin(&m)
		gap := r.Hold(d, m)
		r.Unlock()
		vc.reportGap(gap)
		return
	}
	released, gap := r.Accept(m)
	r.Handover(func(m Message) { vc.deliver(p, m) })
	fin := r.FinDue() // it came while these were handed over: after them
	r.Unlock()
	if fin {
		vc.peerFinished()
	}
	vc.reportGap(gap)
	// The acknowledgement waits (see above); the credit grant that the
	// application's release brings may carry it first. Only datagrams
	// need one (and the early arrivals m released may be some): the
	// sender keeps nothing it sent over RC, which is reliable itself.
	// (Acknowledging them too sent a control message every AckDelay:
	// 4,000 messages of 20 KB had the receiver post 437 work requests,
	// 233 without.)
	if (dgram || released > 0) && vc.auto.waitAck() {
		p.rel.acks = append(p.rel.acks, ackWaiter{vc, r.AckSent()})
	}
}

// reportGap has the vconn's poller send a gap report, if there is news
// of one (reliable.Receiver.Hold).
func (vc *VConn) reportGap(news bool) {
	if news && vc.auto.oweGap() {
		vc.schedule()
	}
}

// deliver hands a received message to the handler or the receive queue;
// p is the poller delivering it.
//
// The queue is bounded: a message that took a receive credit holds it
// until Release, so the peer, which sends only on credit (takeCredit
// refuses the rest), has at most the credit window queued, MaxCredits
// messages (an Auto bundle's, up to maxBundle messages, hold one credit
// between them). UC and UD datagrams take no credit: one that finds
// MaxCredits messages queued is dropped, as a datagram may be. Auto's
// messages never are: they are sequenced and acknowledged, and one
// without a credit of its own (a bundle's, copied out early: see pin)
// was counted in its bundle's. A queued message keeps its receive buffer
// only while its SRQ is less than half held (see pin).
func (vc *VConn) deliver(p *poller, m Message) {
	if vc.handler != nil {
		vc.e.stats.msgsReceived.Add(1)
		p.st.recv[vc.tr].add(1, len(m.Data))
		vc.handler(vc, m)
		return
	}
	r := &vc.rcv
	r.mu.Lock()
	if m.credits == 0 && !m.shared && vc.tr != transport.Auto && r.n >= vc.e.cfg.MaxCredits {
		r.mu.Unlock()
		p.reject(RejectOverflow)
		m.Release()
		return
	}
	vc.e.stats.msgsReceived.Add(1)
	p.st.recv[vc.tr].add(1, len(m.Data))
	// Closing too: Close dropped what was queued, and nothing reads
	// what would come after (it would hold its buffer for good). Data
	// after Close is lost, so the peer is told with a RST, as TCP does
	// (RFC 1122 4.2.2.13): else a peer whose queue outgrew the credits
	// it held would wait for grants this side no longer makes, and its
	// FIN, behind that queue, would never go.
	if st := vc.state.Load(); st == stateClosed || st == stateFailed || st == stateClosing {
		r.mu.Unlock()
		m.Release()
		if st == stateClosing {
			vc.Abort()
		}
		return
	}
	p.pin(&m)
	if r.n == len(r.q) {
		grown := make([]Message, max(4, 2*len(r.q)))
		for i := 0; i < r.n; i++ {
			grown[i] = r.q[(r.head+i)%len(r.q)]
		}
		r.q, r.head = grown, 0
	}
	r.q[(r.head+r.n)%len(r.q)] = m
	r.n++
	w := r.wake
	r.mu.Unlock()
	notify(w)
}

// wakeReader wakes a Recv blocked on the vconn.
func (r *reader) wakeReader() {
	r.mu.Lock()
	w := r.wake
	r.mu.Unlock()
	notify(w)
}

func notify(w chan struct{}) {
	if w != nil {
		select {
		case w <- struct{}{}:
		default:
		}
	}
}

// Recv returns the next message: io.EOF once the peer closed and every
// message before its close was received; the failure once the vconn failed.
func (vc *VConn) Recv(ctx context.Context) (Message, error) {
	r := &vc.rcv
	for {
		r.mu.Lock()
		if r.n > 0 {
			m := r.take()
			r.mu.Unlock()
			return m, nil
		}
		switch st := vc.state.Load(); {
		case st == stateFailed:
			err := r.err
			r.mu.Unlock()
			return Message{}, err
		case r.peerFin:
			r.mu.Unlock()
			return Message{}, io.EOF
		case st == stateClosing || st == stateClosed:
			r.mu.Unlock()
			return Message{}, fmt.Errorf("engine: recv on vconn %v: %w", vc.id, ErrClosed)
		}
		if r.wake == nil {
			r.wake = make(chan struct{}, 1)
		}
		w := r.wake
		r.mu.Unlock()
		select {
		case <-w:
		case <-ctx.Done():
			return Message{}, ctx.Err()
		}
	}
}

// take dequeues the oldest message; r.mu is held and r.n > 0.
func (r *reader) take() Message {
	m := r.q[r.head]
	r.q[r.head] = Message{}
	r.head = (r.head + 1) % len(r.q)
	r.n--
	return m
}

// drop releases every queued message (Close, Abort, release).
func (r *reader) drop() {
	r.mu.Lock()
	msgs := make([]Message, 0, r.n)
	for r.n > 0 {
		msgs = append(msgs, r.take())
	}
	r.mu.Unlock()
	for _, m := range msgs {
		m.Release()
	}
}

// queued is how many messages wait for Recv.
func (r *reader) queued() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.n
}

// finish records the peer's FIN and wakes Recv, which returns io.EOF
// once the queue is empty.
func (r *reader) finish() {
	r.mu.Lock()
	r.peerFin = true
	w := r.wake
	r.mu.Unlock()
	notify(w)
}

// finished reports whether the peer's FIN came.
func (r *reader) finished() bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.peerFin
}

// failure is why the vconn failed (set before its state changes).
func (r *reader) failure() error {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.err
}

func (r *reader) setFailure(err error) {
	r.mu.Lock()
	r.err = err
	r.mu.Unlock()
}

// pin decides whether m, about to be queued on its vconn or held by Auto
// until a gap fills, keeps its receive buffer. The poller p calls it.
//
// A queued message holds its buffer until the application releases it,
// and the vconns' credit windows together may exceed the SRQ (every
// vconn starts with Credits, however many there are): readers that never
// read could take every buffer, and every other vconn's RC traffic would
// wait on RNR retries. So the buffers queued messages hold are counted
// per SRQ (e.held), and at half an SRQ a message is copied to memory of
// its own and its buffer reposted at once. It keeps its receive credit
// until Release, so the peer is bounded by credits exactly as before;
// only where the bytes wait changes. Below half nothing is copied or
// allocated. The count is taken before it is checked (Add, then undo),
// so it exceeds half by at most one per poller, and only for a moment.
//
// A bundle's buffer (shared) counts once, from the first of its
// messages queued uncopied to the last of them released (bundleHeld); a
// bundle message copied out drops its reference to the buffer at once,
// and with it the bundle's credit, unless it was the last reference:
// then the buffer is reposted and the credit waits for this message's
// Release, as it would have. (A copied message that is not the last
// leaves the credit to the buffer: a reader that reads in order has at
// most the rest of one bundle queued past its credits.)
//
// Auto's early arrivals (deliverSeq) are counted when they arrive, and
// not again when the gap fills and they are queued. Not counted: those
// a Handler keeps.
func (p *poller) pin(m *Message) {
	if m.slot == noSlot || m.held {
		return
	}
	e := p.e
	i, limit := 0, int64(e.cfg.RecvBuffers/2)
	if m.slot.class() == e.dgramClass {
		i, limit = 1, int64(e.cfg.DgramBuffers/2)
	}
	if m.shared && e.bundleHeld[m.slot.index()].Load() {
		return // the bundle's buffer counts already
	}
	if e.held[i].Add(1) <= limit {
		if m.shared {
			e.bundleHeld[m.slot.index()].Store(true)
		} else {
			m.held = true
		}
		return
	}
	e.held[i].Add(-1)
	data := make([]byte, len(m.Data))
	copy(data, m.Data)
	if m.lastShare() {
		e.unholdBundle(m.slot, m.shared)
		p.rx.reposts = append(p.rx.reposts, m.slot)
	} else {
		m.credits = 0 // the bundle's, returned with its buffer
	}
	m.Data, m.slot, m.shared = data, noSlot, false
	e.stats.recvCopied.Add(1)
}

// unholdBundle stops counting a bundle's buffer (shared) as held, once
// the last of its messages let it go.
func (e *Engine) unholdBundle(slot bufSlot, shared bool) {
	if shared && e.bundleHeld[slot.index()].Swap(false) {
		e.held[1].Add(-1)
	}
}

// Release returns the message's buffer and its receive credits. Any
// goroutine, once per message.
func (m Message) Release() {
	vc := m.vc
	if vc == nil {
		return
	}
	e := vc.e
	if m.held {
		if m.slot.class() == e.dgramClass {
			e.held[1].Add(-1)
		} else {
			e.held[0].Add(-1)
		}
	}
	if m.slot == noSlot || m.lastShare() {
		if m.slot != noSlot {
			e.unholdBundle(m.slot, m.shared)
			e.pollers[0].repostRecv(m.slot)
		}
		// A bundle's credit comes back with its buffer, after the last
		// of its messages (see auto.go).
		vc.returnCredits(m.credits)
	}
}

// lastShare drops m's share of a bundle's buffer, and reports whether
// the buffer may go back: m's share was the last, or the buffer is m's
// alone.
func (m *Message) lastShare() bool { return !m.shared || m.vc.e.pool.unshare(m.slot) }

// dropCredit marks a message that took no receive credit (a duplicate).
// A bundle's messages keep theirs: the bundle's one credit goes with its
// buffer whichever of them is released last, and onBundle decided it.
func (m *Message) dropCredit() {
	if !m.shared {
		m.credits = 0
	}
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

// reassembly is the message a vconn's poller is reassembling from its
// chunks (onData): they all come on one RC QP, so to one poller, which
// alone touches it (TestOwners). It copies into a buffer of its own so
// the chunks' receive buffers (and credits) come back at once.
type reassembly struct {
	buf []byte // len: what came; cap: the message's length
}

// start begins a message of n bytes; false: one was under way, or n is
// more than max.
func (a *reassembly) start(n, max uint32) bool {
	if a.buf != nil || n > max {
		return false
	}
	a.buf = make([]byte, 0, n)
	return true
}

// add appends a chunk; false: no message under way, or it overflows.
func (a *reassembly) add(payload []byte) bool {
	if a.buf == nil || len(a.buf)+len(payload) > cap(a.buf) {
		return false
	}
	a.buf = append(a.buf, payload...)
	return true
}

// underway: a message's first chunks came, not its last.
func (a *reassembly) underway() bool { return a.buf != nil }

// finish ends the message after its last chunk: the message, or nil if
// the chunks fell short of its length.
func (a *reassembly) finish() []byte {
	b := a.buf
	a.buf = nil
	if len(b) != cap(b) {
		return nil
	}
	return b
}

// grant records a credit grant from the peer, and reschedules a vconn that
// waited for it; it reports false for a grant the peer could not have made
// (credit.Limit.Grant). Any poller that receives the peer's messages.
func (vc *VConn) grant(c uint32) bool {
	moved, ok := vc.limit.Grant(c, uint32(vc.e.cfg.MaxCredits))
	if moved {
		// Cleared before the ring is read, as the sender pushes before it
		// reads the flag (scheduleData): one of the two schedules the data.
		vc.snd.unstall()
		if !vc.snd.empty() {
			vc.schedule()
		}
	}
	return ok
}
