package engine

import (
	"errors"
	"fmt"
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
		{size: 2048, n: cfg.SendBuffers / 2},
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

// Close fails every vconn, destroys the QPs and releases the device
// resources. The device itself stays open: it is the caller's.
func (e *Engine) Close() error {
	if e.closed.Swap(true) {
		return nil
	}
	e.peersMu.Lock()
	peers := make([]*Peer, 0, len(e.peers))
	for _, p := range e.peers {
		peers = append(peers, p)
	}
	e.peersMu.Unlock()
	for _, p := range peers {
		p.fail(ErrEngineClosed)
		// Exported regions are deregistered with the PD: no peer can
		// reach them once the QPs are gone.
		p.mu.Lock()
		for vc := p.list; vc != nil; vc = vc.next {
			vc.releaseRegions()
		}
		p.mu.Unlock()
	}
	for _, p := range e.pollers {
		p.stop()
	}
	e.releaseGraced()
	var errs []error
	e.peersMu.Lock()
	peers = append(peers, e.retired...)
	e.retired = nil
	e.peersMu.Unlock()
	for _, p := range peers {
		errs = append(errs, p.destroy())
	}
	errs = append(errs, e.release())
	return errors.Join(errs...)
}

// release frees what New allocated, in reverse order.
func (e *Engine) release() error {
	var errs []error
	for _, p := range e.pollers {
		errs = append(errs, p.close())
	}
	for _, s := range []verbs.SRQ{e.srq, e.dsrq} {
		if s != nil {
			errs = append(errs, s.Close())
		}
	}
	if e.pool != nil {
		errs = append(errs, e.pool.close())
	}
	if e.pd != nil {
		errs = append(errs, e.pd.Close())
	}
	return errors.Join(errs...)
}

// Stats is a snapshot of the engine's counters.
type Stats struct {
	VConns       int // open now
	Peers        int
	QPs          int    // RC QPs this engine created, to all peers
	UCQPs        int    // UC QPs this engine created, to all peers
	IngressQPs   int    // RC QPs peers created toward this engine
	MsgsSent     uint64 // messages handed to the device (once each: not their retransmissions)
	MsgsReceived uint64 // messages delivered to vconns
	Posts        uint64 // PostSend calls (doorbells)
	WRsPosted    uint64 // send WRs posted; WRsPosted/Posts is the batch size
	StaleDropped uint64 // completions for closed vconns, dropped
	Malformed    uint64 // messages with a bad header, dropped
	CreditStalls uint64 // times a vconn waited for credits
	Sleeps       uint64 // times a poller blocked on its completion channel
	Retransmits  uint64 // Auto datagrams sent again for want of an ACK
	GapResends   uint64 // of those, sent at once on the peer's gap report
	Bundled      uint64 // messages sent in bundles (bundle.go)
	Gathered     uint64 // of those, sent from their own buffers, not copied
	AutoToRC     uint64 // peer paths whose Auto small messages moved to RC under loss (reliable.Path)
	AutoToUC     uint64 // and back
	BuffersInUse []int  // per pool class
	// RecvBuffersHeld and DgramBuffersHeld are the receive buffers of
	// the RC QPs' SRQ and of the datagram SRQ that received messages
	// hold, queued for the application or read and not yet released.
	// Each stays at or under half its SRQ (plus one per poller, for a
	// moment): past that, a message is copied out of its buffer, which
	// goes back to the SRQ at once (RecvCopied).
	RecvBuffersHeld  int
	DgramBuffersHeld int
	RecvCopied       uint64 // messages copied out of their receive buffers so (see above)
	// RegisteredBytes is the memory of exported regions (and of vconns'
	// staging memory, VConn.Stage) registered now, whatever holds it:
	// exported, withdrawn and awaiting the peer's confirmation, or kept
	// for the grace after its vconn ended. The engine's buffer pool is
	// not counted (it is fixed).
	RegisteredBytes int64
}

type counters struct {
	msgsSent, msgsReceived, posts, wrsPosted, malformed, creditStalls, sleeps, retransmits, gapResends, toRC, toUC, bundled, gathered, recvCopied atomic.Uint64
}

// Stats returns the engine's counters.
func (e *Engine) Stats() Stats {
	s := Stats{
		VConns:       e.vconns.Len(),
		MsgsSent:     e.stats.msgsSent.Load(),
		MsgsReceived: e.stats.msgsReceived.Load(),
		Posts:        e.stats.posts.Load(),
		WRsPosted:    e.stats.wrsPosted.Load(),
		StaleDropped: e.vconns.Stale(),
		Malformed:    e.stats.malformed.Load(),
		CreditStalls: e.stats.creditStalls.Load(),
		Sleeps:       e.stats.sleeps.Load(),
		Retransmits:  e.stats.retransmits.Load(),
		GapResends:   e.stats.gapResends.Load(),
		AutoToRC:     e.stats.toRC.Load(),
		AutoToUC:     e.stats.toUC.Load(),
		Bundled:      e.stats.bundled.Load(),
		Gathered:     e.stats.gathered.Load(),
		BuffersInUse: e.pool.inUse(),

		RecvBuffersHeld:  int(e.held[0].Load()),
		DgramBuffersHeld: int(e.held[1].Load()),
		RecvCopied:       e.stats.recvCopied.Load(),
		RegisteredBytes:  e.registered.Load(),
	}
	e.peersMu.Lock()
	s.Peers = len(e.peers)
	for _, p := range e.peers {
		p.mu.Lock()
		rc, uc := p.countQPs()
		s.QPs += rc
		s.UCQPs += uc
		s.IngressQPs += len(p.ingress)
		p.mu.Unlock()
	}
	e.peersMu.Unlock()
	return s
}
