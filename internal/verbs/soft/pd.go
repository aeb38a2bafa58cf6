package soft

import (
	"fmt"
	"runtime"
	"sync"
	"sync/atomic"

	"github.com/rdmavisor/rdmavisor/internal/verbs"
)

type pd struct {
	dev      *Device
	children atomic.Int64 // live MRs, QPs, SRQs, AHs
	closed   atomic.Bool
}

var _ verbs.PD = (*pd)(nil)

func (p *pd) Close() error {
	if n := p.children.Load(); n > 0 {
		return fmt.Errorf("soft: dealloc pd: %d objects still use it: %w", n, verbs.ErrBusy)
	}
	if p.closed.Swap(true) {
		return fmt.Errorf("soft: dealloc pd: %w", verbs.ErrClosed)
	}
	p.dev.children.Add(-1)
	return nil
}

// mr is a registered region. Its memory is mmap'd by the verbs layer
// (RegMR) or the caller (RegMRMem); the device reads and writes it as DMA
// would, without locks, but counted in use: deregistration waits for the
// copies in progress before it returns (and, for its own memory, unmaps
// it), as ibv_dereg_mr waits for the NIC, so a packet racing the close of
// its region never faults the process (copyIn, copyOut).
type mr struct {
	pd     *pd
	buf    []byte
	addr   uint64
	key    uint32
	access verbs.Access
	owned  bool // buf is ours to unmap (RegMR), not the caller's
	closed atomic.Bool
	use    atomic.Int32 // copies in progress

	bindMu  sync.Mutex
	windows int // memory windows bound to it; guarded by bindMu
}

// acquire counts a copy into or out of the region; false once it is
// closing. Every true is matched by release.
func (m *mr) acquire() bool {
	m.use.Add(1)
	if m.closed.Load() {
		m.use.Add(-1)
		return false
	}
	return true
}

func (m *mr) release() { m.use.Add(-1) }

// copyIn copies src into the region at addr; false if the range is not
// the region's or it is closing.
func (m *mr) copyIn(addr uint64, src []byte) bool {
	if !m.acquire() {
		return false
	}
	defer m.release()
	dst, ok := m.span(addr, uint64(len(src)))
	if ok {
		copy(dst, src)
	}
	return ok
}

// copyOut copies len(dst) bytes of the region at addr into dst, as copyIn.
func (m *mr) copyOut(dst []byte, addr uint64) bool {
	if !m.acquire() {
		return false
	}
	defer m.release()
	src, ok := m.span(addr, uint64(len(dst)))
	if ok {
		copy(dst, src)
	}
	return ok
}

var _ verbs.MR = (*mr)(nil)

func (m *mr) Bytes() []byte { return m.buf }
func (m *mr) Addr() uint64  { return m.addr }
func (m *mr) LKey() uint32  { return m.key }
func (m *mr) RKey() uint32  { return m.key }

func (m *mr) Close() error {
	m.bindMu.Lock()
	if n := m.windows; n > 0 && !m.closed.Load() {
		m.bindMu.Unlock()
		// IBA 10.6.7.2.6: a region with bound windows is not deregistered.
		return fmt.Errorf("soft: dereg mr: %w: %d memory windows are bound to it", verbs.ErrBusy, n)
	}
	if m.closed.Swap(true) {
		m.bindMu.Unlock()
		return fmt.Errorf("soft: dereg mr: %w", verbs.ErrClosed)
	}
	m.bindMu.Unlock()
	var err error
	{
		m.pd.dev.keys.remove(m)
		// Copies that began before the close finish first: they are
		// short (a packet's payload), so waiting spins briefly.
		for m.use.Load() != 0 {
			runtime.Gosched()
		}
		if m.owned {
			err = verbs.FreeMemory(m.buf)
		}
		m.pd.children.Add(-1)
	}
	return err
}

// RegMR allocates length bytes outside the Go heap and registers them.
func (p *pd) RegMR(length int, access verbs.Access) (verbs.MR, error) {
	what := fmt.Sprintf("reg mr of %d bytes", length)
	if length <= 0 || uint64(length) > maxMRSize {
		return nil, fmt.Errorf("soft: %s: %w", what, verbs.ErrInvalid)
	}
	if err := p.checkReg(what, access); err != nil {
		return nil, err
	}
	buf, err := verbs.AllocMemory(length)
	if err != nil {
		return nil, fmt.Errorf("soft: %s: %w", what, err)
	}
	m, err := p.register(buf, access, true)
	if err != nil {
		_ = verbs.FreeMemory(buf)
		return nil, err
	}
	return m, nil
}

// RegMRMem registers the caller's memory, as ibv_reg_mr does: pinning it
// would fail on memory not mapped with the access asked (EFAULT), so
// this checks the process's mappings for the same. It also refuses memory
// mapped with no access for a read-only registration, which a NIC's
// pinning allows (rxe did, in make test-rxe): this device reads the
// memory itself and would fault.
func (p *pd) RegMRMem(mem []byte, access verbs.Access) (verbs.MR, error) {
	what := fmt.Sprintf("reg mr of %d bytes at %#x", len(mem), verbs.AddrOf(mem))
	if len(mem) == 0 || uint64(len(mem)) > maxMRSize {
		return nil, fmt.Errorf("soft: %s: %w", what, verbs.ErrInvalid)
	}
	if err := p.checkReg(what, access); err != nil {
		return nil, err
	}
	if err := checkMapped(verbs.AddrOf(mem), uint64(len(mem)), access.Writable()); err != nil {
		return nil, fmt.Errorf("soft: %s: %w", what, err)
	}
	return p.register(mem, access, false)
}

// checkReg is what ibv_reg_mr refuses of any registration.
func (p *pd) checkReg(what string, access verbs.Access) error {
	if p.closed.Load() {
		return fmt.Errorf("soft: %s: %w", what, verbs.ErrClosed)
	}
	// As ibv_reg_mr: remote write needs local write.
	if access&(verbs.AccessRemoteWrite|verbs.AccessRemoteAtomic) != 0 && access&verbs.AccessLocalWrite == 0 {
		return fmt.Errorf("soft: %s: %w: remote write access requires local write", what, verbs.ErrInvalid)
	}
	return nil
}

// register makes buf a region with a key; owned says Close unmaps it.
func (p *pd) register(buf []byte, access verbs.Access, owned bool) (*mr, error) {
	m := &mr{pd: p, buf: buf, addr: verbs.AddrOf(buf), access: access, owned: owned}
	if err := p.dev.keys.add(m); err != nil {
		return nil, err
	}
	p.children.Add(1)
	return m, nil
}

// lookupKey returns the live region with exactly this key.
func (d *Device) lookupKey(key uint32) *mr { return d.keys.lookup(key) }

// span returns the bytes [addr, addr+n) of a region, if they lie inside it.
func (m *mr) span(addr uint64, n uint64) ([]byte, bool) {
	if addr < m.addr {
		return nil, false
	}
	off := addr - m.addr
	if off > uint64(len(m.buf)) || n > uint64(len(m.buf))-off {
		return nil, false
	}
	return m.buf[off : off+n], true
}

type ah struct {
	pd     *pd
	handle uint32
	attr   verbs.AHAttr
	closed atomic.Bool
}

var _ verbs.AH = (*ah)(nil)

func (a *ah) Handle() uint32 { return a.handle }

func (a *ah) Close() error {
	if a.closed.Swap(true) {
		return fmt.Errorf("soft: destroy ah: %w", verbs.ErrClosed)
	}
	d := a.pd.dev
	d.ahMu.Lock()
	delete(d.ahs, a.handle)
	d.ahMu.Unlock()
	a.pd.children.Add(-1)
	return nil
}

// CreateAH creates an address handle for UD sends.
func (p *pd) CreateAH(attr *verbs.AHAttr) (verbs.AH, error) {
	if p.closed.Load() {
		return nil, fmt.Errorf("soft: create ah: %w", verbs.ErrClosed)
	}
	if attr != nil && attr.NoGRH {
		return nil, fmt.Errorf("soft: create ah: %w: %s", verbs.ErrInvalid, errNoGRH)
	}
	if attr == nil || attr.DGID == (verbs.GID{}) {
		return nil, fmt.Errorf("soft: create ah: %w: no destination GID", verbs.ErrInvalid)
	}
	d := p.dev
	a := &ah{pd: p, attr: *attr}
	d.ahMu.Lock()
	a.handle = d.nextAH
	d.nextAH++
	d.ahs[a.handle] = a
	d.ahMu.Unlock()
	p.children.Add(1)
	return a, nil
}

func (d *Device) lookupAH(handle uint32) *ah {
	d.ahMu.RLock()
	a := d.ahs[handle]
	d.ahMu.RUnlock()
	return a
}
