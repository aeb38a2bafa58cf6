package engine

import (
	"context"
	"fmt"
	"io"

	"github.com/rdmavisor/rdmavisor/internal/transport"
)

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
	vc.rxMu.Lock()
	if m.credits == 0 && !m.shared && vc.tr != transport.Auto && vc.rxN >= vc.e.cfg.MaxCredits {
		vc.rxMu.Unlock()
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
		vc.rxMu.Unlock()
		m.Release()
		if st == stateClosing {
			vc.Abort()
		}
		return
	}
	p.pin(&m)
	if vc.rxN == len(vc.rxq) {
		grown := make([]Message, max(4, 2*len(vc.rxq)))
		for i := 0; i < vc.rxN; i++ {
			grown[i] = vc.rxq[(vc.rxHead+i)%len(vc.rxq)]
		}
		vc.rxq, vc.rxHead = grown, 0
	}
	vc.rxq[(vc.rxHead+vc.rxN)%len(vc.rxq)] = m
	vc.rxN++
	w := vc.rxWake
	vc.rxMu.Unlock()
	notify(w)
}

// wakeReader wakes a Recv blocked on the vconn.
func (vc *VConn) wakeReader() {
	vc.rxMu.Lock()
	w := vc.rxWake
	vc.rxMu.Unlock()
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
	for {
		vc.rxMu.Lock()
		if vc.rxN > 0 {
			m := vc.rxq[vc.rxHead]
			vc.rxq[vc.rxHead] = Message{}
			vc.rxHead = (vc.rxHead + 1) % len(vc.rxq)
			vc.rxN--
			vc.rxMu.Unlock()
			return m, nil
		}
		switch st := vc.state.Load(); {
		case st == stateFailed:
			err := vc.err
			vc.rxMu.Unlock()
			return Message{}, err
		case vc.peerFin:
			vc.rxMu.Unlock()
			return Message{}, io.EOF
		case st == stateClosing || st == stateClosed:
			vc.rxMu.Unlock()
			return Message{}, fmt.Errorf("engine: recv on vconn %v: %w", vc.id, ErrClosed)
		}
		if vc.rxWake == nil {
			vc.rxWake = make(chan struct{}, 1)
		}
		w := vc.rxWake
		vc.rxMu.Unlock()
		select {
		case <-w:
		case <-ctx.Done():
			return Message{}, ctx.Err()
		}
	}
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
	if !m.shared || e.pool.unshare(m.slot) {
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
	if m.slot == noSlot || !m.shared || e.pool.unshare(m.slot) {
		if m.slot != noSlot {
			e.unholdBundle(m.slot, m.shared)
			e.pollers[0].repostRecv(m.slot)
		}
		// A bundle's credit comes back with its buffer, after the last
		// of its messages (see bundle.go).
		vc.returnCredits(m.credits)
	}
}

// dropCredit marks a message that took no receive credit (a duplicate).
// A bundle's messages keep theirs: the bundle's one credit goes with its
// buffer whichever of them is released last, and onBundle decided it.
func (m *Message) dropCredit() {
	if !m.shared {
		m.credits = 0
	}
}
