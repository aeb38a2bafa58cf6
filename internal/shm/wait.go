package shm

import (
	"errors"
	"fmt"
	"runtime"
	"time"
)

// ErrShut is a wait's doorbell that shut down or whose other side closed
// it: the segment is going, and what ends the caller's use of it (its
// vconn's end) follows.
var ErrShut = errors.New("shm: doorbell shut")

// Stop is asked by PushWait and Next before each sleep: an error ends the
// wait and is returned; otherwise it says how long the sleep may be
// (negative: until the other side rings), so that what else ends a
// caller's wait (a context, a deadline, a close) is seen within it.
type Stop func() (time.Duration, error)

// PushWait is Push that waits for room: the one way a producer, the
// agent's or the pod's, waits on its ring. It polls for SpinFor, yielding,
// then arms the ring, tries once more and sleeps on the doorbell until
// the consumer releases a descriptor. An error of Push (ErrTooLarge,
// ErrCorrupt) or of stop is returned, and one of the doorbell (shut
// down, or the other side closed it) as ErrShut.
func (p *Producer) PushWait(b []byte, imm, flags uint32, stop Stop) error {
	var spin Spinner
	for {
		ok, err := p.Push(b, imm, flags)
		if ok || err != nil {
			return err
		}
		d, err := stop()
		if err != nil {
			return err
		}
		if spin.More() {
			continue
		}
		p.Arm()
		if armed != nil {
			armed()
		}
		if ok, err := p.Push(b, imm, flags); ok || err != nil {
			return err
		}
		if !p.Armed() {
			// A release took the arm after it was set, before or after
			// that Push looked, and made too little room: nothing rings
			// for the next one. Arm again rather than sleep unannounced
			// (the agent's producer, which sleeps without a timeout,
			// stayed asleep with its RX ring drained: E6's stalled
			// stream).
			continue
		}
		if _, err := p.Wait(d); err != nil {
			return fmt.Errorf("%w: %w", ErrShut, err)
		}
	}
}

// armed, where a test sets it, runs in PushWait between Arm and the
// Push that follows: where a release that takes the arm lands.
var armed func()

// Next is Peek that waits for a descriptor, as PushWait waits for room:
// the one way a consumer waits on its ring. The payload aliases shared
// memory until Release.
func (c *Consumer) Next(stop Stop) (Desc, []byte, error) {
	var spin Spinner
	for {
		d, b, ok, err := c.Peek()
		if ok || err != nil {
			return d, b, err
		}
		t, err := stop()
		if err != nil {
			return Desc{}, nil, err
		}
		if spin.More() || c.Arm() {
			continue
		}
		if _, err := c.Wait(t); err != nil {
			return Desc{}, nil, fmt.Errorf("%w: %w", ErrShut, err)
		}
	}
}

// Spinner is a wait's spin: SpinFor from the first look that found
// nothing, yielding the processor between looks. Every wait on a ring
// spins with one: PushWait, Next, and pkg/vconn's receive loop.
type Spinner struct {
	start time.Time
	d     time.Duration
}

// More reports whether the wait should look again before it sleeps.
func (s *Spinner) More() bool {
	if s.start.IsZero() {
		s.start, s.d = time.Now(), SpinFor()
	}
	if s.d == 0 || time.Since(s.start) >= s.d {
		return false
	}
	runtime.Gosched()
	return true
}
