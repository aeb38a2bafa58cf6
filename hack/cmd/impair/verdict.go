package main

import (
	"math/rand/v2"
	"time"
)

// action is what the policy decides for one packet.
type action int

const (
	accept action = iota
	drop
	hold
)

// policy draws one action per packet. One uniform draw decides both, so
// the drop and hold fractions are each exactly what was asked, of all
// packets (netem's reorder applies to the packets it did not drop; for a
// few percent the difference does not matter).
type policy struct {
	rng           *rand.Rand
	loss, reorder float64
}

func newPolicy(seed uint64, loss, reorder float64) *policy {
	return &policy{rng: rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15)), loss: loss, reorder: reorder}
}

func (p *policy) next() action {
	u := p.rng.Float64()
	switch {
	case u < p.loss:
		return drop
	case u < p.loss+p.reorder:
		return hold
	}
	return accept
}

// heldPacket is a packet whose verdict is withheld.
type heldPacket struct {
	id    uint32
	since time.Time
}

// scheduler turns the policy's actions into verdicts. It is pure: the
// caller gives it the time and sends the verdicts it returns, in order.
// A held packet is released right after the next accepted packet, so it
// reaches the wire behind it, or once it has waited holdMax.
type scheduler struct {
	pol     *policy
	holdMax time.Duration
	held    []heldPacket
	stats   stats
}

// stats are the scheduler's counters.
type stats struct {
	Packets   uint64 `json:"packets"`
	Dropped   uint64 `json:"dropped"`
	Reordered uint64 `json:"reordered"`
}

// packet takes a new packet and returns the ids to accept now, in order,
// and whether to drop this one.
func (s *scheduler) packet(id uint32, now time.Time) (release []uint32, dropIt bool) {
	s.stats.Packets++
	switch s.pol.next() {
	case drop:
		s.stats.Dropped++
		return nil, true
	case hold:
		s.stats.Reordered++
		s.held = append(s.held, heldPacket{id, now})
		return nil, false
	}
	release = append(release, id)
	for _, h := range s.held {
		release = append(release, h.id)
	}
	s.held = s.held[:0]
	return release, false
}

// expire returns the held packets that have waited holdMax by now.
func (s *scheduler) expire(now time.Time) []uint32 {
	var out []uint32
	n := 0
	for _, h := range s.held {
		if now.Sub(h.since) >= s.holdMax {
			out = append(out, h.id)
		} else {
			s.held[n] = h
			n++
		}
	}
	s.held = s.held[:n]
	return out
}

// flush returns every held packet (on exit: none is left without a verdict).
func (s *scheduler) flush() []uint32 {
	out := make([]uint32, 0, len(s.held))
	for _, h := range s.held {
		out = append(out, h.id)
	}
	s.held = s.held[:0]
	return out
}
