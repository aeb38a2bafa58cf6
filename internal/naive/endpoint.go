package naive

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"

	"github.com/rdmavisor/rdmavisor/internal/verbs"
)

// Errors a connection reports.
var (
	ErrClosed         = errors.New("naive: connection closed")
	ErrTooLarge       = errors.New("naive: message larger than the maximum")
	ErrEndpointClosed = errors.New("naive: endpoint closed")
)

// Config configures an Endpoint. Zero fields take the defaults noted.
type Config struct {
	// MaxMessage is the largest message and the size of every buffer
	// (default 16 KiB, the engine's receive buffer size: the largest
	// message either design receives into one buffer).
	MaxMessage int
	// RecvDepth is the receive buffers per connection that carry data:
	// the credit window (default 16). Two more are posted for credit
	// messages.
	RecvDepth int
	// SendDepth is the send buffers per connection, and so the data
	// messages it may have posted and not completed (default 16).
	SendDepth int
	// MaxInline is the largest message sent inline, copied into the work
	// request instead of a send buffer (default 64; -1: never).
	MaxInline int
	// SignalEvery requests a send completion every this many work
	// requests (default SendDepth/4).
	SignalEvery int
	// Pollers is the number of goroutines that poll the connections' CQs
	// (default 1, as the engine).
	Pollers int
	// MTU is the path MTU (default: the device's active MTU).
	MTU verbs.MTU
	// SpinRounds is the fewest empty rounds a poller makes, busy, before
	// it starts sleeping between rounds; it also spins for at least a
	// millisecond (default 64).
	SpinRounds int
	// Window bounds the data messages all the endpoint's connections
	// together have posted and not seen complete (0: unbounded, only
	// SendDepth per connection). It is what a careful application with
	// thousands of connections does so that their sum cannot overrun the
	// peer's receive ring and turn into retransmission timeouts: with it,
	// more connections degrade the rate instead of failing sends. A
	// window needs to see every send complete, so it signals every data
	// message (SignalEvery is 1): an unsignalled tail would hold its
	// share of the window until the connection sent again.
	Window int
}

const (
	defaultMaxMessage = 16 << 10
	defaultDepth      = 16
	defaultMaxInline  = 64
	defaultSpinRounds = 64
	// ctlBuffers are the receive buffers beyond the credit window that
	// credit messages land in.
	ctlBuffers = 2
)

func (c Config) withDefaults(dev verbs.Device) (Config, error) {
	set := func(v *int, d int) {
		if *v == 0 {
			*v = d
		}
	}
	set(&c.MaxMessage, defaultMaxMessage)
	set(&c.RecvDepth, defaultDepth)
	set(&c.SendDepth, defaultDepth)
	set(&c.MaxInline, defaultMaxInline)
	set(&c.SignalEvery, max(1, c.SendDepth/4))
	if c.Window > 0 {
		c.SignalEvery = 1
	}
	set(&c.Pollers, 1)
	set(&c.SpinRounds, defaultSpinRounds)
	if c.MaxInline < 0 {
		c.MaxInline = 0
	}
	if c.MTU == 0 {
		c.MTU = dev.Attr().ActiveMTU
	}
	var errs []error
	check := func(ok bool, format string, args ...any) {
		if !ok {
			errs = append(errs, fmt.Errorf("naive: config: "+format, args...))
		}
	}
	check(c.MaxMessage >= 1 && c.MaxMessage <= 1<<30, "MaxMessage %d: want 1..1 GiB", c.MaxMessage)
	check(c.RecvDepth >= 2 && c.RecvDepth <= 1<<14, "RecvDepth %d: want 2..16384", c.RecvDepth)
	check(c.SendDepth >= 1 && c.SendDepth <= 1<<14, "SendDepth %d: want 1..16384", c.SendDepth)
	check(c.MaxInline <= 1024, "MaxInline %d: want at most 1024", c.MaxInline)
	check(c.SignalEvery >= 1 && c.SignalEvery <= c.SendDepth, "SignalEvery %d: want 1..SendDepth (%d)", c.SignalEvery, c.SendDepth)
	check(c.Window >= 0 && c.Window <= 1<<24, "Window %d: want 0..16777216", c.Window)
	check(c.Pollers >= 1 && c.Pollers <= 64, "Pollers %d: want 1..64", c.Pollers)
	check(c.MTU.Bytes() != 0, "MTU %v is not an IB MTU", c.MTU)
	return c, errors.Join(errs...)
}

// Endpoint is one side's naive connections on a device: a PD and the
// pollers. Every Conn brings its own QP, CQ and registered buffers.
type Endpoint struct {
	cfg     Config
	dev     verbs.Device
	pd      verbs.PD
	gid     verbs.GID
	pollers []*poller
	next    atomic.Uint32 // round-robin of new conns over pollers

	live       atomic.Int64 // conns not yet destroyed
	registered atomic.Int64 // bytes of the live conns' regions
	closed     atomic.Bool
	closeMu    sync.Mutex // serialises Close

	// window holds a token per data message in flight (Config.Window);
	// nil without a window.
	window chan struct{}
}

// New opens an endpoint on dev and starts its pollers. The device stays the
// caller's.
func New(dev verbs.Device, cfg Config) (*Endpoint, error) {
	if dev == nil {
		return nil, errors.New("naive: no device")
	}
	cfg, err := cfg.withDefaults(dev)
	if err != nil {
		return nil, err
	}
	gid, err := dev.GID(0)
	if err != nil {
		return nil, fmt.Errorf("naive: %w", err)
	}
	pd, err := dev.AllocPD()
	if err != nil {
		return nil, fmt.Errorf("naive: %w", err)
	}
	e := &Endpoint{cfg: cfg, dev: dev, pd: pd, gid: gid}
	if cfg.Window > 0 {
		e.window = make(chan struct{}, cfg.Window)
	}
	for i := 0; i < cfg.Pollers; i++ {
		p := newPoller(e)
		e.pollers = append(e.pollers, p)
		go p.run()
	}
	return e, nil
}

// Config returns the endpoint's configuration, defaults filled in.
func (e *Endpoint) Config() Config { return e.cfg }

// GID is the endpoint's device address.
func (e *Endpoint) GID() verbs.GID { return e.gid }

// Stats is a snapshot of an endpoint's resources.
type Stats struct {
	Conns           int   // connections not yet destroyed
	QPs             int   // one per connection
	CQs             int   // one per connection
	RegisteredBytes int64 // registered by the connections (the PD's regions)
}

// Stats returns the endpoint's counts.
func (e *Endpoint) Stats() Stats {
	n := int(e.live.Load())
	return Stats{Conns: n, QPs: n, CQs: n, RegisteredBytes: e.registered.Load()}
}

// Close closes every connection, stops the pollers and frees the PD. The
// device stays open.
func (e *Endpoint) Close() error {
	e.closeMu.Lock()
	defer e.closeMu.Unlock()
	if e.closed.Swap(true) {
		return nil
	}
	for _, p := range e.pollers {
		p.stop()
	}
	var errs []error
	for _, p := range e.pollers {
		errs = append(errs, p.destroyAll())
	}
	errs = append(errs, e.pd.Close())
	return errors.Join(errs...)
}

// acquire takes a window token for one data message, waiting for one if
// block; false if it did not (ctx ended, or none free and !block).
func (e *Endpoint) acquire(ctx context.Context, block bool) (bool, error) {
	if e.window == nil {
		return true, nil
	}
	select {
	case e.window <- struct{}{}:
		return true, nil
	default:
	}
	if !block {
		return false, nil
	}
	select {
	case e.window <- struct{}{}:
		return true, nil
	case <-ctx.Done():
		return false, ctx.Err()
	}
}

// release returns n window tokens.
func (e *Endpoint) release(n uint64) {
	if e.window == nil {
		return
	}
	for ; n > 0; n-- {
		select {
		case <-e.window:
		default:
			return // never more than were taken
		}
	}
}
