package engine

import (
	"context"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"sync"
	"time"

	"github.com/rdmavisor/rdmavisor/internal/engine/format"
	"github.com/rdmavisor/rdmavisor/internal/verbs"
	"github.com/rdmavisor/rdmavisor/internal/vqpn"
)

// Access says what a peer may do to an exported region.
type Access uint8

const (
	AccessRead  Access = format.AccessRead
	AccessWrite Access = format.AccessWrite
)

var (
	// ErrNoRegion is a one-sided operation on a region the peer has not
	// exported to this vconn (or no longer does).
	ErrNoRegion = errors.New("engine: region not exported to this vconn")
	// ErrRegionAccess is an operation outside the region or not allowed
	// by its access.
	ErrRegionAccess = errors.New("engine: region access denied")
	// ErrRegisteredLimit is an export past Config.MaxRegisteredBytes.
	ErrRegisteredLimit = errors.New("engine: registered memory limit reached")
)

// Region is memory a vconn exports to its peer vconn, and only to it: the
// peer engine learns the region's address and key over this vconn and lets
// only this vconn's peer use them. Bytes is registered memory: the peer's
// writes land in it and its reads come from it, without this side's CPU.
type Region struct {
	vc     *VConn
	id     uint32
	mr     verbs.MR
	mw     verbs.MW // the window the peer reaches mr through; nil without windows
	peer   *Peer    // the peer mw's QP belongs to
	access Access
	once   sync.Once
	// released, if set, is called once the memory is deregistered
	// (Export).
	released func()

	// mu is held shared while ReadAt or WriteAt touch the memory and
	// exclusively to deregister it, so no copy ever reaches unmapped
	// memory (a fault there would take the agent, and every tenant, down).
	mu   sync.RWMutex
	gone bool // guarded by mu: deregistered
}

// remoteRegion is a region the peer exported to this vconn: what its
// export message carried.
type remoteRegion = format.Ad

// regions is a vconn's one-sided state, allocated on first use so vconns
// that never export or read cost nothing.
type regions struct {
	mu      sync.Mutex
	next    uint32                  // last export id; guarded by mu
	exports map[uint32]*Region      // exported by this side; guarded by mu
	remote  map[uint32]remoteRegion // exported to this side; guarded by mu
	// marks counts the one-sided operations' markers pushed into the
	// vconn's ring, posted those the poller posted; guarded by mu. An
	// unexport is confirmed once every marker pushed before it arrived
	// is posted, whatever data still waits in the ring.
	marks, posted uint64
	unexportAcks  []unexportAck // confirmations to send; guarded by mu
	op            rdmaOp
}

// unexportAck is the confirmation of region id's unexport, due once the
// poller posted after markers.
type unexportAck struct {
	id    uint32
	after uint64
}

// rg returns the vconn's one-sided state, creating it.
func (vc *VConn) rg() *regions {
	if r := vc.regions.Load(); r != nil {
		return r
	}
	vc.regions.CompareAndSwap(nil, &regions{})
	return vc.regions.Load()
}

// Export registers size bytes and exports them to the peer vconn with the
// given access. The export reaches the peer before any message sent after
// Export returns.
//
// released, if not nil, is called exactly once for each call, once
// nothing of it is registered any more: when the region's memory is
// deregistered (after Close, the peer's confirmation or the vconn's end
// and its grace), or before Export returns an error. A caller that counts
// the memory against a limit gives it back there, never earlier. It may
// run on a poller: it must not block.
func (vc *VConn) Export(ctx context.Context, size int, access Access, released func()) (*Region, error) {
	return vc.export(ctx, size, nil, access, released)
}

// ExportMem exports mem, memory the caller mapped outside the Go heap (the
// agent's mapping of a memfd it shares with a pod), as Export exports
// memory of its own: the region registers mem (verbs.PD.RegMRMem) and
// never unmaps it. The caller keeps mem mapped until released runs, which
// is after the deregistration, and may unmap it there.
func (vc *VConn) ExportMem(ctx context.Context, mem []byte, access Access, released func()) (*Region, error) {
	return vc.export(ctx, len(mem), mem, access, released)
}

// export registers mem, or size bytes of the engine's if mem is nil, and
// exports them.
func (vc *VConn) export(ctx context.Context, size int, mem []byte, access Access, released func()) (*Region, error) {
	e := vc.e
	fail := func(err error) (*Region, error) {
		if released != nil {
			released()
		}
		return nil, err
	}
	if size <= 0 || access&^(AccessRead|AccessWrite) != 0 || access == 0 {
		return fail(fmt.Errorf("engine: export %d bytes with access %#x: %w", size, access, verbs.ErrInvalid))
	}
	if vc.state.Load() != stateOpen {
		return fail(fmt.Errorf("engine: export on vconn %v: %w", vc.id, vc.stateErr()))
	}
	if err := e.reserve(int64(size)); err != nil {
		return fail(fmt.Errorf("engine: export of %d bytes on vconn %v: %w", size, vc.id, err))
	}
	va := verbs.AccessLocalWrite
	if e.windows {
		// The MR grants nothing remotely: its key is no use to anyone.
		va |= verbs.AccessMWBind
	} else {
		va |= remoteAccess(access)
	}
	var mr verbs.MR
	var err error
	if mem == nil {
		mr, err = e.pd.RegMR(size, va)
	} else {
		mr, err = e.pd.RegMRMem(mem, va)
	}
	if err != nil {
		e.registered.Add(-int64(size))
		return fail(fmt.Errorf("engine: export on vconn %v: %w", vc.id, err))
	}
	r := &Region{vc: vc, mr: mr, peer: vc.peer, access: access, released: released}
	addr, rkey := mr.Addr(), mr.RKey()
	if e.windows {
		if r.mw, rkey, err = vc.bindWindow(ctx, mr, access); err != nil {
			return nil, errors.Join(err, r.release())
		}
		addr = 0 // zero-based: the peer learns nothing of our address space
	}
	rg := vc.rg()
	rg.mu.Lock()
	rg.next++
	r.id = rg.next
	if rg.exports == nil {
		rg.exports = make(map[uint32]*Region)
	}
	rg.exports[r.id] = r
	rg.mu.Unlock()

	var ad [format.AdLen]byte
	(&format.Ad{Addr: addr, RKey: rkey, Length: uint64(size), Access: uint8(access)}).Put(ad[:])
	if err := vc.sendControl(ctx, format.Export, r.id, ad[:]); err != nil {
		rg.mu.Lock()
		delete(rg.exports, r.id)
		rg.mu.Unlock()
		return nil, errors.Join(err, r.release())
	}
	return r, nil
}

// remoteAccess is the verbs access that grants a peer a.
func remoteAccess(a Access) verbs.Access {
	var va verbs.Access
	if a&AccessRead != 0 {
		va |= verbs.AccessRemoteRead
	}
	if a&AccessWrite != 0 {
		va |= verbs.AccessRemoteWrite
	}
	return va
}

// windowBind is a bind awaiting its completion.
type windowBind struct {
	done chan error
	mw   verbs.MW // closed on completion if the binder gave up waiting
	gone bool     // guarded by Engine.winMu: the binder gave up
}

// bindWindow allocates a type 2 memory window on mr, zero-based, with a
// fresh random key, and binds it on the RC QP that the peer vconn's
// requests arrive on: the NIC then refuses the window's key on any other
// QP, so of all the peer's vconns, and all other nodes, only the one
// sharing that QP could use it, and only if the engine there let it (the
// export reaches only this vconn's peer). It waits for the bind to
// complete, so the peer never uses the key before it is valid.
func (vc *VConn) bindWindow(ctx context.Context, mr verbs.MR, access Access) (verbs.MW, uint32, error) {
	e := vc.e
	n := len(mr.Bytes())
	if uint64(n) > math.MaxUint32 {
		return nil, 0, fmt.Errorf("engine: export of %d bytes on vconn %v: a window covers at most 4 GiB: %w", n, vc.id, verbs.ErrInvalid)
	}
	qp := vc.peer.ingressQP(verbs.QPTypeRC, vqpn.ID(vc.remote.Load()))
	if qp == nil {
		return nil, 0, fmt.Errorf("engine: export on vconn %v: the peer has no QP toward us for it: %w", vc.id, ErrNotOpen)
	}
	mw, err := e.pd.AllocMW()
	if err != nil {
		return nil, 0, fmt.Errorf("engine: export on vconn %v: %w", vc.id, err)
	}
	key := byte(rand.Uint32())
	if key == byte(mw.RKey()) {
		key++ // a bind must change the key
	}
	rkey := mw.RKey()&^0xff | uint32(key)
	w := &windowBind{done: make(chan error, 1), mw: mw}
	e.winMu.Lock()
	e.winSeq++
	if e.winSeq == 0 {
		e.winSeq = 1
	}
	wrid := uint64(e.winSeq) // vconn ID 0: no vconn's (poller.onSend)
	if e.winWait == nil {
		e.winWait = make(map[uint64]*windowBind)
	}
	e.winWait[wrid] = w
	e.winMu.Unlock()
	wr := verbs.SendWR{
		WRID: wrid, Opcode: verbs.WRBindMW, Flags: verbs.SendSignaled,
		MW: mw.Handle(), RKey: rkey, MWAccess: verbs.AccessZeroBased | remoteAccess(access),
		NumSGE: 1, SG: [verbs.MaxSGE]verbs.SGE{{Addr: mr.Addr(), Length: uint32(n), LKey: mr.LKey()}},
	}
	if _, err := qp.PostSend([]verbs.SendWR{wr}); err != nil {
		e.winMu.Lock()
		delete(e.winWait, wrid)
		e.winMu.Unlock()
		return nil, 0, errors.Join(fmt.Errorf("engine: export on vconn %v: bind: %w", vc.id, err), mw.Close())
	}
	select {
	case err := <-w.done:
		if err != nil {
			return nil, 0, errors.Join(fmt.Errorf("engine: export on vconn %v: bind: %w", vc.id, err), mw.Close())
		}
		return mw, rkey, nil
	case <-ctx.Done():
		e.winMu.Lock()
		_, waiting := e.winWait[wrid]
		w.gone = waiting
		e.winMu.Unlock()
		if !waiting { // completed meanwhile
			if err := <-w.done; err == nil {
				return mw, rkey, nil
			}
			_ = mw.Close()
		}
		return nil, 0, fmt.Errorf("engine: export on vconn %v: bind: %w", vc.id, ctx.Err())
	}
}

// windowDone hands a bind's completion to its waiter, or closes the
// window of one whose waiter gave up.
func (e *Engine) windowDone(wc *verbs.WC) {
	e.winMu.Lock()
	w := e.winWait[wc.WRID]
	delete(e.winWait, wc.WRID)
	gone := w != nil && w.gone
	e.winMu.Unlock()
	switch {
	case w == nil:
	case gone:
		_ = w.mw.Close()
	default:
		w.done <- wc.Err()
	}
}

// ID names the region to the peer.
func (r *Region) ID() uint32 { return r.id }

// Bytes is the region's memory, valid until the region is closed or its
// vconn ends: only for a caller that controls both. Others use ReadAt and
// WriteAt, which the region's end cannot race.
func (r *Region) Bytes() []byte { return r.mr.Bytes() }

// Len is the region's size.
func (r *Region) Len() int { return len(r.mr.Bytes()) }

// ReadAt copies len(p) bytes at off out of the region. After the region
// is deregistered it fails with ErrNoRegion; a range outside the region
// fails with ErrRegionAccess.
func (r *Region) ReadAt(p []byte, off int64) (int, error) {
	return r.copyAt(p, off, false)
}

// WriteAt copies p into the region at off, as ReadAt.
func (r *Region) WriteAt(p []byte, off int64) (int, error) {
	return r.copyAt(p, off, true)
}

func (r *Region) copyAt(p []byte, off int64, write bool) (int, error) {
	r.mu.RLock()
	defer r.mu.RUnlock()
	if r.gone {
		return 0, fmt.Errorf("engine: region %d: %w", r.id, ErrNoRegion)
	}
	b := r.mr.Bytes()
	if off < 0 || off > int64(len(b)) || int64(len(p)) > int64(len(b))-off {
		return 0, fmt.Errorf("engine: %d bytes at %d outside region %d of %d: %w", len(p), off, r.id, len(b), ErrRegionAccess)
	}
	if write {
		return copy(b[off:], p), nil
	}
	return copy(p, b[off:]), nil
}

// reserve counts n bytes about to be registered for a region, refusing
// them past MaxRegisteredBytes.
func (e *Engine) reserve(n int64) error {
	lim := e.cfg.MaxRegisteredBytes
	for {
		held := e.registered.Load()
		if lim > 0 && n > lim-held {
			return fmt.Errorf("%d of the engine's %d bytes of regions are registered: %w", held, lim, ErrRegisteredLimit)
		}
		if e.registered.CompareAndSwap(held, held+n) {
			return nil
		}
	}
}

// release deregisters the memory once no ReadAt or WriteAt is inside it,
// after closing its window, which invalidates the peer's key; then, and
// only then, the memory stops counting (Engine.registered, and the
// caller's released).
func (r *Region) release() error {
	r.mu.Lock()
	if r.gone {
		r.mu.Unlock()
		return nil
	}
	r.gone = true
	var err error
	if r.mw != nil {
		err = r.mw.Close()
	}
	n := len(r.mr.Bytes())
	if cerr := r.mr.Close(); cerr != nil {
		r.mu.Unlock()
		// Still registered: it stays counted, against the limits too.
		err = errors.Join(err, cerr)
		r.vc.e.log.Error(err, "Deregistering a region failed: its memory stays registered", "vconn", r.vc.id, "region", r.id, "bytes", n)
		return err
	}
	r.mu.Unlock()
	r.vc.e.registered.Add(-int64(n))
	if r.released != nil {
		r.released()
	}
	return err
}

// Close withdraws the export. The memory is deregistered once the peer has
// confirmed it stopped using the region (or the vconn ended and its grace
// passed), so an operation already in flight never hits a dead key; it
// counts as registered until then (Stats.RegisteredBytes, the export's
// released).
func (r *Region) Close() error {
	var err error
	r.once.Do(func() {
		vc := r.vc
		// A closing vconn still reaches its peer (until its FIN is
		// answered, or CloseTimeout): withdrawing there too lets the
		// memory go a round trip after a pod closes its vconn, not
		// seconds later (its release, then the grace).
		if st := vc.state.Load(); st == stateOpen || st == stateClosing {
			err = vc.sendControl(context.Background(), format.Unexport, r.id, nil)
			if err == nil {
				return // deregistered on the peer's acknowledgement
			}
		}
		// Not sent: the peer may still be using the region until the
		// vconn ends, which withdraws it (releaseRegions).
		rg := vc.rg()
		rg.mu.Lock()
		_, live := rg.exports[r.id]
		keep := live && vc.state.Load() != stateClosed
		if !keep {
			delete(rg.exports, r.id)
		}
		rg.mu.Unlock()
		if live && !keep {
			err = errors.Join(err, r.release())
		}
	})
	return err
}

// onExport records a region the peer exported to this vconn.
func (vc *VConn) onExport(h *format.Header, payload []byte) error {
	r, err := format.ParseAd(payload)
	if err != nil {
		return err
	}
	rg := vc.rg()
	rg.mu.Lock()
	if rg.remote == nil {
		rg.remote = make(map[uint32]remoteRegion)
	}
	rg.remote[h.Region()] = r
	rg.mu.Unlock()
	return nil
}

// onUnexport forgets a region and confirms once the one-sided operations
// queued before are posted: they reach the peer before the confirmation
// (same QP, in order), and none can be queued after (queueOp checks the
// region under rg.mu). Data queued before need not go first: it does not
// touch the region, and it may wait for the peer's reader indefinitely.
func (vc *VConn) onUnexport(h *format.Header) {
	rg := vc.rg()
	rg.mu.Lock()
	_, had := rg.remote[h.Region()]
	delete(rg.remote, h.Region())
	if had {
		rg.unexportAcks = append(rg.unexportAcks, unexportAck{id: h.Region(), after: rg.marks})
	}
	rg.mu.Unlock()
	if had {
		vc.schedule()
	}
}

// onUnexported: the peer confirmed it stopped using region id.
func (vc *VConn) onUnexported(id uint32) {
	rg := vc.rg()
	rg.mu.Lock()
	r := rg.exports[id]
	delete(rg.exports, id)
	rg.mu.Unlock()
	if r != nil {
		_ = r.release()
	}
}

// releaseRegions withdraws what the vconn exported when it ends. The
// memory stays registered for regionGrace: a peer whose last one-sided
// operations are still in flight (it had not yet heard of a reset, or of
// the failure) must find a live key, or its shared QP fails with a remote
// access error and with it every other vconn on that QP.
func (vc *VConn) releaseRegions() {
	rg := vc.regions.Load()
	if rg == nil {
		return
	}
	rg.mu.Lock()
	exp := rg.exports
	rg.exports, rg.remote, rg.unexportAcks = nil, nil, nil
	rg.mu.Unlock()
	for _, r := range exp {
		vc.e.releaseLater(r)
	}
}

// regionGrace outlasts a peer's RC retry budget (about 2 s, pathOptions).
const regionGrace = 3 * time.Second

// graced is registered memory whose deregistration may wait out
// regionGrace: a Region, or Staging memory.
type graced interface {
	release() error
	on() *Peer // the peer whose QPs may still reach it
}

// on is the peer whose QPs may still reach r.
func (r *Region) on() *Peer { return r.peer }

// releaseLater deregisters r after regionGrace, or now if the engine is
// closing (its QPs are gone: nothing can reach r).
func (e *Engine) releaseLater(r graced) {
	e.graceMu.Lock()
	defer e.graceMu.Unlock()
	if e.closed.Load() {
		_ = r.release()
		return
	}
	if e.grace == nil {
		e.grace = make(map[graced]*time.Timer)
	}
	e.grace[r] = time.AfterFunc(regionGrace, func() {
		e.graceMu.Lock()
		_, ok := e.grace[r]
		delete(e.grace, r)
		if ok {
			e.graceWG.Add(1) // under graceMu: Close's releaseGraced comes before or after
		}
		e.graceMu.Unlock()
		if ok {
			_ = r.release()
			e.graceWG.Done()
		}
	})
}

// releaseGracedOf deregisters now the regions of p's vconns still in their
// grace period: p's QPs are about to go, and with them any use of the
// regions' windows (a window should not outlive its QP: a NIC's may hold
// the QP's destruction back).
func (e *Engine) releaseGracedOf(p *Peer) {
	e.graceMu.Lock()
	defer e.graceMu.Unlock()
	for r, t := range e.grace {
		if r.on() == p {
			t.Stop()
			delete(e.grace, r)
			_ = r.release()
		}
	}
}

// releaseGraced deregisters every region still in its grace period.
func (e *Engine) releaseGraced() {
	e.graceMu.Lock()
	defer e.graceMu.Unlock()
	for r, t := range e.grace {
		t.Stop()
		_ = r.release()
	}
	e.grace = nil
}

// abandonOp ends an operation whose completions will not be seen: the
// vconn was released (its vQPN may already have a new owner).
func (vc *VConn) abandonOp(err error) {
	rg := vc.regions.Load()
	if rg == nil {
		return
	}
	o := &rg.op
	o.cmu.Lock()
	if o.pending > 0 {
		o.pending = 0
		o.abandoned = true
		if o.err == nil {
			o.err = err
		}
		close(o.done)
	}
	o.cmu.Unlock()
}

// rdmaOp is a vconn's one-sided operation in progress (one at a time).
type rdmaOp struct {
	mu  sync.Mutex     // serialises Write and Read on the vconn
	wrs []verbs.SendWR // the operation's WRs, posted at the ring's marker

	cmu     sync.Mutex // guards the completion state below
	pending int        // WRs not completed
	reads   []uint32   // read destination offsets in dst, by post order
	dst     []byte
	err     error
	done    chan struct{} // closed when pending reaches 0
	// abandoned: done was closed without the completions (abandonOp),
	// whose work requests may still be in flight.
	abandoned bool
}
