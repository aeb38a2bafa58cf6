package shm

import (
	"errors"
	"fmt"
	"os"
	"sync"
	"time"

	"golang.org/x/sys/unix"
)

// Bell is one end of a doorbell: a unix stream socketpair whose other end
// the other side holds. Ring writes a byte to the other side; Wait reads
// what the other side wrote.
//
// A socketpair rather than an eventfd: its two ends are separate open
// files, so the pod can neither clear O_NONBLOCK on the agent's end nor
// read, and so steal, the agent's wake-ups.
//
// Wait blocks its thread in poll(2), not in the runtime's network poller:
// a P checks that poller only when it has nothing else to run (or every
// 10 ms), and the engine's pollers and these rings' own spinning yield
// constantly, so a wake-up through it could wait milliseconds. A thread
// in a system call wakes as soon as the kernel says (the engine's pollers
// sleep the same way).
type Bell struct {
	fd   int          // -1 once closed; guarded by mu for Ring and Close
	mu   sync.RWMutex // Ring holds it shared: no write to a reused descriptor
	shut bool         // guarded by mu: Shutdown was called
}

var one = []byte{1}

// newBellPair returns the two ends of a doorbell.
func newBellPair() (*Bell, *Bell, error) {
	fds, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_STREAM|unix.SOCK_NONBLOCK|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return nil, nil, fmt.Errorf("shm: doorbell socketpair: %w", err)
	}
	return &Bell{fd: fds[0]}, &Bell{fd: fds[1]}, nil
}

// bellFromFD takes ownership of fd, which must be a stream socket; it is
// made non-blocking, so that a Wait's read after poll never blocks.
func bellFromFD(fd int) (*Bell, error) {
	t, err := unix.GetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_TYPE)
	if err != nil || t != unix.SOCK_STREAM {
		_ = unix.Close(fd)
		return nil, fmt.Errorf("shm: doorbell fd %d is not a stream socket (type %d): %w", fd, t, errors.Join(err, ErrNotBell))
	}
	if err := unix.SetNonblock(fd, true); err != nil {
		_ = unix.Close(fd)
		return nil, fmt.Errorf("shm: doorbell: %w", err)
	}
	return &Bell{fd: fd}, nil
}

// ErrNotBell is a descriptor passed as a doorbell that is not one.
var ErrNotBell = errors.New("shm: not a doorbell")

// Ring wakes the other side. It never blocks: a full socket buffer means
// wake-ups are already pending, so losing this one loses nothing. A nil
// Bell (a ring without doorbells, in tests) does nothing.
func (b *Bell) Ring() {
	if b == nil {
		return
	}
	b.mu.RLock()
	if b.fd >= 0 {
		_, _ = unix.Write(b.fd, one)
	}
	b.mu.RUnlock()
}

// Wait sleeps until the other side rang (at once if it has since the last
// Wait), the bell shut down, or timeout passed (negative: none). It
// reports whether it was rung; an error means the bell is shut or the
// other side closed its end. Any number of goroutines may wait.
func (b *Bell) Wait(timeout time.Duration) (bool, error) {
	ms := -1
	if timeout >= 0 {
		ms = int((timeout + time.Millisecond - 1) / time.Millisecond)
	}
	fds := [1]unix.PollFd{{Fd: int32(b.fd), Events: unix.POLLIN}}
	var buf [64]byte // drains up to 64 pending rings at once
	for {
		n, err := unix.Read(b.fd, buf[:])
		switch {
		case n > 0:
			return true, nil
		case n == 0 && err == nil:
			return false, fmt.Errorf("shm: doorbell: %w", os.ErrClosed) // shut down, or the other side closed
		case err != unix.EAGAIN:
			return false, fmt.Errorf("shm: doorbell: %w", err)
		}
		k, err := unix.Poll(fds[:], ms)
		if err != nil && err != unix.EINTR {
			return false, fmt.Errorf("shm: doorbell: %w", err)
		}
		if k == 0 && ms >= 0 {
			return false, nil
		}
	}
}

// Shutdown ends every Wait, now and later (shutdown(2) makes the end
// readable at EOF), keeping the descriptor until Close.
func (b *Bell) Shutdown() {
	b.mu.Lock()
	defer b.mu.Unlock()
	if !b.shut && b.fd >= 0 {
		b.shut = true
		_ = unix.Shutdown(b.fd, unix.SHUT_RDWR)
	}
}

// Close shuts the bell down and closes its descriptor; no Wait may be in
// progress or follow (a Ring may: it does nothing).
func (b *Bell) Close() error {
	b.Shutdown()
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.fd < 0 {
		return nil
	}
	err := unix.Close(b.fd)
	b.fd = -1
	return err
}

// dupFD returns a duplicate of the bell's descriptor, for passing on.
func (b *Bell) dupFD() (int, error) { return unix.FcntlInt(uintptr(b.fd), unix.F_DUPFD_CLOEXEC, 0) }

// BellSet sleeps on several bells at once: one goroutine serving the
// rings of many vconns. Not safe for concurrent use.
type BellSet struct {
	fds []unix.PollFd
}

// Reset empties the set, keeping its memory.
func (s *BellSet) Reset() { s.fds = s.fds[:0] }

// Add puts b in the set; b must stay open while the set waits on it.
func (s *BellSet) Add(b *Bell) {
	s.fds = append(s.fds, unix.PollFd{Fd: int32(b.fd), Events: unix.POLLIN})
}

// Wait sleeps until a bell of the set is rung or timeout passes
// (negative: none), and drains what rang. A bell whose other end closed
// (or that shut down) leaves the set, so that it cannot keep Wait from
// sleeping; the set is otherwise kept.
func (s *BellSet) Wait(timeout time.Duration) error {
	ms := -1
	if timeout >= 0 {
		ms = int((timeout + time.Millisecond - 1) / time.Millisecond)
	}
	for {
		_, err := unix.Poll(s.fds, ms)
		if err == unix.EINTR {
			continue
		}
		if err != nil {
			return fmt.Errorf("shm: doorbells: %w", err)
		}
		break
	}
	var buf [64]byte
	for i := range s.fds {
		f := &s.fds[i]
		if f.Fd < 0 || f.Revents == 0 {
			continue
		}
		for {
			n, err := unix.Read(int(f.Fd), buf[:])
			if n == 0 && err == nil || err != nil && err != unix.EAGAIN && err != unix.EINTR {
				f.Fd = -1 // EOF or broken: poll(2) skips negative descriptors
			}
			if n < len(buf) {
				break
			}
		}
	}
	return nil
}

// NewBellPair returns the two ends of a doorbell within one process: a
// poller's way to be woken for something other than its rings.
func NewBellPair() (*Bell, *Bell, error) { return newBellPair() }
