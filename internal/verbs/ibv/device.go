//go:build ibverbs && linux

package ibv

// #cgo LDFLAGS: -libverbs
// #include <stdlib.h>
// #include <string.h>
// #include "shim.h"
import "C"

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"unsafe"

	"github.com/rdmavisor/rdmavisor/internal/verbs"
)

// Config selects a device, its port and the GID that addresses it.
type Config struct {
	// Names of acceptable devices, as ibv_devices lists them (mlx5_0).
	// Empty: any name.
	Names []string
	// GUIDs of acceptable devices: the node GUID as ibv_devices prints it
	// (0002c9030044ed90), with or without colons or 0x. Empty: any.
	GUIDs []string
	// Vendors of acceptable devices: a name (mellanox) or a vendor ID
	// (0x02c9), compared without case. Empty: any vendor.
	Vendors []string
	// Port number; zero is port 1.
	Port int
	// GIDIndex selects the GID table entry that addresses the device; nil
	// picks a RoCE v2 GID (an IPv4-mapped one first), or index 0 on a port
	// without RoCE.
	GIDIndex *int
}

// DeviceInfo describes a device for listing.
type DeviceInfo struct {
	Name     string
	NodeGUID uint64
	VendorID uint32
	// Vendor is the vendor's name when known, else the ID in hex.
	Vendor    string
	PartID    uint32
	PortState string // of port 1
	LinkLayer string // of port 1: Ethernet or InfiniBand
}

func (d DeviceInfo) String() string {
	return fmt.Sprintf("%s (guid %s, vendor %s, port 1 %s)", d.Name, formatGUID(d.NodeGUID), d.Vendor, d.PortState)
}

// vendorNames maps IEEE OUIs (ibv_device_attr.vendor_id) and PCI vendor IDs
// to the names an RDMAService may use.
var vendorNames = map[uint32]string{
	0x02c9: "mellanox", 0x15b3: "mellanox", 0x14e4: "broadcom", 0x8086: "intel",
	0x1077: "qlogic", 0x1d0f: "amazon", 0x19e5: "huawei",
}

func vendorName(id uint32) string {
	if n, ok := vendorNames[id]; ok {
		return n
	}
	return fmt.Sprintf("0x%04x", id)
}

func formatGUID(g uint64) string { return fmt.Sprintf("%016x", g) }

// nodeGUID returns the device's node GUID in host order.
func nodeGUID(dev *C.struct_ibv_device) uint64 { return beToHost(uint64(C.ibv_get_device_guid(dev))) }

func parseGUID(s string) (uint64, error) {
	t := strings.ToLower(strings.NewReplacer(":", "", ".", "", "-", "").Replace(strings.TrimPrefix(strings.ToLower(s), "0x")))
	v, err := strconv.ParseUint(t, 16, 64)
	if err != nil || len(t) == 0 || len(t) > 16 {
		return 0, fmt.Errorf("ibv: GUID %q: want 16 hex digits: %w", s, verbs.ErrInvalid)
	}
	return v, nil
}

var portStates = map[C.enum_ibv_port_state]string{
	C.IBV_PORT_NOP: "NOP", C.IBV_PORT_DOWN: "DOWN", C.IBV_PORT_INIT: "INIT",
	C.IBV_PORT_ARMED: "ARMED", C.IBV_PORT_ACTIVE: "ACTIVE", C.IBV_PORT_ACTIVE_DEFER: "ACTIVE_DEFER",
}

func portState(s C.enum_ibv_port_state) string {
	if n, ok := portStates[s]; ok {
		return n
	}
	return fmt.Sprintf("state %d", int(s))
}

func linkLayer(l C.uint8_t) string {
	if l == C.IBV_LINK_LAYER_ETHERNET {
		return "Ethernet"
	}
	return "InfiniBand"
}

// deviceList returns the devices libibverbs knows, sorted by name; free
// releases the list.
func deviceList() (devs []*C.struct_ibv_device, free func(), err error) {
	var n C.int
	list, cerr := C.ibv_get_device_list(&n)
	if list == nil {
		if e := errnoOf(0, cerr); e != syscall.ENOSYS {
			return nil, nil, fmt.Errorf("ibv: list devices: %w", e)
		}
		// ENOSYS: the kernel has no RDMA stack loaded, so no devices.
		return nil, func() {}, nil
	}
	devs = make([]*C.struct_ibv_device, int(n))
	copy(devs, unsafe.Slice(list, int(n)))
	slices.SortFunc(devs, func(a, b *C.struct_ibv_device) int {
		return strings.Compare(C.GoString(C.ibv_get_device_name(a)), C.GoString(C.ibv_get_device_name(b)))
	})
	return devs, func() { C.ibv_free_device_list(list) }, nil
}

func describe(dev *C.struct_ibv_device) DeviceInfo {
	info := DeviceInfo{Name: C.GoString(C.ibv_get_device_name(dev)), NodeGUID: nodeGUID(dev), PortState: "unknown"}
	ctx := C.ibv_open_device(dev)
	if ctx == nil {
		return info
	}
	defer C.ibv_close_device(ctx)
	var a C.struct_ibv_device_attr
	if C.ibv_query_device(ctx, &a) == 0 {
		info.VendorID, info.PartID = uint32(a.vendor_id), uint32(a.vendor_part_id)
		info.Vendor = vendorName(info.VendorID)
	}
	var pa C.struct_ibv_port_attr
	if C.rv_query_port(ctx, 1, &pa) == 0 {
		info.PortState, info.LinkLayer = portState(pa.state), linkLayer(pa.link_layer)
	}
	return info
}

// List describes every RDMA device of the host, sorted by name.
func List() ([]DeviceInfo, error) {
	devs, free, err := deviceList()
	if err != nil {
		return nil, err
	}
	defer free()
	out := make([]DeviceInfo, 0, len(devs))
	for _, d := range devs {
		out = append(out, describe(d))
	}
	return out, nil
}

func (c *Config) matches(info DeviceInfo) (bool, error) {
	if len(c.Names) > 0 && !slices.Contains(c.Names, info.Name) {
		return false, nil
	}
	if len(c.GUIDs) > 0 {
		ok := false
		for _, s := range c.GUIDs {
			g, err := parseGUID(s)
			if err != nil {
				return false, err
			}
			ok = ok || g == info.NodeGUID
		}
		if !ok {
			return false, nil
		}
	}
	if len(c.Vendors) > 0 {
		ok := false
		for _, v := range c.Vendors {
			v = strings.ToLower(v)
			if id, err := strconv.ParseUint(strings.TrimPrefix(v, "0x"), 16, 32); err == nil && strings.HasPrefix(v, "0x") {
				ok = ok || uint32(id) == info.VendorID
			} else {
				ok = ok || v == info.Vendor
			}
		}
		if !ok {
			return false, nil
		}
	}
	return true, nil
}

// Open opens the first device (by name) that cfg selects, checks that its
// port is ACTIVE and selects its GID.
func Open(cfg Config) (verbs.Device, error) {
	if cfg.Port == 0 {
		cfg.Port = 1
	}
	if cfg.Port < 1 || cfg.Port > 255 {
		return nil, fmt.Errorf("ibv: port %d: %w", cfg.Port, verbs.ErrInvalid)
	}
	devs, free, err := deviceList()
	if err != nil {
		return nil, err
	}
	defer free()
	var infos []DeviceInfo
	var chosen *C.struct_ibv_device
	for _, d := range devs {
		info := describe(d)
		infos = append(infos, info)
		ok, err := cfg.matches(info)
		if err != nil {
			return nil, err
		}
		if ok && chosen == nil {
			chosen = d
		}
	}
	if chosen == nil {
		have := "none (/sys/class/infiniband is empty or absent)"
		if len(infos) > 0 {
			var s []string
			for _, i := range infos {
				s = append(s, i.String())
			}
			have = strings.Join(s, "; ")
		}
		return nil, fmt.Errorf("ibv: no RDMA device matches names %q, GUIDs %q, vendors %q; devices present: %s",
			cfg.Names, cfg.GUIDs, cfg.Vendors, have)
	}
	return openDevice(chosen, cfg)
}

type device struct {
	life
	ctx  *C.struct_ibv_context
	name string
	port C.uint8_t
	attr verbs.DeviceAttr
	// gidSel is the hardware index of the selected GID, shown at index 0;
	// gidLen the size of the port's table.
	gidSel, gidLen int
	mtu            uint32 // active MTU in bytes
}

var _ verbs.Device = (*device)(nil)

func openDevice(dev *C.struct_ibv_device, cfg Config) (*device, error) {
	name := C.GoString(C.ibv_get_device_name(dev))
	ctx, cerr := C.ibv_open_device(dev)
	if ctx == nil {
		return nil, fmt.Errorf("ibv: open %s: %w", name, errnoOf(0, cerr))
	}
	d := &device{ctx: ctx, name: name, port: C.uint8_t(cfg.Port)}
	if err := d.setup(cfg); err != nil {
		C.ibv_close_device(ctx)
		return nil, err
	}
	return d, nil
}

func (d *device) setup(cfg Config) error {
	var a C.struct_ibv_device_attr
	if rc := C.ibv_query_device(d.ctx, &a); rc != 0 {
		return wrap("query device "+d.name, errnoOf(int(rc), nil), false)
	}
	if cfg.Port > int(a.phys_port_cnt) {
		return fmt.Errorf("ibv: %s has %d port(s), not port %d: %w", d.name, int(a.phys_port_cnt), cfg.Port, verbs.ErrInvalid)
	}
	var pa C.struct_ibv_port_attr
	if rc := C.rv_query_port(d.ctx, d.port, &pa); rc != 0 {
		return wrap(fmt.Sprintf("query port %d of %s", cfg.Port, d.name), errnoOf(int(rc), nil), false)
	}
	if pa.state != C.IBV_PORT_ACTIVE {
		return fmt.Errorf("ibv: port %d of %s is %s, not ACTIVE (link down, or no netdev up under it)", cfg.Port, d.name, portState(pa.state))
	}
	d.gidLen = int(pa.gid_tbl_len)
	d.mtu = uint32(verbs.MTU(pa.active_mtu).Bytes())
	sel, err := d.selectGID(cfg, pa.link_layer == C.IBV_LINK_LAYER_ETHERNET)
	if err != nil {
		return err
	}
	d.gidSel = sel
	d.attr = verbs.DeviceAttr{
		Name: d.name, Vendor: vendorName(uint32(a.vendor_id)), NodeGUID: beToHost(uint64(a.node_guid)),
		MaxQP: int(a.max_qp), MaxQPWR: int(a.max_qp_wr), MaxSGE: int(a.max_sge), MaxCQ: int(a.max_cq),
		MaxCQE: int(a.max_cqe), MaxMR: int(a.max_mr), MaxMRSize: uint64(a.max_mr_size), MaxPD: int(a.max_pd),
		MaxSRQ: int(a.max_srq), MaxSRQWR: int(a.max_srq_wr), MaxAH: int(a.max_ah),
		ActiveMTU: verbs.MTU(pa.active_mtu), MaxMTU: verbs.MTU(pa.max_mtu),
		// A verbs.Device is one port of the hardware device.
		PortCount: 1, NUMANode: d.numaNode(),
	}
	if pa.link_layer == C.IBV_LINK_LAYER_ETHERNET {
		d.attr.LinkLayer = verbs.LinkLayerEthernet
	} else {
		// Unspecified is what providers older than link_layer report,
		// all of them InfiniBand.
		d.attr.LinkLayer = verbs.LinkLayerInfiniBand
		d.attr.LID, d.attr.LMC = uint16(pa.lid), uint8(pa.lmc)
	}
	// Type 2 windows only: a device with type 1 alone has none to offer.
	if a.device_cap_flags&(C.IBV_DEVICE_MEM_WINDOW_TYPE_2A|C.IBV_DEVICE_MEM_WINDOW_TYPE_2B) != 0 {
		d.attr.MaxMW = int(a.max_mw)
	}
	return nil
}

// beToHost converts a __be64 read as a native integer.
func beToHost(v uint64) uint64 {
	var b [8]byte
	*(*uint64)(unsafe.Pointer(&b[0])) = v
	var r uint64
	for _, x := range b {
		r = r<<8 | uint64(x)
	}
	return r
}

func (d *device) sysfs(parts ...string) string {
	return filepath.Join(append([]string{"/sys/class/infiniband", d.name}, parts...)...)
}

func (d *device) numaNode() int {
	b, err := os.ReadFile(d.sysfs("device", "numa_node"))
	if err != nil {
		return -1
	}
	n, err := strconv.Atoi(strings.TrimSpace(string(b)))
	if err != nil || n < 0 {
		return -1
	}
	return n
}

// gidType reads the GID's type from sysfs ("IB/RoCE v1" or "RoCE v2");
// an unused entry has none.
func (d *device) gidType(hw int) string {
	b, err := os.ReadFile(d.sysfs("ports", strconv.Itoa(int(d.port)), "gid_attrs", "types", strconv.Itoa(hw)))
	if err != nil {
		return ""
	}
	return strings.TrimSpace(string(b))
}

func (d *device) hwGID(hw int) (verbs.GID, error) {
	var g C.union_ibv_gid
	if rc := C.ibv_query_gid(d.ctx, d.port, C.int(hw), &g); rc != 0 {
		return verbs.GID{}, wrap(fmt.Sprintf("%s: query GID %d", d.name, hw), errnoOf(int(rc), nil), false)
	}
	var out verbs.GID
	copy(out[:], C.GoBytes(unsafe.Pointer(&g), 16))
	return out, nil
}

func (d *device) selectGID(cfg Config, roce bool) (int, error) {
	if cfg.GIDIndex != nil {
		i := *cfg.GIDIndex
		if i < 0 || i >= d.gidLen {
			return 0, fmt.Errorf("ibv: GID index %d out of range: port %d of %s has %d entries: %w", i, int(d.port), d.name, d.gidLen, verbs.ErrInvalid)
		}
		g, err := d.hwGID(i)
		if err != nil {
			return 0, err
		}
		if g == (verbs.GID{}) {
			return 0, fmt.Errorf("ibv: GID index %d of port %d of %s is empty: %w", i, int(d.port), d.name, verbs.ErrInvalid)
		}
		return i, nil
	}
	if !roce {
		return 0, nil
	}
	// Prefer an IPv4-mapped RoCE v2 GID, then a global IPv6 one, then any.
	best, bestRank := -1, 0
	var seen []string
	for i := 0; i < d.gidLen; i++ {
		typ := d.gidType(i)
		if typ == "" {
			continue
		}
		g, err := d.hwGID(i)
		if err != nil || g == (verbs.GID{}) {
			continue
		}
		seen = append(seen, fmt.Sprintf("%d=%v (%s)", i, g, typ))
		if typ != "RoCE v2" {
			continue
		}
		rank := 1
		switch a := g.Addr(); {
		case a.Is4():
			rank = 3
		case !a.IsLinkLocalUnicast():
			rank = 2
		}
		if rank > bestRank {
			best, bestRank = i, rank
		}
	}
	if best < 0 {
		return 0, fmt.Errorf("ibv: port %d of %s has no RoCE v2 GID (is an IP address set on its netdev?); GIDs: %s",
			int(d.port), d.name, strings.Join(seen, ", "))
	}
	return best, nil
}

// hw maps a verbs GID index to the hardware one: the selected entry and
// entry 0 trade places.
func (d *device) hw(i int) int {
	switch i {
	case 0:
		return d.gidSel
	case d.gidSel:
		return 0
	}
	return i
}

func (d *device) Attr() verbs.DeviceAttr { return d.attr }

func (d *device) GID(index int) (verbs.GID, error) {
	if err := d.closed("GID"); err != nil {
		return verbs.GID{}, err
	}
	if index < 0 || index >= d.gidLen {
		return verbs.GID{}, fmt.Errorf("ibv: %s: GID index %d out of range: the table has %d entries: %w", d.name, index, d.gidLen, verbs.ErrInvalid)
	}
	return d.hwGID(d.hw(index))
}

// PortState queries the port now. A device that was hot-unplugged fails
// the query (EIO or ENODEV, which the error keeps); the lock keeps Close
// from freeing the context under the query.
func (d *device) PortState() (verbs.PortState, error) {
	d.life.mu.Lock()
	defer d.life.mu.Unlock()
	if d.life.dead.Load() {
		return 0, fmt.Errorf("ibv: port state of %s: %w", d.name, verbs.ErrClosed)
	}
	var pa C.struct_ibv_port_attr
	if rc := C.rv_query_port(d.ctx, d.port, &pa); rc != 0 {
		return 0, wrap(fmt.Sprintf("query port %d of %s", int(d.port), d.name), errnoOf(int(rc), nil), false)
	}
	switch pa.state {
	case C.IBV_PORT_NOP:
		return verbs.PortStateNOP, nil
	case C.IBV_PORT_DOWN:
		return verbs.PortStateDown, nil
	case C.IBV_PORT_INIT:
		return verbs.PortStateInit, nil
	case C.IBV_PORT_ARMED:
		return verbs.PortStateArmed, nil
	case C.IBV_PORT_ACTIVE:
		return verbs.PortStateActive, nil
	case C.IBV_PORT_ACTIVE_DEFER:
		return verbs.PortStateActiveDefer, nil
	}
	return 0, fmt.Errorf("ibv: query port %d of %s: unknown state %d", int(d.port), d.name, int(pa.state))
}

func (d *device) Close() error {
	return d.life.close("device "+d.name, func() error {
		if rc := C.ibv_close_device(d.ctx); rc != 0 {
			return wrap("close device "+d.name, errnoOf(int(rc), nil), false)
		}
		return nil
	})
}

var errForeign = errors.New("object of another verbs backend")
