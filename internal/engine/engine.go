package engine

import (
	"context"
	"errors"
	"fmt"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"github.com/go-logr/logr"

	"github.com/rdmavisor/rdmavisor/internal/engine/credit"
	"github.com/rdmavisor/rdmavisor/internal/engine/format"
	"github.com/rdmavisor/rdmavisor/internal/engine/reliable"
	"github.com/rdmavisor/rdmavisor/internal/verbs"
	"github.com/rdmavisor/rdmavisor/internal/vqpn"
)

// Errors a vconn reports to its application.
var (
	ErrClosed       = errors.New("engine: vconn closed")
	ErrPeerGone     = errors.New("engine: peer gone")
	ErrQPFailed     = errors.New("engine: shared QP failed")
	ErrTooLarge     = errors.New("engine: message larger than the maximum")
	ErrNotOpen      = errors.New("engine: vconn not open")
	ErrEngineClosed = errors.New("engine: engine closed")
	ErrReset        = errors.New("engine: vconn reset by peer")
	// ErrCreditOverrun: the peer sent beyond the receive credits granted
	// to it, which an engine never does; its excess was dropped.
	ErrCreditOverrun = errors.New("engine: peer sent beyond its receive credits")
	// ErrLost: the peer closed (its FIN came) while messages it sent
	// before were missing here; the vconn fails rather than end as if
	// they were all read.
	ErrLost = errors.New("engine: messages the peer sent before its close were lost")
)

// Engine multiplexes vconns over shared QPs on one device.
type Engine struct {
	cfg Config
	log logr.Logger
	dev verbs.Device
	pd  verbs.PD
	gid verbs.GID
	// ll is the port's link layer and lid its LID on InfiniBand, where
	// paths are LID-routed (verbs.AddressVector).
	ll   verbs.LinkLayer
	lid  uint16
	pool *bufPool

	// pathPolicy is when Auto's paths switch (reliable.Path); zero, the
	// default. Tests set it before the engine's first vconn.
	pathPolicy reliable.PathPolicy

	// recvClass and dgramClass are the pool classes of the two SRQs'
	// buffers: srq serves the RC QPs, dsrq the UD and UC QPs.
	recvClass  int
	dgramClass int
	srq        verbs.SRQ
	dsrq       verbs.SRQ
	pollers    []*poller
	vconns     *vqpn.Table[VConn]

	peersMu sync.Mutex
	peers   map[verbs.GID]*Peer // guarded by peersMu
	retired []*Peer             // failed peers replaced by fresh ones; guarded by peersMu
	// epochs counts the Peers made for each GID (Peer.Epoch), kept when
	// a peer is forgotten so that the count only grows; guarded by peersMu.
	epochs map[verbs.GID]uint64
	// ingress maps the QPN of each QP a peer created toward us to that
	// peer: a message may only name vconns of the peer it came from.
	ingress sync.Map
	// redials counts the goroutines connecting replacement QPs
	// (repair.go); Close waits for them once the pollers, which start
	// them, stopped.
	redials sync.WaitGroup

	// windowBudget is the credit window growth vconns may still take,
	// of the SRQ's receive buffers (0) and of the datagram SRQ's (1).
	windowBudget [2]credit.Budget

	// held counts, per SRQ (0: the RC QPs', 1: the datagram one's), the
	// receive buffers that messages queued for the application keep
	// until released; past half an SRQ, queued messages are copied out
	// of their buffers instead (recv.go, pin). Padded off the fields
	// around it: the pollers and the readers' releases write it.
	_    [64]byte
	held [2]atomic.Int64
	_    [64]byte
	// bundleHeld[i] says the datagram buffer of index i, a bundle's
	// (shared by its messages), counts in held[1]: a bundle's buffer
	// counts once, whichever of its messages was queued first, until
	// the last of them is released.
	bundleHeld []atomic.Bool

	// epoch is when the engine started: times kept in atomics are
	// durations since it, on the monotonic clock.
	epoch time.Time

	// windows says the device has type 2 memory windows: exports go
	// through one bound to the QP their peer vconn's requests arrive on
	// (region.go bindWindow); winMu guards the binds awaiting completion.
	windows bool
	winMu   sync.Mutex
	winSeq  uint32
	winWait map[uint64]*windowBind

	// graceMu guards grace: regions of ended vconns (and staging memory
	// an abandoned operation may still reach), deregistered when their
	// timer fires (region.go releaseLater) or the engine closes.
	graceMu sync.Mutex
	grace   map[graced]*time.Timer
	// graceWG counts the deregistrations timers run, outside graceMu:
	// Close waits for them before it deallocates the PD.
	graceWG sync.WaitGroup
	// poolMu is held, shared, by an application's goroutine while it
	// writes into a send buffer it took (poolUse): Close takes it before
	// it frees the pool's memory, which a sender that took its buffer
	// just before the close would otherwise write into unmapped.
	poolMu sync.RWMutex
	// lending is the staging memory sends may still read (StageSends),
	// until deregistered; what is left when the engine closes, with
	// sends whose completions no poller will see, goes then. Guarded by
	// graceMu.
	lending map[*Staging]struct{}

	// registered is the bytes of exported regions' memory, and of
	// vconns' staging memory, registered now, from before the
	// registration until the deregistration succeeded: exported,
	// withdrawn and awaiting the peer's confirmation, or in their grace.
	registered atomic.Int64

	closed    atomic.Bool
	stats     counters
	busyFloor busyFloor // see PollerStats
}

// New opens an engine on cfg.Device: PD, buffer pool, SRQs (filled) and
// pollers.
func New(cfg Config) (_ *Engine, err error) {
	cfg, err = cfg.withDefaults()
	if err != nil {
		return nil, err
	}
	e := &Engine{
		cfg:    cfg,
		log:    cfg.Log,
		dev:    cfg.Device,
		vconns: vqpn.New[VConn](cfg.MaxVConns),
		peers:  make(map[verbs.GID]*Peer),
		epoch:  time.Now(),
	}
	e.windowBudget[0].Init(int64(cfg.RecvBuffers / 2))
	e.windowBudget[1].Init(int64(cfg.DgramBuffers / 2))
	e.bundleHeld = make([]atomic.Bool, cfg.DgramBuffers)
	defer func() {
		if err != nil {
			err = errors.Join(err, e.release())
		}
	}()
	for _, step := range []func() error{e.openPD, e.openPool, e.openPollers, e.fillSRQs} {
		if err := step(); err != nil {
			return nil, err
		}
	}
	for _, p := range e.pollers {
		p.loop.started = true
		go p.run()
	}
	e.log.V(1).Info("Engine started", "device", e.dev.Attr().Name, "gid", e.gid, "pollers", cfg.Pollers, "qpsPerPeer", cfg.QPsPerPeer, "recvBuffers", cfg.RecvBuffers)
	return e, nil
}

// openPD reads the device's address and allocates the PD.
func (e *Engine) openPD() (err error) {
	if e.gid, err = e.dev.GID(0); err != nil {
		return fmt.Errorf("engine: %w", err)
	}
	attr := e.dev.Attr()
	if e.ll = attr.LinkLayer; e.ll == verbs.LinkLayerInfiniBand {
		if attr.LID == 0 || attr.LID > verbs.MaxUnicastLID {
			return fmt.Errorf("engine: %s: %w: InfiniBand port without a unicast LID (%#x): is a subnet manager running?", attr.Name, verbs.ErrInvalid, attr.LID)
		}
		e.lid = attr.LID
		e.log.Info("The port is InfiniBand: paths are LID-routed within the subnet (untested on InfiniBand hardware)", "lid", e.lid)
	}
	if e.pd, err = e.dev.AllocPD(); err != nil {
		return fmt.Errorf("engine: %w", err)
	}
	if e.windows = e.dev.Attr().MaxMW > 0; !e.windows {
		e.log.Info("The device has no type 2 memory windows: an exported region is reachable with its key on any QP of the device")
	}
	return nil
}

// openPool registers the buffer pool and creates the two SRQs its
// receive classes fill.
func (e *Engine) openPool() (err error) {
	cfg := &e.cfg
	// Send classes for small messages, control messages and whole chunks,
	// then the receive buffers, all chunk-sized.
	specs := []classSpec{
		{size: 256, n: 4 * cfg.SendBuffers}, // most messages are small
		{size: midBuffer, n: cfg.SendBuffers / 2},
		{size: cfg.ChunkSize, n: cfg.SendBuffers / 4},
		{size: cfg.ChunkSize, n: cfg.RecvBuffers},
		{size: cfg.ChunkSize, n: cfg.DgramBuffers},
	}
	e.recvClass, e.dgramClass = len(specs)-2, len(specs)-1
	if e.pool, err = newBufPool(e.pd, specs); err != nil {
		return err
	}
	if e.srq, err = e.pd.CreateSRQ(&verbs.SRQInitAttr{MaxWR: uint32(cfg.RecvBuffers), MaxSGE: 1}); err != nil {
		return fmt.Errorf("engine: create SRQ: %w", err)
	}
	if e.dsrq, err = e.pd.CreateSRQ(&verbs.SRQInitAttr{MaxWR: uint32(cfg.DgramBuffers), MaxSGE: 1}); err != nil {
		return fmt.Errorf("engine: create datagram SRQ: %w", err)
	}
	return nil
}

// openPollers creates the pollers, each with its CQ and UD QP; they start
// once the SRQs are full.
func (e *Engine) openPollers() error {
	for i := 0; i < e.cfg.Pollers; i++ {
		p, err := newPoller(e, i)
		if err != nil {
			return err
		}
		e.pollers = append(e.pollers, p)
		if err := p.openUD(); err != nil {
			return err
		}
	}
	return nil
}

// fillSRQs posts every receive buffer to its SRQ.
func (e *Engine) fillSRQs() error {
	for _, c := range e.srqs() {
		var wrs []verbs.RecvWR
		for {
			slot, ok := e.pool.get(c.class)
			if !ok {
				break
			}
			wrs = append(wrs, e.recvWR(slot))
		}
		if _, err := c.srq.PostRecv(wrs); err != nil {
			return fmt.Errorf("engine: fill SRQ: %w", err)
		}
	}
	return nil
}

// srqClass is an SRQ and the pool class of its buffers.
type srqClass struct {
	class int
	srq   verbs.SRQ
}

// srqs are the engine's SRQs: the RC QPs', then the datagram one.
func (e *Engine) srqs() [2]srqClass {
	return [2]srqClass{{e.recvClass, e.srq}, {e.dgramClass, e.dsrq}}
}

func (e *Engine) recvWR(slot bufSlot) verbs.RecvWR {
	return verbs.RecvWR{WRID: format.RecvWRID(uint32(slot)), NumSGE: 1, SG: [verbs.MaxSGE]verbs.SGE{e.pool.sge(slot, uint32(e.cfg.ChunkSize))}}
}

// recvSlot is the buffer of a receive's completion (its wr_id, recvWR).
func recvSlot(wrid uint64) bufSlot { return bufSlot(format.RecvSlot(wrid)) }

// UDQPNs lists the engine's UD QPs, one per poller, for peers.
func (e *Engine) UDQPNs() []uint32 {
	q := make([]uint32, len(e.pollers))
	for i, p := range e.pollers {
		q[i] = p.udq.qp.qp.QPN()
	}
	return q
}

// GID is the engine's device address, which peers connect to.
func (e *Engine) GID() verbs.GID { return e.gid }

// Config returns the engine's configuration, defaults filled in.
func (e *Engine) Config() Config { return e.cfg }

// poller owns one CQ and the QPs that complete on it. Its loop posts what
// vconns queued (one PostSend per QP per round: many WRs per doorbell),
// reposts released receive buffers to the SRQ, and polls and dispatches
// completions. When a round finds nothing to do SpinPolls times in a row it
// arms the CQ and parks on its wake channel, which a completion event or
// a kick fills (see sleep).
//
// Its state is split by flow, each group saying who may touch it (as
// wireguard-go's Peer does), and declared here, beside the engine that
// owns the pollers, with the calls any goroutine or file makes on a
// poller: kick, enqueue and repostRecv (what other goroutines hand it),
// its clock, senders' back pressure (throttle) and its UD QP. The code is
// split by the same flows: the loop, its sleep and its rounds (poller.go,
// loop); which vconns each QP serves next, the doorbells, and the
// completions' dispatch, receives demultiplexed (cq.go, sched and rx);
// serving a vconn, from its ring to the work requests, and giving send
// buffers back (serve.go, tx); a message's delivery and reassembly
// (recv.go); a failed QP (qp.go); Auto's timers (auto.go, rel). Only the
// poller's goroutine runs its methods, but for kick, enqueue and
// repostRecv, which any goroutine may call.
type poller struct {
	e   *Engine
	idx int
	cq  verbs.CQ

	loop  pollerLoop  // its loop: spinning, sleeping, stopping
	inbox pollerInbox // what other goroutines hand it
	sched pollerSched // which vconns it serves when (cq.go, serve.go)
	tx    pollerTx    // the work requests it posts (serve.go)
	rx    pollerRx    // the completions it handles (cq.go, recv.go)
	udq   pollerUD    // its UD QP, shared by every peer
	rel   pollerRel   // Auto's timers (auto.go)

	// sendQPs maps QPNs of send QPs on this CQ to their state, for
	// completions; written when a QP is created.
	sendQPs sync.Map // uint32 → *sendQP

	st pollerCounters // written by the poller, read by Stats (stats.go)
}

// pollerLoop is the poller's loop state. sleeping and stopping are read
// by any goroutine (kick, throttle); done closes when the loop ends; the
// rest is the poller goroutine's.
type pollerLoop struct {
	// wake holds a wake-up for the sleeping poller: a kick's, or the
	// CQ's completion event (verbs.Notifier, or relayed from its FD).
	wake     chan struct{}
	sleeping atomic.Bool
	stopping atomic.Bool
	done     chan struct{}
	started  bool
	now      time.Time   // the coarse clock (see clock)
	busy     bool        // in a run of busy rounds (stats.go)
	timer    *time.Timer // a sleep's bound, when it has one
	relay    *os.File    // a dup of the CQ's FD, for a CQ that is no Notifier
	// deaf: the relay stopped on a failing completion channel; sleeps
	// are bounded (a millisecond) so that completions are still polled.
	deaf atomic.Bool
}

// pollerInbox is what vconns and readers hand the poller: any goroutine,
// under mu.
type pollerInbox struct {
	mu     sync.Mutex
	runq   []*VConn  // vconns with work
	repost []bufSlot // receive buffers to give back to the SRQ
	// queued is set, under mu, when runq or repost gains an entry, so a
	// round with nothing queued takes no lock.
	queued atomic.Bool
}

// pollerSched is which vconns the poller serves when (cq.go). Poller
// goroutine only.
type pollerSched struct {
	work   []*VConn  // taken from the inbox this round
	later  []*VConn  // found no room: next round, behind their QPs' queues
	active []*sendQP // QPs whose run queues hold vconns
	popped int32     // messages serve took from rings, for the QP's backlog
	// repairs are the failed QPs being replaced (repair.go): their vconns
	// wait until the new QP is connected and the old one drained.
	repairs []*sendQP
}

// pollerTx is what the poller posts (serve.go). Poller goroutine
// only.
type pollerTx struct {
	dirty   []*sendQP // QPs with a batch to post
	budget  int       // sends this CQ may still have outstanding
	confirm []uint32  // unexport confirmations being posted (confirmUnexports)
}

// pollerRx is what the poller's completions use (cq.go, recv.go).
// Poller goroutine only.
type pollerRx struct {
	wcs     []verbs.WC
	vcs     []*VConn // the vconns of wcs' receives
	reposts []bufSlot
	recvWRs []verbs.RecvWR
	sink    uint32 // what touch read, so the reads are not optimised away
}

// pollerUD is the poller's UD QP, shared by every peer. Poller goroutine
// only.
type pollerUD struct {
	qp   *sendQP
	qpn  uint32    // qp's QPN, read on every receive (see isUD)
	dead []*sendQP // failed UD QPs awaiting their last completions
}

// pollerRel is what a poller keeps for the Auto vconns whose send sides
// it owns: their retransmission and delayed-acknowledgement timers.
// Owned by the poller goroutine, but for soon.
type pollerRel struct {
	rtx   []*VConn    // Auto vconns with datagrams awaiting ACKs
	rtxAt time.Time   // next retransmission scan
	acks  []ackWaiter // Auto vconns with delayed acknowledgements
	ackAt time.Time   // when they go out
	soon  atomic.Bool // any poller: a peer reported a gap, retransmit now (see onGap)
}

// ackWaiter is a vconn whose acknowledgement is delayed, and the last one
// sent when it began to wait.
type ackWaiter struct {
	vc   *VConn
	sent uint32
}

// kick wakes the poller if it sleeps. Any goroutine.
func (p *poller) kick() {
	if p.loop.sleeping.Load() {
		select {
		case p.loop.wake <- struct{}{}:
		default: // a wake-up is pending already
		}
	}
}

// enqueue puts a vconn on the run queue and wakes the poller if it sleeps.
// Any goroutine (through VConn.schedule): it takes inbox.mu.
func (p *poller) enqueue(vc *VConn) {
	p.inbox.mu.Lock()
	p.inbox.runq = append(p.inbox.runq, vc)
	p.inbox.queued.Store(true)
	p.inbox.mu.Unlock()
	p.kick()
}

// repostRecv queues a receive buffer for the SRQ. Any goroutine (a
// reader's Release): it takes inbox.mu.
func (p *poller) repostRecv(slot bufSlot) {
	p.inbox.mu.Lock()
	p.inbox.repost = append(p.inbox.repost, slot)
	n := len(p.inbox.repost)
	p.inbox.queued.Store(true)
	p.inbox.mu.Unlock()
	if n == 1 || n >= 32 {
		p.kick()
	}
}

// clockRounds is how many empty rounds the coarse clock lasts (see clock):
// a few µs.
const clockRounds = 8

// clock is the poller's coarse time, read again after a round that did
// work, every clockRounds rounds that did not, and after a sleep: datagram
// timestamps and the acknowledgement delay need a resolution well under
// reliable.LossyMinRTO, not a clock read (46 ns here) in each of the millions of
// empty rounds a second a spinning poller makes. Only intervals matter,
// so it reads the monotonic clock alone, as time.Since does (25 ns here,
// where time.Now also reads the wall clock); its wall reading is the
// epoch's advanced by as much.
func (p *poller) clock() time.Time {
	if p.loop.now.IsZero() {
		p.loop.now = p.e.epoch.Add(time.Since(p.e.epoch))
	}
	return p.loop.now
}

// throttle blocks a sender while its QP's backlog is full; it returns
// ctx's error if ctx ends first. Messages queued beyond what the QP takes
// soon only wait, and go cold in the cache meanwhile: with thousands of
// vconns each holding a message or a few, a backlog bounded only by the
// buffer pool (16,384 small buffers) made every message a handful of
// cache misses. Bounding it keeps what the poller serves warm (as byte
// queue limits bound a NIC's queue), and costs senders nothing while it
// is not full. The sender's goroutine, before it takes sendMu.
func (q *sendQP) throttle(ctx context.Context) error {
	p := q.p
	for q.backlog.Load() >= q.maxBacklog && !p.loop.stopping.Load() {
		p.inbox.mu.Lock()
		q.throttled.Store(true)
		if q.backlog.Load() < q.maxBacklog || p.loop.stopping.Load() {
			p.inbox.mu.Unlock()
			return nil
		}
		if q.unthrottled == nil {
			q.unthrottled = make(chan struct{})
		}
		ch := q.unthrottled
		p.inbox.mu.Unlock()
		p.kick()
		select {
		case <-ch:
		case <-p.loop.done:
			return nil
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	return nil
}

// dequeued takes n messages the poller took from the rings of q's vconns
// off q's backlog, and wakes throttled senders once it is down to half.
// q's poller only.
func (q *sendQP) dequeued(n int32) {
	if n == 0 {
		return
	}
	if b := q.backlog.Add(-n); b <= q.maxBacklog/2 && q.throttled.Load() {
		p := q.p
		p.inbox.mu.Lock()
		q.throttled.Store(false)
		if q.unthrottled != nil {
			close(q.unthrottled)
			q.unthrottled = nil
		}
		p.inbox.mu.Unlock()
	}
}

// openUD creates the poller's UD QP on the datagram SRQ.
func (p *poller) openUD() error {
	e := p.e
	qp, err := e.pd.CreateQP(&verbs.QPInitAttr{
		Type: verbs.QPTypeUD, SendCQ: p.cq, RecvCQ: p.cq, SRQ: e.dsrq,
		Cap: verbs.QPCap{MaxSendWR: uint32(e.cfg.SQDepth), MaxSendSGE: 2, MaxRecvSGE: 1}, // a header and its payload in place (lend.go)
	})
	if err != nil {
		return fmt.Errorf("engine: poller %d UD QP: %w", p.idx, err)
	}
	if err := verbs.ActivateUD(qp, e.cfg.QKey, 0); err != nil {
		_ = qp.Close()
		return fmt.Errorf("engine: poller %d: %w", p.idx, err)
	}
	p.udq.qp = &sendQP{qp: qp, p: p}
	p.udq.qpn = qp.QPN()
	p.sendQPs.Store(qp.QPN(), p.udq.qp)
	return nil
}
