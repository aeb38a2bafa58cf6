package rdmadev

import (
	"errors"
	"fmt"
	"net/netip"
	"strconv"
	"strings"
)

// LinkLayer is a port's link layer as sysfs names it.
type LinkLayer string

// The link layers of RDMA ports. A RoCE or iWARP port is Ethernet.
const (
	InfiniBand LinkLayer = "InfiniBand"
	Ethernet   LinkLayer = "Ethernet"
)

// parseLinkLayer parses ports/N/link_layer.
func parseLinkLayer(s string) (LinkLayer, error) {
	switch l := LinkLayer(strings.TrimSpace(s)); l {
	case InfiniBand, Ethernet:
		return l, nil
	}
	return "", fmt.Errorf("link layer %q: want InfiniBand or Ethernet", clip(s))
}

// parseState parses ports/N/state, "4: ACTIVE", into its name.
func parseState(s string) (string, error) {
	num, name, ok := strings.Cut(strings.TrimSpace(s), ": ")
	if !ok || name == "" || strings.ContainsAny(name, " \t\n") {
		return "", fmt.Errorf("port state %q: want \"N: NAME\"", clip(s))
	}
	if _, err := strconv.ParseUint(num, 10, 8); err != nil {
		return "", fmt.Errorf("port state %q: want \"N: NAME\"", clip(s))
	}
	return name, nil
}

// parseLID parses ports/N/lid, "0x1a" (an Ethernet port's is 0x0).
func parseLID(s string) (uint16, error) {
	t, ok := strings.CutPrefix(strings.TrimSpace(s), "0x")
	if !ok || t == "" {
		return 0, fmt.Errorf("LID %q: want 0x and hex digits", clip(s))
	}
	v, err := strconv.ParseUint(t, 16, 16)
	if err != nil {
		return 0, fmt.Errorf("LID %q: want 0x and at most 4 hex digits", clip(s))
	}
	return uint16(v), nil
}

// parseGID parses a GID table entry, eight colon-separated groups of four
// hex digits ("fe80:0000:...:0001"). The all-zero GID is an empty slot.
func parseGID(s string) (netip.Addr, error) {
	t := strings.TrimSpace(s)
	groups := strings.Split(t, ":")
	if len(groups) != 8 {
		return netip.Addr{}, fmt.Errorf("GID %q: want 8 groups of 4 hex digits", clip(s))
	}
	var b [16]byte
	for i, g := range groups {
		v, err := hex4(g)
		if err != nil {
			return netip.Addr{}, fmt.Errorf("GID %q: %w", clip(s), err)
		}
		b[2*i], b[2*i+1] = byte(v>>8), byte(v)
	}
	return netip.AddrFrom16(b), nil
}

// parseGUID parses node_guid, four colon-separated groups of four hex
// digits ("0002:c903:0043:a1b0"), into its canonical lower-case form.
func parseGUID(s string) (string, error) {
	t := strings.TrimSpace(s)
	groups := strings.Split(t, ":")
	if len(groups) != 4 {
		return "", fmt.Errorf("GUID %q: want 4 groups of 4 hex digits", clip(s))
	}
	for _, g := range groups {
		if _, err := hex4(g); err != nil {
			return "", fmt.Errorf("GUID %q: %w", clip(s), err)
		}
	}
	return strings.ToLower(t), nil
}

// parseNUMANode parses device/numa_node: a node number, or -1 where the
// platform does not say.
func parseNUMANode(s string) (int, error) {
	v, err := strconv.Atoi(strings.TrimSpace(s))
	if err != nil || v < -1 || v > maxNUMANode {
		return 0, fmt.Errorf("NUMA node %q: want -1 or 0..%d", clip(s), maxNUMANode)
	}
	return v, nil
}

// maxNUMANode bounds a NUMA node number (the kernel's MAX_NUMNODES is at
// most 1<<10).
const maxNUMANode = 1023

// parsePCIAddress checks a PCI address, "0000:3b:00.0" (domain, bus,
// device, function).
func parsePCIAddress(s string) (string, error) {
	bad := fmt.Errorf("PCI address %q: want DDDD:BB:DD.F in hex", clip(s))
	dom, rest, ok := strings.Cut(s, ":")
	if !ok || len(dom) != 4 || !isHex(dom) {
		return "", bad
	}
	bus, rest, ok := strings.Cut(rest, ":")
	if !ok || len(bus) != 2 || !isHex(bus) {
		return "", bad
	}
	dev, fn, ok := strings.Cut(rest, ".")
	if !ok || len(dev) != 2 || !isHex(dev) || len(fn) != 1 || fn[0] < '0' || fn[0] > '7' {
		return "", bad
	}
	return strings.ToLower(s), nil
}

// parseGIDType parses ports/N/gid_attrs/types/I: "RoCE v2", "IB/RoCE v1".
func parseGIDType(s string) (GIDType, error) {
	switch t := GIDType(strings.TrimSpace(s)); t {
	case GIDTypeIB, GIDTypeRoCEv2:
		return t, nil
	}
	return "", fmt.Errorf("GID type %q: want %q or %q", clip(s), GIDTypeIB, GIDTypeRoCEv2)
}

var errHex4 = errors.New("a group is not 4 hex digits")

func hex4(g string) (uint16, error) {
	if len(g) != 4 || !isHex(g) {
		return 0, errHex4
	}
	v, _ := strconv.ParseUint(g, 16, 16)
	return uint16(v), nil
}

func isHex(s string) bool {
	for i := 0; i < len(s); i++ {
		c := s[i]
		if !('0' <= c && c <= '9' || 'a' <= c && c <= 'f' || 'A' <= c && c <= 'F') {
			return false
		}
	}
	return s != ""
}

// clip keeps an error about a file short when the file is not.
func clip(s string) string {
	const n = 64
	if len(s) > n {
		return s[:n] + "..."
	}
	return s
}
