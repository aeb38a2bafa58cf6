//go:build ibverbs && linux

package ibv

// #include "shim.h"
import "C"

import (
	"fmt"
	"syscall"
	"unsafe"

	"github.com/rdmavisor/rdmavisor/internal/verbs"
)

// mw is a type 2 memory window. A WRBindMW names it by handle (index+1 in
// its PD's table) and its region by lkey; PostSend resolves both to the
// pointers libibverbs wants.
type mw struct {
	life
	pd     *pd
	mw     *C.struct_ibv_mw
	handle uint32
}

var _ verbs.MW = (*mw)(nil)

func (p *pd) AllocMW() (verbs.MW, error) {
	const what = "alloc type 2 MW"
	if p.dev.attr.MaxMW == 0 {
		return nil, fmt.Errorf("ibv: %s on %s: %w: the device has no type 2 memory windows", what, p.dev.name, verbs.ErrInvalid)
	}
	if err := p.hold(what); err != nil {
		return nil, err
	}
	w, cerr := C.rv_alloc_mw(p.pd)
	if w == nil {
		p.release()
		return nil, wrap(what, errnoOf(0, cerr), false)
	}
	m := &mw{pd: p, mw: w}
	p.mwMu.Lock()
	if n := len(p.mwFree); n > 0 {
		m.handle = p.mwFree[n-1]
		p.mwFree = p.mwFree[:n-1]
		p.mws[m.handle-1] = w
	} else {
		p.mws = append(p.mws, w)
		m.handle = uint32(len(p.mws))
	}
	p.mwMu.Unlock()
	return m, nil
}

func (m *mw) Handle() uint32 { return m.handle }

// RKey reads ibv_mw.rkey, which rv_post_send keeps at the key of the last
// bind posted.
func (m *mw) RKey() uint32 {
	m.pd.mwMu.RLock()
	defer m.pd.mwMu.RUnlock()
	return uint32(m.mw.rkey)
}

func (m *mw) Close() error {
	return m.life.close("MW", func() error {
		// Unpublish first, so no post picks it up while it is freed.
		p := m.pd
		p.mwMu.Lock()
		defer p.mwMu.Unlock()
		if rc := C.rv_dealloc_mw(m.mw); rc != 0 {
			return wrap("dealloc MW", errnoOf(int(rc), nil), false)
		}
		p.mws[m.handle-1] = nil
		p.mwFree = append(p.mwFree, m.handle)
		p.release()
		return nil
	})
}

func hasBind(wrs []verbs.SendWR) bool {
	for i := range wrs {
		if wrs[i].Opcode == verbs.WRBindMW {
			return true
		}
	}
	return false
}

// postBinds posts a batch holding binds, checked but for their windows
// and regions: those are resolved in the QP's PD, and the table stays
// read-locked while the provider uses them. The batch stops before the
// first bind whose window or region the PD does not have; it returns the
// post's result, how many WRs it offered, and why it stopped (bad, the
// caller's, when it did not stop early).
func (q *qp) postBinds(wp *C.struct_rv_send_wr, wrs []verbs.SendWR, bad error) (C.int64_t, int, error) {
	binds := make([]C.struct_rv_bind, len(wrs))
	p := q.pd
	p.mwMu.RLock()
	defer p.mwMu.RUnlock()
	n := len(wrs)
	for i := range wrs {
		w := &wrs[i]
		if w.Opcode != verbs.WRBindMW {
			continue
		}
		if h := w.MW; h >= 1 && int(h) <= len(p.mws) {
			binds[i].mw = p.mws[h-1]
		}
		binds[i].mr = p.mrs[w.SG[0].LKey]
		if binds[i].mw == nil {
			n, bad = i, fmt.Errorf("%w: bind of window %#x, not one of the QP's PD", verbs.ErrInvalid, w.MW)
			break
		}
		if binds[i].mr == nil {
			n, bad = i, fmt.Errorf("%w: bind to lkey %#x, not an MR of the QP's PD", verbs.ErrInvalid, w.SG[0].LKey)
			break
		}
	}
	r := C.rv_post_send(q.qp, C.uint32_t(q.typ), nil, 0, (*C.struct_rv_bind)(unsafe.Pointer(&binds[0])), wp, C.int(n))
	return r, n, bad
}

// deregErr is MR.Close's error: the kernel's rxe refuses to deregister a
// region with bound windows with EINVAL (IBA 10.6.7.2.6), reported as
// ErrBusy like every close of an object still in use.
func deregErr(e syscall.Errno) error {
	if e == syscall.EINVAL || e == syscall.EBUSY {
		return fmt.Errorf("ibv: deregister MR: %w: memory windows may be bound to it (%w)", verbs.ErrBusy, e)
	}
	return wrap("deregister MR", e, false)
}
