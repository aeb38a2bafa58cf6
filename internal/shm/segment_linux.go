package shm

import (
	"fmt"

	"golang.org/x/sys/unix"
)

// Segment is one vconn's shared memory: the memfd mapping with ring TX
// (pod to agent) and ring RX (agent to pod), and this side's ends of their
// doorbells.
type Segment struct {
	Layout Layout
	mem    []byte
	tx, rx *Bell
	// peer holds, on the agent until Send, what the pod gets: the memfd
	// and the pod's ends of the doorbells, in Files order.
	peer []int
}

// Create makes a segment on the agent's side: a sealed memfd (NewMemfd)
// mapped here, and two doorbells.
func Create(name string, l Layout) (*Segment, error) {
	if err := l.Validate(); err != nil {
		return nil, err
	}
	fd, mem, err := NewMemfd(name, l.Size())
	if err != nil {
		return nil, err
	}
	s := &Segment{Layout: l, mem: mem, peer: []int{fd}}
	fail := func(err error) (*Segment, error) {
		_ = s.Close()
		return nil, err
	}
	for _, b := range []**Bell{&s.tx, &s.rx} {
		fds, err := socketpair()
		if err != nil {
			return fail(err)
		}
		*b = newBell(fds[0])
		s.peer = append(s.peer, fds[1]) // a plain descriptor: no File to close it behind ClosePeer's back
	}
	return s, nil
}

// Files are the descriptors to pass to the pod (memfd, TX doorbell, RX
// doorbell), owned by the segment until ClosePeer.
func (s *Segment) Files() []int { return s.peer }

// ClosePeer closes the agent's copies of the pod's descriptors, once sent
// (or not to be).
func (s *Segment) ClosePeer() {
	CloseFDs(s.peer)
	s.peer = nil
}

// Open maps a segment on the pod's side from the descriptors the agent
// passed (in Files order). It takes ownership of fds, closing them on
// failure, and keeps none but the doorbells: the mapping outlives the
// memfd's descriptor.
func Open(l Layout, fds []int) (s *Segment, err error) {
	defer func() {
		if err != nil {
			for _, fd := range fds {
				_ = unix.Close(fd)
			}
		}
	}()
	if err := l.Validate(); err != nil {
		return nil, err
	}
	if len(fds) != 3 {
		return nil, fmt.Errorf("shm: open: %d descriptors, want 3", len(fds))
	}
	mem, err := MapMemfd(fds[0], l.Size())
	if err != nil {
		return nil, err
	}
	// From here each descriptor is closed on its own path: bellFromFD
	// closes the one it is given when it fails.
	rest := fds
	fds = nil
	_ = unix.Close(rest[0])
	s = &Segment{Layout: l, mem: mem}
	if s.tx, err = bellFromFD(rest[1]); err != nil {
		_ = unix.Close(rest[2])
		_ = unix.Munmap(mem)
		return nil, err
	}
	if s.rx, err = bellFromFD(rest[2]); err != nil {
		_ = s.tx.Close()
		_ = unix.Munmap(mem)
		return nil, err
	}
	return s, nil
}

func (s *Segment) rings() (tx, rx ring) {
	n := s.Layout.ringLen()
	return newRing(s.mem[:n:n], s.Layout), newRing(s.mem[n:], s.Layout)
}

// Agent returns the agent's ends: it consumes TX and produces RX.
func (s *Segment) Agent() (*Consumer, *Producer) {
	tx, rx := s.rings()
	return newConsumer(tx, s.tx), newProducer(rx, s.rx)
}

// Pod returns the pod's ends: it produces TX and consumes RX.
func (s *Segment) Pod() (*Producer, *Consumer) {
	tx, rx := s.rings()
	return newProducer(tx, s.tx), newConsumer(rx, s.rx)
}

// Shutdown shuts this side's doorbells: every Wait returns an error.
// The mapping stays until Close.
func (s *Segment) Shutdown() {
	if s.tx != nil {
		s.tx.Shutdown()
	}
	if s.rx != nil {
		s.rx.Shutdown()
	}
}

// Close shuts the segment down and unmaps it. No goroutine may use its
// rings any more: the caller waits for them first.
func (s *Segment) Close() error {
	for _, b := range []*Bell{s.tx, s.rx} {
		if b != nil {
			_ = b.Close()
		}
	}
	s.ClosePeer()
	if s.mem == nil {
		return nil
	}
	err := unix.Munmap(s.mem)
	s.mem = nil
	if err != nil {
		return fmt.Errorf("shm: unmap: %w", err)
	}
	return nil
}

// Bytes is the mapping, for tests that play a hostile pod.
func (s *Segment) Bytes() []byte { return s.mem }
