package shm

import (
	"errors"
	"fmt"
	"io"
	"os"
	"sync"
	"sync/atomic"
	"syscall"
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
// Wait parks its goroutine in the runtime's network poller rather than
// blocking its thread in poll(2): a thread in a system call keeps its P
// until sysmon retakes it, so with a handful of sleepers (each side of
// each vconn, in one process in tests) every P could be stuck in poll(2)
// while the goroutine a ring made runnable (or the UDP device's receiver,
// itself in the network poller) waited for one. Measured on two cores:
// 0.1-2.7 ms from Ring to the sleeper running, the round trip 1.5-2 ms.
// A parked goroutine gives its P back at once, and a P that runs out of
// work waits in the network poller itself, so it wakes the sleeper as
// soon as the kernel says.
type Bell struct {
	fd   int             // -1 once closed; guarded by mu for Ring and Close
	f    *os.File        // fd, registered with the network poller; Wait's
	rc   syscall.RawConn // f's, for waitReady
	mu   sync.RWMutex    // Ring holds it shared: no write to a reused descriptor
	shut bool            // guarded by mu: Shutdown was called
	down atomic.Bool     // Shutdown was called: for waitReady's callers
}

var one = []byte{1}

// socketpair returns the two descriptors of a doorbell.
func socketpair() ([2]int, error) {
	fds, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_STREAM|unix.SOCK_NONBLOCK|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return [2]int{-1, -1}, fmt.Errorf("shm: doorbell socketpair: %w", err)
	}
	return [2]int{fds[0], fds[1]}, nil
}

// newBell takes ownership of fd, a non-blocking stream socket.
func newBell(fd int) *Bell {
	// Non-blocking, so os.NewFile registers it with the network poller.
	b := &Bell{fd: fd, f: os.NewFile(uintptr(fd), "shm-doorbell")}
	b.rc, _ = b.f.SyscallConn() // fails only for a nil file
	return b
}

// newBellPair returns the two ends of a doorbell.
func newBellPair() (*Bell, *Bell, error) {
	fds, err := socketpair()
	if err != nil {
		return nil, nil, err
	}
	return newBell(fds[0]), newBell(fds[1]), nil
}

// bellFromFD takes ownership of fd, which must be a stream socket; it is
// made non-blocking, so that a Wait's read never blocks its thread.
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
	return newBell(fd), nil
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
// other side closed its end. Any number of goroutines may wait; they
// share the descriptor's deadline, so one may return early, not rung
// (callers loop). A sleep that times out allocates (the os.PathError of
// the deadline); one that is rung does not.
func (b *Bell) Wait(timeout time.Duration) (bool, error) {
	var buf [64]byte // drains up to 64 pending rings at once
	// A ring already pending costs no deadline and no trip through the
	// poller (which also refuses to read once a deadline passed).
	n, err := unix.Read(b.fd, buf[:])
	switch {
	case n > 0:
		return true, nil
	case n == 0 && err == nil:
		return false, fmt.Errorf("shm: doorbell: %w", os.ErrClosed) // shut down, or the other side closed
	case err != unix.EAGAIN:
		return false, fmt.Errorf("shm: doorbell: %w", err)
	case timeout == 0:
		return false, nil
	}
	var dl time.Time
	if timeout > 0 {
		dl = time.Now().Add(timeout)
	}
	if err := b.f.SetReadDeadline(dl); err != nil {
		return false, fmt.Errorf("shm: doorbell: %w", err)
	}
	n, err = b.f.Read(buf[:])
	switch {
	case n > 0:
		return true, nil
	case errors.Is(err, os.ErrDeadlineExceeded):
		return false, nil
	case err == nil || err == io.EOF:
		return false, fmt.Errorf("shm: doorbell: %w", os.ErrClosed)
	default:
		return false, fmt.Errorf("shm: doorbell: %w", err)
	}
}

// waitReady is Wait for a ring's end, which learns from shared memory
// whether it was rung: after the rings pending since the last wait are
// drained, it sleeps until the
// descriptor becomes readable and ready says there is something to look
// at. ready reads shared memory (and Down) first, so the wake-up costs no
// read between the ring and the caller's look at the ring, and the byte
// that woke it is drained by the next wait; only where shared memory
// shows nothing does ready call rung. ready is called once before the
// sleep, after the network poller forgot earlier readiness, so a ring
// that came before is seen there. A bell whose other side closed wakes
// it (rung sees EOF), and the next wait reports the close.
func (b *Bell) waitReady(timeout time.Duration, ready func(uintptr) bool) (bool, error) {
	var buf [64]byte
	n, err := unix.Read(b.fd, buf[:])
	switch {
	case n == 0 && err == nil:
		return false, fmt.Errorf("shm: doorbell: %w", os.ErrClosed)
	case n <= 0 && err != unix.EAGAIN:
		return false, fmt.Errorf("shm: doorbell: %w", err)
	case timeout == 0:
		return n > 0, nil
	}
	// What rang before is drained: the other side rings only after it
	// changed shared memory, which ready looks at first, so a ring that
	// came after the caller's Arm shows there and a ring from before
	// needs no second look.
	var dl time.Time
	if timeout > 0 {
		dl = time.Now().Add(timeout)
	}
	if err := b.f.SetReadDeadline(dl); err != nil {
		return false, fmt.Errorf("shm: doorbell: %w", err)
	}
	switch err := b.rc.Read(ready); {
	case err == nil && b.Down():
		return false, fmt.Errorf("shm: doorbell: %w", os.ErrClosed)
	case err == nil:
		return true, nil
	case errors.Is(err, os.ErrDeadlineExceeded):
		return false, nil
	default:
		return false, fmt.Errorf("shm: doorbell: %w", err)
	}
}

// rung is the look at the descriptor itself by waitReady's callers'
// ready, where shared memory shows nothing: true when a ring (which it
// drains) or EOF is pending.
func rung(fd uintptr) bool {
	var buf [64]byte
	n, err := unix.Read(int(fd), buf[:])
	return n > 0 || n == 0 && err == nil
}

// Down reports whether Shutdown was called.
func (b *Bell) Down() bool { return b.down.Load() }

// Shutdown ends every Wait, now and later (shutdown(2) makes the end
// readable at EOF), keeping the descriptor until Close.
func (b *Bell) Shutdown() {
	b.down.Store(true)
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
	err := b.f.Close()
	b.fd = -1
	return err
}

// dupFD returns a duplicate of the bell's descriptor, for passing on.
func (b *Bell) dupFD() (int, error) { return unix.FcntlInt(uintptr(b.fd), unix.F_DUPFD_CLOEXEC, 0) }
