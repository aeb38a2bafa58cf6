package naive

import (
	"errors"
	"fmt"
	"runtime"
	"sync"
	"sync/atomic"
	"time"

	"github.com/rdmavisor/rdmavisor/internal/verbs"
)

// Backoff of an idle poller: once its rounds have found nothing for
// spinFor (and at least Config.SpinRounds rounds), it sleeps between
// rounds, doubling from minSleep to maxSleep while they stay empty.
const (
	spinFor  = time.Millisecond
	minSleep = 20 * time.Microsecond
	maxSleep = time.Millisecond
)

// poller visits its conns' CQs in turn. It owns the conns it adopted: it
// polls their completions, reposts their released receive buffers, sends
// their credit messages, and destroys them once closed.
type poller struct {
	e        *Endpoint
	stopping atomic.Bool
	done     chan struct{}

	mu      sync.Mutex
	pending []*Conn // adopted, not yet in list; guarded by mu
	stopped bool    // guarded by mu: adopts no more

	// Owned by the poller goroutine (and by destroyAll once it stopped).
	list    []*Conn
	wcs     []verbs.WC
	recvWRs []verbs.RecvWR
	slots   []uint32
}

func newPoller(e *Endpoint) *poller {
	return &poller{e: e, done: make(chan struct{}), wcs: make([]verbs.WC, 32)}
}

// add hands c to the poller; false once it stopped.
func (p *poller) add(c *Conn) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.stopped {
		return false
	}
	p.pending = append(p.pending, c)
	return true
}

func (p *poller) run() {
	defer close(p.done)
	idle, sleep := 0, minSleep
	var idleSince time.Time
	for !p.stopping.Load() {
		if p.round() {
			idle, sleep = 0, minSleep
			continue
		}
		if idle == 0 {
			idleSince = time.Now()
		}
		idle++
		if idle < p.e.cfg.SpinRounds || time.Since(idleSince) < spinFor {
			runtime.Gosched()
			continue
		}
		time.Sleep(sleep)
		sleep = min(2*sleep, maxSleep)
	}
}

// round visits every conn once; it reports whether any had work.
func (p *poller) round() bool {
	p.mu.Lock()
	p.list = append(p.list, p.pending...)
	clear(p.pending)
	p.pending = p.pending[:0]
	p.mu.Unlock()
	busy := false
	k := 0
	for _, c := range p.list {
		if c.state.Load() == stateClosed {
			p.reap(c)
			busy = true
			continue
		}
		if p.visit(c) {
			busy = true
		}
		p.list[k] = c
		k++
	}
	clear(p.list[k:])
	p.list = p.list[:k]
	return busy
}

// reap destroys a closed conn. Holding sendMu waits out a sender that is
// posting; later ones see the state and stop.
func (p *poller) reap(c *Conn) {
	c.sendMu.Lock()
	// Destroying what this conn created cannot fail but on a provider bug;
	// the objects are gone either way.
	_ = c.destroy()
	c.sendMu.Unlock()
}

// visit polls one conn's CQ, reposts its released buffers and sends a
// credit message if one is due.
func (p *poller) visit(c *Conn) bool {
	n := c.cq.Poll(p.wcs)
	for i := 0; i < n; i++ {
		p.complete(c, &p.wcs[i])
	}
	k := p.repost(c)
	if (n > 0 || k > 0) && !c.ctlBusy && c.state.Load() == stateOpen &&
		c.reposted.Load()-c.granted.Load() >= uint32(max(1, p.e.cfg.RecvDepth/2)) {
		ok, err := c.postCredit()
		if err != nil {
			c.fail(err)
		}
		c.ctlBusy = ok
	}
	return n > 0 || k > 0
}

func (p *poller) complete(c *Conn, wc *verbs.WC) {
	if wc.Status != verbs.WCSuccess {
		if wc.Status != verbs.WCWRFlushErr {
			c.fail(wc.Err())
		}
		return
	}
	if wc.Opcode&verbs.WCRecv != 0 {
		p.onRecv(c, wc)
		return
	}
	// A send completion frees every WR up to it.
	seq := (wc.WRID &^ wridCtl) >> wridDataBits
	c.wrDone.Store(seq + 1)
	done := c.dataDone.Load()
	n := (wc.WRID - done) & wridDataMask
	c.dataDone.Store(done + n)
	c.e.release(n)
	if wc.WRID&wridCtl != 0 {
		c.ctlBusy = false
	}
	if c.waiters.Load() > 0 {
		c.wakeSenders()
	}
}

func (p *poller) onRecv(c *Conn, wc *verbs.WC) {
	g := wc.ImmData & immCredit
	if d := (g - c.peerGrant) & immCredit; d != 0 && d < 1<<30 {
		c.peerGrant = g
		c.limit.Add(uint64(d))
		if c.waiters.Load() > 0 {
			c.wakeSenders()
		}
	}
	slot := uint32(wc.WRID)
	if wc.ImmData&immCtl != 0 || wc.Flags&verbs.WCWithImm == 0 {
		// A credit message: its buffer goes straight back, without
		// granting a credit (it came from the reserve).
		p.recvWRs = append(p.recvWRs[:0], c.recvWR(slot))
		if _, err := c.qp.PostRecv(p.recvWRs); err != nil {
			c.fail(fmt.Errorf("naive: repost: %w", err))
		}
		return
	}
	if c.state.Load() == stateClosed {
		return
	}
	c.deliver(Message{Data: c.slotBytes(int(slot))[:wc.ByteLen], c: c, slot: slot})
}

func (c *Conn) recvWR(slot uint32) verbs.RecvWR {
	return verbs.RecvWR{WRID: uint64(slot), NumSGE: 1, SG: [verbs.MaxSGE]verbs.SGE{c.sge(int(slot), c.e.cfg.MaxMessage)}}
}

// repost posts the buffers the application released, in one batch, and
// counts them as credits; it returns how many.
func (p *poller) repost(c *Conn) int {
	if c.nreleased.Load() == 0 {
		return 0
	}
	c.relMu.Lock()
	p.slots, c.released = c.released, p.slots[:0]
	c.nreleased.Store(0)
	c.relMu.Unlock()
	if c.state.Load() != stateOpen {
		return 0
	}
	wrs := p.recvWRs[:0]
	for _, s := range p.slots {
		wrs = append(wrs, c.recvWR(s))
	}
	p.recvWRs = wrs
	n, err := c.qp.PostRecv(wrs)
	c.reposted.Add(uint32(n))
	if err != nil {
		c.fail(fmt.Errorf("naive: repost: %w", err))
	}
	return n
}

func (p *poller) stop() {
	p.mu.Lock()
	p.stopped = true
	p.mu.Unlock()
	p.stopping.Store(true)
	<-p.done
}

// destroyAll destroys every conn of a stopped poller.
func (p *poller) destroyAll() error {
	p.mu.Lock()
	p.list = append(p.list, p.pending...)
	p.pending = nil
	p.mu.Unlock()
	var errs []error
	for _, c := range p.list {
		_ = c.Close()
		c.sendMu.Lock()
		errs = append(errs, c.destroy())
		c.sendMu.Unlock()
	}
	p.list = nil
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("naive: destroy conns: %w", err)
	}
	return nil
}
