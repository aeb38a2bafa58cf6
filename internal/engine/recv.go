package engine

import (
	"context"
	"fmt"
	"io"
)

// Message is one received message. Data is valid until Release.
type Message struct {
	Data    []byte
	Imm     uint32
	HasImm  bool
	shared  bool // slot holds other messages too (a bundle's)
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
// MaxCredits messages queued is dropped, as a datagram may be.
func (vc *VConn) deliver(p *poller, m Message) {
	if vc.handler != nil {
		vc.e.stats.msgsReceived.Add(1)
		p.st.recv[vc.tr].add(1, len(m.Data))
		vc.handler(vc, m)
		return
	}
	vc.rxMu.Lock()
	if m.credits == 0 && !m.shared && vc.rxN >= vc.e.cfg.MaxCredits {
		vc.rxMu.Unlock()
		p.reject(RejectOverflow)
		m.Release()
		return
	}
	vc.e.stats.msgsReceived.Add(1)
	p.st.recv[vc.tr].add(1, len(m.Data))
	if st := vc.state.Load(); st == stateClosed || st == stateFailed {
		vc.rxMu.Unlock()
		m.Release()
		return
	}
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

// Release returns the message's buffer and its receive credits.
func (m Message) Release() {
	vc := m.vc
	if vc == nil {
		return
	}
	e := vc.e
	if m.slot == noSlot || !m.shared || e.pool.unshare(m.slot) {
		if m.slot != noSlot {
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
