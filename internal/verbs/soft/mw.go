package soft

import (
	"fmt"
	"sync"
	"sync/atomic"

	"github.com/rdmavisor/rdmavisor/internal/verbs"
)

// mw is a type 2 memory window. Its key is in the device's window table
// (keys.go), with a random tag like a region's; a bind replaces the low 8
// bits. The binding is published as one immutable value, so the responder
// checks a request against it without a lock; mu serializes binds,
// invalidations and Close.
type mw struct {
	pd     *pd
	key    atomic.Uint32 // current key: as allocated, then as the last executed bind set it
	posted atomic.Uint32 // the key of the last bind posted (RKey)

	mu     sync.Mutex
	bind   atomic.Pointer[mwBinding] // nil: free; written with mu held
	closed bool                      // guarded by mu
}

// mwBinding is what a bind granted: a range of one region, on one QP.
type mwBinding struct {
	qp     *qp
	mr     *mr
	addr   uint64 // virtual address of the window's first byte, in mr
	length uint64
	access verbs.Access // remote access; AccessZeroBased: addresses are offsets
	key    uint32
}

var _ verbs.MW = (*mw)(nil)

func (m *mw) keyOf() uint32     { return m.key.Load() }
func (m *mw) setKey(k uint32)   { m.key.Store(k); m.posted.Store(k) }
func (m *mw) Handle() uint32    { return m.key.Load() >> 8 }
func (m *mw) RKey() uint32      { return m.posted.Load() }
func (r *mr) keyOf() uint32     { return r.key }
func (r *mr) setKey(key uint32) { r.key = key }

// AllocMW allocates a type 2 window, free until bound.
func (p *pd) AllocMW() (verbs.MW, error) {
	if p.closed.Load() {
		return nil, fmt.Errorf("soft: alloc mw: %w", verbs.ErrClosed)
	}
	m := &mw{pd: p}
	if err := p.dev.mws.add(m); err != nil {
		return nil, fmt.Errorf("soft: alloc mw: %w", err)
	}
	p.children.Add(1)
	return m, nil
}

// Close deallocates the window, invalidating it if it is bound.
func (m *mw) Close() error {
	m.mu.Lock()
	if m.closed {
		m.mu.Unlock()
		return fmt.Errorf("soft: dealloc mw: %w", verbs.ErrClosed)
	}
	m.closed = true
	m.unbindLocked()
	m.mu.Unlock()
	m.pd.dev.mws.remove(m)
	m.pd.children.Add(-1)
	return nil
}

// unbindLocked frees a bound window: its region and QP forget it. Called
// with m.mu held.
func (m *mw) unbindLocked() {
	b := m.bind.Swap(nil)
	if b == nil {
		return
	}
	b.mr.dropWindow()
	b.qp.mwMu.Lock()
	delete(b.qp.mws, m)
	b.qp.mwMu.Unlock()
}

// addWindow counts a window bound to the region; false once it is closed.
func (r *mr) addWindow() bool {
	r.bindMu.Lock()
	defer r.bindMu.Unlock()
	if r.closed.Load() {
		return false
	}
	r.windows++
	return true
}

func (r *mr) dropWindow() {
	r.bindMu.Lock()
	r.windows--
	r.bindMu.Unlock()
}

func isLocalOp(op verbs.WROpcode) bool { return op == verbs.WRBindMW || op == verbs.WRLocalInv }

// checkLocalOp is PostSend's check of a bind or invalidate, after
// verbs.CheckSendWR: the window and region a bind names must be this QP's
// PD's.
func (q *qp) checkLocalOp(wr *verbs.SendWR) error {
	if wr.Opcode == verbs.WRLocalInv {
		return nil
	}
	if m := q.dev.mws.at(wr.MW); m == nil || m.pd != q.pd {
		return fmt.Errorf("%w: bind of window %#x, not one of the QP's PD", verbs.ErrInvalid, wr.MW)
	}
	if r := q.dev.lookupKey(wr.SG[0].LKey); r == nil || r.pd != q.pd {
		return fmt.Errorf("%w: bind to lkey %#x, not an MR of the QP's PD", verbs.ErrInvalid, wr.SG[0].LKey)
	}
	return nil
}

// execLocal executes a bind or an invalidate when the requester reaches it
// in send queue order; it returns the completion status. Called with q.mu.
func (q *qp) execLocal(wr *verbs.SendWR) verbs.WCStatus {
	if wr.Opcode == verbs.WRLocalInv {
		if !q.invalidateMW(wr.RKey) {
			return verbs.WCLocQPOpErr // as rxe_do_local_ops
		}
		return verbs.WCSuccess
	}
	if !q.bindMW(wr) {
		return verbs.WCMWBindErr
	}
	return verbs.WCSuccess
}

// bindMW checks a type 2 bind as rxe_check_bind_mw does (IBA o10-37.2.30,
// C10-72 to C10-75) and binds the window to this QP.
func (q *qp) bindMW(wr *verbs.SendWR) bool {
	m := q.dev.mws.at(wr.MW)
	r := q.dev.lookupKey(wr.SG[0].LKey)
	if m == nil || r == nil || m.pd != q.pd || r.pd != q.pd {
		return false
	}
	sg := wr.SG[0]
	access := wr.MWAccess
	if r.access&verbs.AccessMWBind == 0 || sg.Length == 0 {
		return false
	}
	if access&(verbs.AccessRemoteWrite|verbs.AccessRemoteAtomic) != 0 && r.access&verbs.AccessLocalWrite == 0 {
		return false
	}
	if _, ok := r.span(sg.Addr, uint64(sg.Length)); !ok {
		return false
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	// Only the low 8 bits of the key are the consumer's. As on rxe, a bind
	// that leaves them as they were is not refused.
	key := m.key.Load()&^0xff | wr.RKey&0xff
	if m.closed || m.bind.Load() != nil {
		return false
	}
	if !r.addWindow() {
		return false
	}
	q.mwMu.Lock()
	if q.mws == nil {
		q.mws = make(map[*mw]struct{})
	}
	q.mws[m] = struct{}{}
	q.mwMu.Unlock()
	m.key.Store(key)
	m.bind.Store(&mwBinding{qp: q, mr: r, addr: sg.Addr, length: uint64(sg.Length), access: access, key: key})
	return true
}

// invalidateMW frees the window whose current key is key, if it is bound
// on this QP.
func (q *qp) invalidateMW(key uint32) bool {
	if !isMWKey(key) {
		return false
	}
	m := q.dev.mws.lookup(key)
	if m == nil {
		return false
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	b := m.bind.Load()
	if b == nil || b.key != key || b.qp != q {
		return false
	}
	m.unbindLocked()
	return true
}

// dropWindows invalidates the windows bound on a QP that is closing.
func (q *qp) dropWindows() {
	q.mwMu.Lock()
	ws := make([]*mw, 0, len(q.mws))
	for m := range q.mws {
		ws = append(ws, m)
	}
	q.mwMu.Unlock()
	for _, m := range ws {
		m.mu.Lock()
		if b := m.bind.Load(); b != nil && b.qp == q {
			m.unbindLocked()
		}
		m.mu.Unlock()
	}
}

// checkWindow validates a remote key that names a window: bound on this
// QP, with the access, and the range inside the window. It returns the
// window's region and the virtual address the request starts at there.
func (q *qp) checkWindow(rkey uint32, va uint64, n uint32, access verbs.Access) (*mr, uint64, bool) {
	m := q.dev.mws.at(rkey >> 8)
	if m == nil {
		return nil, 0, false
	}
	b := m.bind.Load()
	if b == nil || b.key != rkey || b.qp != q || b.access&access == 0 {
		return nil, 0, false
	}
	off := va
	if b.access&verbs.AccessZeroBased == 0 {
		if va < b.addr {
			return nil, 0, false
		}
		off = va - b.addr
	}
	if off > b.length || uint64(n) > b.length-off {
		return nil, 0, false
	}
	return b.mr, b.addr + off, true
}
