//go:build ibverbs && linux

package ibv

// #include <string.h>
// #include "shim.h"
import "C"

import (
	"fmt"
	"sync"
	"unsafe"

	"github.com/rdmavisor/rdmavisor/internal/verbs"
)

type pd struct {
	life
	dev *device
	pd  *C.struct_ibv_pd
	// ahs maps AH handles (index+1) to address handles for UD posts; ahMu
	// guards the slice, read-locked while a post uses it.
	ahMu   sync.RWMutex
	ahs    []*C.struct_ibv_ah
	ahFree []uint32
	// mws maps MW handles (index+1) to windows, mrs lkeys to regions, for
	// binds; mwMu guards both, read-locked while a post uses them.
	mwMu   sync.RWMutex
	mws    []*C.struct_ibv_mw
	mwFree []uint32
	mrs    map[uint32]*C.struct_ibv_mr
}

var _ verbs.PD = (*pd)(nil)

func (d *device) AllocPD() (verbs.PD, error) {
	if err := d.hold("alloc PD on " + d.name); err != nil {
		return nil, err
	}
	p, cerr := C.ibv_alloc_pd(d.ctx)
	if p == nil {
		d.release()
		return nil, wrap("alloc PD on "+d.name, errnoOf(0, cerr), false)
	}
	return &pd{dev: d, pd: p}, nil
}

func (p *pd) Close() error {
	return p.life.close("PD", func() error {
		if rc := C.ibv_dealloc_pd(p.pd); rc != 0 {
			return wrap("dealloc PD", errnoOf(int(rc), nil), false)
		}
		p.dev.release()
		return nil
	})
}

type mr struct {
	life
	pd    *pd
	mr    *C.struct_ibv_mr
	mem   []byte
	owned bool // mem is ours to unmap (RegMR), not the caller's
}

var _ verbs.MR = (*mr)(nil)

func (p *pd) RegMR(length int, access verbs.Access) (verbs.MR, error) {
	what := fmt.Sprintf("register MR of %d bytes (access %#x)", length, uint32(access))
	if length <= 0 {
		return nil, fmt.Errorf("ibv: %s: %w: length must be positive", what, verbs.ErrInvalid)
	}
	if err := checkRegAccess(what, access); err != nil {
		return nil, err
	}
	mem, err := verbs.AllocMemory(length)
	if err != nil {
		return nil, fmt.Errorf("ibv: %s: %w", what, err)
	}
	m, err := p.register(what, mem, access, true)
	if err != nil {
		_ = verbs.FreeMemory(mem)
		return nil, err
	}
	return m, nil
}

// RegMRMem registers the caller's memory: ibv_reg_mr on its address, which
// pins its pages (EFAULT, ErrFault, where they are not mapped with the
// access asked). mem must lie outside the Go heap: C keeps its address.
func (p *pd) RegMRMem(mem []byte, access verbs.Access) (verbs.MR, error) {
	what := fmt.Sprintf("register MR of %d bytes at %#x (access %#x)", len(mem), verbs.AddrOf(mem), uint32(access))
	if len(mem) == 0 {
		return nil, fmt.Errorf("ibv: %s: %w: length must be positive", what, verbs.ErrInvalid)
	}
	if err := checkRegAccess(what, access); err != nil {
		return nil, err
	}
	return p.register(what, mem, access, false)
}

func checkRegAccess(what string, access verbs.Access) error {
	if access&(verbs.AccessRemoteWrite|verbs.AccessRemoteAtomic) != 0 && access&verbs.AccessLocalWrite == 0 {
		return fmt.Errorf("ibv: %s: %w: remote write and atomic need local write", what, verbs.ErrInvalid)
	}
	return nil
}

// register registers mem; owned says Close unmaps it.
func (p *pd) register(what string, mem []byte, access verbs.Access, owned bool) (*mr, error) {
	if err := p.hold(what); err != nil {
		return nil, err
	}
	// C keeps the address beyond the call: mem is outside the Go heap.
	m, cerr := C.ibv_reg_mr(p.pd, unsafe.Pointer(&mem[0]), C.size_t(len(mem)), C.int(access))
	if m == nil {
		p.release()
		return nil, wrap(what, errnoOf(0, cerr), false)
	}
	p.mwMu.Lock()
	if p.mrs == nil {
		p.mrs = make(map[uint32]*C.struct_ibv_mr)
	}
	p.mrs[uint32(m.lkey)] = m
	p.mwMu.Unlock()
	return &mr{pd: p, mr: m, mem: mem, owned: owned}, nil
}

func (m *mr) Bytes() []byte { return m.mem }
func (m *mr) Addr() uint64  { return verbs.AddrOf(m.mem) }
func (m *mr) LKey() uint32  { return uint32(m.mr.lkey) }
func (m *mr) RKey() uint32  { return uint32(m.mr.rkey) }

func (m *mr) Close() error {
	return m.life.close("MR", func() error {
		lkey := uint32(m.mr.lkey)
		m.pd.mwMu.Lock()
		defer m.pd.mwMu.Unlock()
		if rc := C.ibv_dereg_mr(m.mr); rc != 0 {
			return deregErr(errnoOf(int(rc), nil))
		}
		delete(m.pd.mrs, lkey)
		var err error
		if m.owned {
			err = verbs.FreeMemory(m.mem)
		}
		m.pd.release()
		return err
	})
}

type ah struct {
	life
	pd     *pd
	ah     *C.struct_ibv_ah
	handle uint32
}

var _ verbs.AH = (*ah)(nil)

// fillAH writes an address vector: global (GRH) with the source GID index
// translated to the hardware table, or, with NoGRH on an InfiniBand port,
// routed by DLID within the subnet (untested on InfiniBand hardware).
func (d *device) fillAH(dst *C.struct_ibv_ah_attr, a *verbs.AHAttr) error {
	if err := verbs.CheckAH(a); err != nil {
		return err
	}
	C.memset(unsafe.Pointer(dst), 0, C.sizeof_struct_ibv_ah_attr)
	dst.sl = C.uint8_t(a.SL)
	dst.port_num = C.uint8_t(a.PortNum)
	if a.PortNum == 0 {
		dst.port_num = d.port
	}
	if a.NoGRH {
		if d.attr.LinkLayer != verbs.LinkLayerInfiniBand {
			return fmt.Errorf("ibv: address vector without a GRH on %s port %d, whose link layer is %v: %w", d.name, int(d.port), d.attr.LinkLayer, verbs.ErrInvalid)
		}
		if lmc := d.attr.LMC; a.SrcPathBits >= 1<<lmc {
			return fmt.Errorf("ibv: source path bits %#x outside the port's LMC %d: %w", a.SrcPathBits, lmc, verbs.ErrInvalid)
		}
		dst.dlid = C.uint16_t(a.DLID)
		dst.src_path_bits = C.uint8_t(a.SrcPathBits)
		return nil
	}
	if int(a.SGIDIndex) >= d.gidLen {
		return fmt.Errorf("ibv: source GID index %d out of range: the table has %d entries: %w", a.SGIDIndex, d.gidLen, verbs.ErrInvalid)
	}
	dst.is_global = 1
	C.memcpy(unsafe.Pointer(&dst.grh.dgid), unsafe.Pointer(&a.DGID[0]), 16)
	dst.grh.sgid_index = C.uint8_t(d.hw(int(a.SGIDIndex)))
	dst.grh.hop_limit = C.uint8_t(a.HopLimit)
	dst.grh.traffic_class = C.uint8_t(a.TrafficClass)
	dst.grh.flow_label = C.uint32_t(a.FlowLabel)
	return nil
}

func (d *device) readAH(src *C.struct_ibv_ah_attr) verbs.AHAttr {
	var a verbs.AHAttr
	a.SL = uint8(src.sl)
	a.PortNum = uint8(src.port_num)
	a.DLID = uint16(src.dlid)
	a.SrcPathBits = uint8(src.src_path_bits)
	if src.is_global == 0 {
		a.NoGRH = true
		return a
	}
	C.memcpy(unsafe.Pointer(&a.DGID[0]), unsafe.Pointer(&src.grh.dgid), 16)
	a.SGIDIndex = uint8(d.hw(int(src.grh.sgid_index)))
	a.HopLimit = uint8(src.grh.hop_limit)
	a.TrafficClass = uint8(src.grh.traffic_class)
	a.FlowLabel = uint32(src.grh.flow_label)
	return a
}

func (p *pd) CreateAH(attr *verbs.AHAttr) (verbs.AH, error) {
	what := fmt.Sprintf("create AH to %v", attr.DGID)
	var ca C.struct_ibv_ah_attr
	if err := p.dev.fillAH(&ca, attr); err != nil {
		return nil, fmt.Errorf("ibv: %s: %w", what, err)
	}
	if err := p.hold(what); err != nil {
		return nil, err
	}
	h, cerr := C.ibv_create_ah(p.pd, &ca)
	if h == nil {
		p.release()
		return nil, wrap(what, errnoOf(0, cerr), false)
	}
	p.ahMu.Lock()
	var handle uint32
	if n := len(p.ahFree); n > 0 {
		handle = p.ahFree[n-1]
		p.ahFree = p.ahFree[:n-1]
		p.ahs[handle-1] = h
	} else {
		p.ahs = append(p.ahs, h)
		handle = uint32(len(p.ahs))
	}
	p.ahMu.Unlock()
	return &ah{pd: p, ah: h, handle: handle}, nil
}

func (a *ah) Handle() uint32 { return a.handle }

func (a *ah) Close() error {
	return a.life.close("AH", func() error {
		// Unpublish first, so no post picks it up while it is destroyed.
		a.pd.ahMu.Lock()
		a.pd.ahs[a.handle-1] = nil
		a.pd.ahFree = append(a.pd.ahFree, a.handle)
		a.pd.ahMu.Unlock()
		if rc := C.ibv_destroy_ah(a.ah); rc != 0 {
			return wrap("destroy AH", errnoOf(int(rc), nil), false)
		}
		a.pd.release()
		return nil
	})
}
