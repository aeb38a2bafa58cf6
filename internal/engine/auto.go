package engine

import (
	"encoding/binary"
	"fmt"
	"sync"
	"time"

	"github.com/rdmavisor/rdmavisor/internal/vqpn"
)

// Auto vconns are reliable and ordered like RC, but send small messages as
// UD datagrams, which cost the provider one packet and no transport ACK.
// The engine then supplies what RC would: every message carries its
// sequence number (header.seq); the receiver delivers in sequence order,
// holding early arrivals and dropping duplicates, and acknowledges
// cumulatively in header.arg of whatever it sends back (data or a credit
// grant), late rather than per message (see deliverSeq); the sender keeps
// each datagram until it is acknowledged and retransmits it after a
// timeout that follows the measured round trip. Large messages go over RC
// in the same sequence. Receive credits bound both paths together.

// rel is an Auto vconn's reliability state.
type rel struct {
	mu sync.Mutex

	// Send side: datagrams not yet acknowledged, in sequence order. Each
	// keeps its buffer (the master copy); a transmission posts a copy.
	unacked []relMsg
	acked   uint32 // the peer's cumulative acknowledgement
	// Round-trip estimate and retransmission timeout, as TCP's (RFC
	// 6298): a fixed timeout short enough for an idle path fires
	// spuriously on a busy one, where acknowledgements are delayed and
	// pollers share cores.
	srtt, rttvar, rto time.Duration

	// Receive side.
	rxNext     uint32    // next sequence number to accept
	early      []Message // early[i] holds seq rxNext+1+i, if arrived
	inorder    []Message // accepted, in order, not yet handed over
	delivering bool      // someone is handing inorder over
	ackSent    uint32    // last acknowledgement sent
}

type relMsg struct {
	seq   uint32
	slot  uint32
	n     uint32
	sent  time.Time
	tries int
}

const (
	relMinRTO   = time.Millisecond     // the timeout never goes below this
	relInitRTO  = 4 * time.Millisecond // before the first round-trip sample
	relMaxRTO   = 64 * time.Millisecond
	relMaxTries = 24 // about 1.5 s of silence before the vconn fails
)

func (vc *VConn) reliability() *rel {
	if r := vc.rel.Load(); r != nil {
		return r
	}
	vc.rel.CompareAndSwap(nil, &rel{})
	return vc.rel.Load()
}

// autoUD reports whether a message of n bytes (header included) goes as a
// datagram on this Auto vconn.
func (vc *VConn) autoUD(n uint32) bool {
	e := vc.e
	return n-headerLen <= uint32(e.cfg.AutoThreshold) && int(n) <= e.cfg.MTU.Bytes()
}

// ackValue is the cumulative acknowledgement to stamp on outgoing messages.
func (vc *VConn) ackValue() uint32 {
	r := vc.reliability()
	r.mu.Lock()
	defer r.mu.Unlock()
	r.ackSent = r.rxNext
	return r.rxNext
}

// onAck frees the datagrams the peer acknowledged and, from the newest
// one sent only once (Karn's rule), updates the round-trip estimate.
func (vc *VConn) onAck(ack uint32, now time.Time) {
	r := vc.reliability()
	r.mu.Lock()
	if int32(ack-r.acked) <= 0 {
		r.mu.Unlock()
		return
	}
	r.acked = ack
	k := 0
	var sample time.Duration
	for k < len(r.unacked) && int32(ack-r.unacked[k].seq) > 0 {
		u := &r.unacked[k]
		if u.tries == 0 {
			sample = now.Sub(u.sent)
		}
		vc.e.pool.put(u.slot)
		k++
	}
	r.unacked = append(r.unacked[:0], r.unacked[k:]...)
	if sample > 0 {
		r.observe(sample)
	}
	r.mu.Unlock()
}

// observe folds a round-trip sample into the estimate (RFC 6298 2.2-2.3).
func (r *rel) observe(sample time.Duration) {
	if r.srtt == 0 {
		r.srtt, r.rttvar = sample, sample/2
	} else {
		d := r.srtt - sample
		if d < 0 {
			d = -d
		}
		r.rttvar = (3*r.rttvar + d) / 4
		r.srtt = (7*r.srtt + sample) / 8
	}
	r.rto = min(max(r.srtt+4*r.rttvar, relMinRTO), relMaxRTO)
}

// timeout is the retransmission timeout of a datagram sent tries+1 times.
func (r *rel) timeout(tries int) time.Duration {
	rto := r.rto
	if rto == 0 {
		rto = relInitRTO
	}
	return min(rto<<tries, relMaxRTO)
}

// deliverSeq delivers m (sequence seq) in order: early messages wait for
// the gap to fill, duplicates are dropped. p is the poller that received
// it.
//
// Acknowledgements are cumulative and delayed, as TCP's are: one goes out
// when half a credit window has arrived unacknowledged (with the credit
// grant, which carries it, when the application keeps up), when the
// receiving poller runs out of completions to handle (the sender has
// paused), or at once for a duplicate (the sender timed out).
func (vc *VConn) deliverSeq(p *poller, seq uint32, m Message) {
	r := vc.reliability()
	r.mu.Lock()
	d := int32(seq - r.rxNext)
	switch {
	case d < 0:
		// A retransmission of something delivered: it took no credit.
		r.mu.Unlock()
		m.credits = 0
		m.Release()
		vc.ackDue.Store(true)
		vc.schedule()
		return
	case d > 0:
		i := int(d) - 1
		if i >= 2*vc.e.cfg.Credits {
			r.mu.Unlock()
			m.credits = 0 // outside the window: the sender will resend it
			m.Release()
			return
		}
		for len(r.early) <= i {
			r.early = append(r.early, Message{})
		}
		if r.early[i].vc != nil {
			r.mu.Unlock()
			m.credits = 0
			m.Release()
			return
		}
		r.early[i] = m
		r.mu.Unlock()
		return
	}
	// In sequence: accept it and whatever it releases.
	r.inorder = append(r.inorder, m)
	r.rxNext++
	for len(r.early) > 0 && r.early[0].vc != nil {
		r.inorder = append(r.inorder, r.early[0])
		r.early = append(r.early[:0], r.early[1:]...)
		r.rxNext++
	}
	if len(r.early) > 0 {
		r.early = append(r.early[:0], r.early[1:]...)
	}
	// Hand over outside the lock (a handler may send on this vconn), one
	// goroutine at a time so the order holds across pollers.
	if !r.delivering {
		r.delivering = true
		for len(r.inorder) > 0 {
			next := r.inorder[0]
			r.inorder[0] = Message{}
			r.inorder = r.inorder[1:]
			r.mu.Unlock()
			vc.deliver(next)
			r.mu.Lock()
		}
		r.inorder = r.inorder[:0:cap(r.inorder)]
		r.delivering = false
	}
	pending := r.rxNext - r.ackSent
	r.mu.Unlock()
	if pending >= uint32(max(1, vc.e.cfg.Credits/2)) {
		if !vc.ackDue.Swap(true) {
			vc.schedule()
		}
		return
	}
	if !vc.ackWait.Swap(true) {
		p.acks = append(p.acks, vc)
	}
}

// flushAcks sends the delayed acknowledgements: the poller found nothing
// more to receive, so the senders are waiting or paused.
func (p *poller) flushAcks() {
	for i, vc := range p.acks {
		p.acks[i] = nil
		vc.ackWait.Store(false)
		r := vc.reliability()
		r.mu.Lock()
		pending := r.rxNext != r.ackSent
		r.mu.Unlock()
		if pending && !vc.ackDue.Swap(true) {
			vc.schedule()
		}
	}
	p.acks = p.acks[:0]
}

// releaseRel returns the buffers an Auto vconn holds.
func (vc *VConn) releaseRel() {
	r := vc.rel.Load()
	if r == nil {
		return
	}
	r.mu.Lock()
	unacked, early := r.unacked, r.early
	r.unacked, r.early = nil, nil
	r.mu.Unlock()
	for _, u := range unacked {
		vc.e.pool.put(u.slot)
	}
	for _, m := range early {
		if m.vc != nil {
			m.credits = 0
			m.Release()
		}
	}
}

// sendReliable transmits a copy of an Auto datagram and keeps the original
// until it is acknowledged. It reports false when no buffer is free now.
func (p *poller) sendReliable(vc *VConn, remote vqpn.ID, slot, n, seq uint32) bool {
	e := p.e
	tx, ok := e.pool.get(e.pool.class(int(n)))
	if !ok {
		return false
	}
	copy(e.pool.bytes(tx), e.pool.bytes(slot)[:n])
	p.postUD(vc, remote, tx, n)
	r := vc.reliability()
	r.mu.Lock()
	r.unacked = append(r.unacked, relMsg{seq: seq, slot: slot, n: n, sent: p.clock()})
	r.mu.Unlock()
	if !vc.rtxWatched {
		vc.rtxWatched = true
		p.rtx = append(p.rtx, vc)
	}
	return true
}

// retransmit resends the datagrams whose timeout passed, on the vconns the
// poller watches; it returns whether any vconn still waits for ACKs.
func (p *poller) retransmit(now time.Time) bool {
	e := p.e
	k := 0
	for _, vc := range p.rtx {
		r := vc.reliability()
		live := vc.state.Load() == stateOpen || vc.state.Load() == stateClosing
		remote := vqpn.ID(vc.remote.Load())
		r.mu.Lock()
		var dead bool
		for i := range r.unacked {
			u := &r.unacked[i]
			if !live || now.Sub(u.sent) < r.timeout(u.tries) {
				continue
			}
			if u.tries >= relMaxTries {
				dead = true
				break
			}
			if p.ud.outstanding+len(p.ud.batch) >= e.cfg.SQDepth || p.budget <= 0 {
				break
			}
			tx, ok := e.pool.get(e.pool.class(int(u.n)))
			if !ok {
				break
			}
			copy(e.pool.bytes(tx), e.pool.bytes(u.slot)[:u.n])
			binary.BigEndian.PutUint32(e.pool.bytes(tx)[20:], r.rxNext) // fresh ACK
			p.postUD(vc, remote, tx, u.n)
			u.sent, u.tries = now, u.tries+1
			e.stats.retransmits.Add(1)
		}
		waiting := len(r.unacked) > 0 && live
		r.mu.Unlock()
		if dead {
			vc.fail(fmt.Errorf("%w: no acknowledgement after %d retransmissions", ErrPeerGone, relMaxTries))
			waiting = false
		}
		if waiting {
			p.rtx[k] = vc
			k++
		} else {
			vc.rtxWatched = false
		}
	}
	clear(p.rtx[k:])
	p.rtx = p.rtx[:k]
	return k > 0
}
