package rdmadev

import (
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
)

// ClassDir is where sysfs lists RDMA devices, under its root.
const ClassDir = "class/infiniband"

// GIDType is the type of a GID table entry as sysfs names it.
type GIDType string

// GID types. An InfiniBand port's GIDs are IB/RoCE v1 too.
const (
	GIDTypeIB     GIDType = "IB/RoCE v1"
	GIDTypeRoCEv2 GIDType = "RoCE v2"
)

// GID is a used entry of a port's GID table.
type GID struct {
	Index int
	Addr  netip.Addr
	// Type is empty where the kernel does not say.
	Type GIDType
	// NetDev is the network device a RoCE GID belongs to; empty on
	// InfiniBand.
	NetDev string
}

// Port is a port of a device.
type Port struct {
	Number    int
	LinkLayer LinkLayer
	// State is the port's state by name: ACTIVE, DOWN, INIT...
	State string
	// LID is the port's local identifier: InfiniBand addresses by it; 0
	// on Ethernet.
	LID uint16
	// GIDs are the used entries of the GID table, by index.
	GIDs []GID
}

// Transport is how the port carries RDMA: "InfiniBand" or "RoCE".
func (p Port) Transport() string {
	if p.LinkLayer == InfiniBand {
		return "InfiniBand"
	}
	return "RoCE"
}

// Device is an RDMA device.
type Device struct {
	Name string
	// NodeGUID is node_guid as sysfs writes it: "0002:c903:0043:a1b0".
	NodeGUID string
	// PCIAddress is the device's PCI function, "0000:3b:00.0"; PCIRoot
	// the root complex it hangs from, "pci0000:3a" (as DRA's standard
	// pcieRoot attribute names it). Both are empty for a software
	// device (rxe, siw).
	PCIAddress, PCIRoot string
	// NUMANode is the NUMA node the device is attached to, or -1 where
	// the platform does not say (a single-node machine, a software
	// device).
	NUMANode int
	// NetDevs are the network devices of the device's function (or the
	// parent of a software device), sorted.
	NetDevs []string
	Ports   []Port
}

// FileError is a sysfs file that does not read or parse.
type FileError struct {
	Path string
	Err  error
}

func (e *FileError) Error() string { return "rdmadev: " + e.Path + ": " + e.Err.Error() }
func (e *FileError) Unwrap() error { return e.Err }

// ErrNotFound is the error of Read for a device sysfs does not list.
var ErrNotFound = errors.New("no such RDMA device")

// Names lists the RDMA devices sysfs has under root, sorted. A machine
// without any (no RDMA module loaded) has none: not an error.
func Names(root string) ([]string, error) {
	ents, err := os.ReadDir(filepath.Join(root, ClassDir))
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("rdmadev: listing devices: %w", err)
	}
	names := make([]string, 0, len(ents))
	for _, e := range ents {
		names = append(names, e.Name())
	}
	slices.Sort(names)
	return names, nil
}

// List reads every device that names lists (Names, or NetlinkNames which
// sees only this network namespace's devices when the RDMA subsystem is
// in exclusive mode), sorted by name.
func List(root string, names func(root string) ([]string, error)) ([]Device, error) {
	ns, err := names(root)
	if err != nil {
		return nil, err
	}
	slices.Sort(ns)
	devs := make([]Device, 0, len(ns))
	for _, n := range ns {
		d, err := Read(root, n)
		if err != nil {
			return nil, err
		}
		devs = append(devs, d)
	}
	return devs, nil
}

// Read reads device name from the sysfs at root.
func Read(root, name string) (Device, error) {
	if name == "" || name == "." || name == ".." || strings.ContainsRune(name, '/') {
		return Device{}, fmt.Errorf("rdmadev: device name %q: %w", name, ErrNotFound)
	}
	dir := filepath.Join(root, ClassDir, name)
	if _, err := os.Stat(dir); err != nil {
		if errors.Is(err, fs.ErrNotExist) {
			return Device{}, fmt.Errorf("rdmadev: %s: %w", name, ErrNotFound)
		}
		return Device{}, fmt.Errorf("rdmadev: %s: %w", name, err)
	}
	d := Device{Name: name, NUMANode: -1}
	var err error
	if d.NodeGUID, err = parseFile(filepath.Join(dir, "node_guid"), parseGUID); err != nil {
		return Device{}, err
	}
	if err := readLocation(root, dir, &d); err != nil {
		return Device{}, err
	}
	if d.NetDevs, err = netDevs(dir); err != nil {
		return Device{}, err
	}
	if d.Ports, err = readPorts(filepath.Join(dir, "ports")); err != nil {
		return Device{}, err
	}
	return d, nil
}

// readLocation fills the PCI address, PCI root and NUMA node from the
// device's "device" link; a software device has none.
func readLocation(root, dir string, d *Device) error {
	link := filepath.Join(dir, "device")
	real, err := filepath.EvalSymlinks(link)
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err != nil {
		return &FileError{Path: link, Err: err}
	}
	if addr, err := parsePCIAddress(filepath.Base(real)); err == nil {
		d.PCIAddress = addr
		d.PCIRoot = pciRoot(real)
	}
	numa := filepath.Join(link, "numa_node")
	if _, err := os.Stat(numa); errors.Is(err, fs.ErrNotExist) {
		return nil // kernels without NUMA support have no such file
	}
	d.NUMANode, err = parseFile(numa, parseNUMANode)
	return err
}

// pciRoot finds the root complex, "pci0000:3a", in the resolved path of a
// PCI device: /sys/devices/pci0000:3a/0000:3a:00.0/0000:3b:00.0.
func pciRoot(path string) string {
	for _, c := range strings.Split(filepath.ToSlash(path), "/") {
		if r, ok := strings.CutPrefix(c, "pci"); ok && len(r) == 7 && r[4] == ':' && isHex(r[:4]) && isHex(r[5:]) {
			return strings.ToLower(c)
		}
	}
	return ""
}

// netDevs lists the network devices of the device's PCI function, or
// the parent network device of a software device.
func netDevs(dir string) ([]string, error) {
	ents, err := os.ReadDir(filepath.Join(dir, "device", "net"))
	if err == nil {
		out := make([]string, 0, len(ents))
		for _, e := range ents {
			out = append(out, e.Name())
		}
		slices.Sort(out)
		return out, nil
	}
	if !errors.Is(err, fs.ErrNotExist) {
		return nil, &FileError{Path: filepath.Join(dir, "device", "net"), Err: err}
	}
	parent, err := os.ReadFile(filepath.Join(dir, "parent"))
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, &FileError{Path: filepath.Join(dir, "parent"), Err: err}
	}
	if p := strings.TrimSpace(string(parent)); p != "" {
		return []string{p}, nil
	}
	return nil, nil
}

func readPorts(dir string) ([]Port, error) {
	ents, err := os.ReadDir(dir)
	if err != nil {
		return nil, &FileError{Path: dir, Err: err}
	}
	var ports []Port
	for _, e := range ents {
		n, err := strconv.Atoi(e.Name())
		if err != nil || n < 1 || n > 255 {
			return nil, &FileError{Path: filepath.Join(dir, e.Name()), Err: fmt.Errorf("port %q: want a number 1..255", clip(e.Name()))}
		}
		p, err := readPort(filepath.Join(dir, e.Name()), n)
		if err != nil {
			return nil, err
		}
		ports = append(ports, p)
	}
	slices.SortFunc(ports, func(a, b Port) int { return a.Number - b.Number })
	return ports, nil
}

func readPort(dir string, n int) (Port, error) {
	p := Port{Number: n}
	var err error
	if p.LinkLayer, err = parseFile(filepath.Join(dir, "link_layer"), parseLinkLayer); err != nil {
		return Port{}, err
	}
	if p.State, err = parseFile(filepath.Join(dir, "state"), parseState); err != nil {
		return Port{}, err
	}
	if p.LID, err = parseFile(filepath.Join(dir, "lid"), parseLID); err != nil {
		return Port{}, err
	}
	gids := filepath.Join(dir, "gids")
	ents, err := os.ReadDir(gids)
	if err != nil {
		return Port{}, &FileError{Path: gids, Err: err}
	}
	for _, e := range ents {
		i, err := strconv.Atoi(e.Name())
		if err != nil || i < 0 {
			return Port{}, &FileError{Path: filepath.Join(gids, e.Name()), Err: fmt.Errorf("GID index %q: want a number", clip(e.Name()))}
		}
		addr, err := parseFile(filepath.Join(gids, e.Name()), parseGID)
		if err != nil {
			return Port{}, err
		}
		if addr.IsUnspecified() {
			continue // an empty slot
		}
		g := GID{Index: i, Addr: addr}
		// The kernel refuses (EINVAL) to read the attributes of entries
		// it has none for: only what reads is parsed.
		if b, err := os.ReadFile(filepath.Join(dir, "gid_attrs", "types", e.Name())); err == nil {
			if g.Type, err = parseGIDType(string(b)); err != nil {
				return Port{}, &FileError{Path: filepath.Join(dir, "gid_attrs", "types", e.Name()), Err: err}
			}
		}
		if b, err := os.ReadFile(filepath.Join(dir, "gid_attrs", "ndevs", e.Name())); err == nil {
			g.NetDev = strings.TrimSpace(string(b))
		}
		p.GIDs = append(p.GIDs, g)
	}
	slices.SortFunc(p.GIDs, func(a, b GID) int { return a.Index - b.Index })
	return p, nil
}

// maxFile bounds what is read of a sysfs attribute (a page).
const maxFile = 4096

// parseFile reads a sysfs attribute and parses it; either failure is a
// *FileError.
func parseFile[T any](path string, parse func(string) (T, error)) (T, error) {
	var zero T
	f, err := os.Open(path)
	if err != nil {
		return zero, &FileError{Path: path, Err: err}
	}
	defer f.Close()
	b, err := io.ReadAll(io.LimitReader(f, maxFile+1))
	switch {
	case err != nil:
		return zero, &FileError{Path: path, Err: err}
	case len(b) == 0:
		return zero, &FileError{Path: path, Err: errors.New("empty file")}
	case len(b) > maxFile:
		return zero, &FileError{Path: path, Err: fmt.Errorf("longer than %d bytes", maxFile)}
	}
	v, err := parse(string(b))
	if err != nil {
		return zero, &FileError{Path: path, Err: err}
	}
	return v, nil
}
