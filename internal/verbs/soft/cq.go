package soft

import (
	"encoding/binary"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"

	"golang.org/x/sys/unix"

	"github.com/rdmavisor/rdmavisor/internal/verbs"
)

// cq is a completion ring. Producers are the device (receive loop, timers,
// posting goroutines); the consumer polls. The eventfd is the completion
// channel: armed by ReqNotify, written once by the next completion.
type cq struct {
	dev *Device

	mu   sync.Mutex
	ring []verbs.WC // guarded by mu
	head int        // next to poll; guarded by mu
	n    int        // entries queued; guarded by mu
	// queued mirrors n so that polling an empty CQ takes no lock: on a
	// NIC it is one read of the next CQE's owner bit, and a poller that
	// spins polls empty CQs far more often than full ones.
	queued   atomic.Int32
	armed    bool   // guarded by mu
	solOnly  bool   // guarded by mu
	closed   bool   // guarded by mu
	overruns uint64 // guarded by mu
	users    int    // QPs using this CQ; guarded by mu

	// The completion channel is created on first use (FD or ReqNotify),
	// as libibverbs makes none for a CQ without one: a process with
	// thousands of polled-only CQs needs no descriptor for each.
	efdOnce sync.Once
	efd     int // -1 until created; written once under efdOnce
	efdErr  error
	wbuf    [8]byte
	// note, once set (NotifyTo), takes the events instead of the eventfd.
	note chan<- struct{}
	rbuf [8]byte
	rmu  sync.Mutex // serialises AckEvents' reads into rbuf
}

var (
	_ verbs.CQ       = (*cq)(nil)
	_ verbs.Notifier = (*cq)(nil)
)

func newCQ(cqe int) (*cq, error) {
	c := &cq{ring: make([]verbs.WC, cqe), efd: -1}
	binary.NativeEndian.PutUint64(c.wbuf[:], 1)
	return c, nil
}

// channel creates the completion channel's eventfd on first use.
func (c *cq) channel() (int, error) {
	c.efdOnce.Do(func() {
		fd, err := unix.Eventfd(0, unix.EFD_NONBLOCK|unix.EFD_CLOEXEC)
		if err != nil {
			c.efdErr = fmt.Errorf("soft: completion channel: eventfd: %w", err)
			return
		}
		c.efd = fd
	})
	return c.efd, c.efdErr
}

// Poll moves up to len(wcs) completions into wcs.
func (c *cq) Poll(wcs []verbs.WC) int {
	if c.queued.Load() == 0 {
		return 0
	}
	c.mu.Lock()
	k := 0
	for k < len(wcs) && c.n > 0 {
		wcs[k] = c.ring[c.head]
		c.head++
		if c.head == len(c.ring) {
			c.head = 0
		}
		c.n--
		k++
	}
	c.queued.Store(int32(c.n))
	c.mu.Unlock()
	return k
}

// push queues a completion. solicited marks a receive completion of a
// message sent with the solicited-event bit.
func (c *cq) push(wc *verbs.WC, solicited bool) {
	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		return
	}
	if c.n == len(c.ring) {
		// CQ overrun: hardware raises IBV_EVENT_CQ_ERR and the completion
		// is lost. Size CQs for the work queues that feed them.
		c.overruns++
		c.mu.Unlock()
		c.dev.stats.cqOverruns.Add(1)
		return
	}
	i := c.head + c.n
	if i >= len(c.ring) {
		i -= len(c.ring)
	}
	c.ring[i] = *wc
	c.n++
	c.queued.Store(int32(c.n))
	notify := c.armed && (!c.solOnly || solicited || wc.Status != verbs.WCSuccess)
	if notify {
		c.armed = false
		if c.note != nil {
			select {
			case c.note <- struct{}{}:
			default: // a wake-up is pending already
			}
		} else {
			_, _ = unix.Write(c.efd, c.wbuf[:])
		}
	}
	c.mu.Unlock()
}

// NotifyTo sends the completion events on ch (verbs.Notifier).
func (c *cq) NotifyTo(ch chan<- struct{}) {
	c.mu.Lock()
	c.note = ch
	c.mu.Unlock()
}

// ReqNotify arms the completion channel for the next completion.
func (c *cq) ReqNotify(solicitedOnly bool) error {
	c.mu.Lock()
	note := c.note != nil
	c.mu.Unlock()
	if !note {
		if _, err := c.channel(); err != nil {
			return err
		}
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		return fmt.Errorf("soft: req notify: %w", verbs.ErrClosed)
	}
	c.armed = true
	c.solOnly = solicitedOnly
	return nil
}

// FD is the completion channel's descriptor (an eventfd).
func (c *cq) FD() int {
	fd, _ := c.channel()
	return fd
}

// AckEvents consumes pending events without blocking.
func (c *cq) AckEvents() (int, error) {
	fd, err := c.channel()
	if err != nil {
		return 0, err
	}
	c.rmu.Lock()
	defer c.rmu.Unlock()
	_, err = unix.Read(fd, c.rbuf[:])
	if errors.Is(err, unix.EAGAIN) {
		return 0, nil
	}
	if err != nil {
		return 0, fmt.Errorf("soft: cq events: %w", err)
	}
	return int(binary.NativeEndian.Uint64(c.rbuf[:])), nil
}

// Close destroys the CQ; it fails with ErrBusy while QPs use it.
func (c *cq) Close() error {
	c.mu.Lock()
	if c.users > 0 {
		n := c.users
		c.mu.Unlock()
		return fmt.Errorf("soft: destroy cq: %d QPs still use it: %w", n, verbs.ErrBusy)
	}
	if c.closed {
		c.mu.Unlock()
		return fmt.Errorf("soft: destroy cq: %w", verbs.ErrClosed)
	}
	c.closed = true
	c.mu.Unlock()
	c.dev.children.Add(-1)
	c.efdOnce.Do(func() {}) // no channel is created after this
	if c.efd >= 0 {
		return unix.Close(c.efd)
	}
	return nil
}

func (c *cq) use(delta int) {
	c.mu.Lock()
	c.users += delta
	c.mu.Unlock()
}
