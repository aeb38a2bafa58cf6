package rdmadev

import (
	"strings"
	"testing"
)

// Every parser refuses what it cannot parse with an error, never a panic,
// and what it accepts is in its canonical form.
func FuzzParse(f *testing.F) {
	for _, s := range []string{
		"0c42:a103:0065:7a10\n", "fe80:0000:0000:0000:0e42:a1ff:fe65:7a10\n", "0000:0000:0000:0000:0000:ffff:0a00:0001",
		"4: ACTIVE\n", "1: DOWN", "0x1a\n", "0x0", "0\n", "-1\n", "1023", "Ethernet\n", "InfiniBand",
		"RoCE v2\n", "IB/RoCE v1", "0000:3b:00.0", "0000:3B:00.7", "", ":", "0x", "4:", "fe80::1",
	} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		if g, err := parseGUID(s); err == nil && (len(g) != 19 || g != strings.ToLower(strings.TrimSpace(s))) {
			t.Errorf("parseGUID(%q) = %q", s, g)
		}
		if a, err := parseGID(s); err == nil {
			if !a.Is6() {
				t.Errorf("parseGID(%q) = %v, not 16 bytes", s, a)
			}
			if back, err := parseGID(expand(a.As16())); err != nil || back != a {
				t.Errorf("parseGID(%q) = %v does not round-trip: %v, %v", s, a, back, err)
			}
		}
		if n, err := parseNUMANode(s); err == nil && (n < -1 || n > maxNUMANode) {
			t.Errorf("parseNUMANode(%q) = %d", s, n)
		}
		if st, err := parseState(s); err == nil && (st == "" || strings.ContainsAny(st, " \n")) {
			t.Errorf("parseState(%q) = %q", s, st)
		}
		_, _ = parseLID(s)
		if l, err := parseLinkLayer(s); err == nil && l != InfiniBand && l != Ethernet {
			t.Errorf("parseLinkLayer(%q) = %q", s, l)
		}
		if g, err := parseGIDType(s); err == nil && g != GIDTypeIB && g != GIDTypeRoCEv2 {
			t.Errorf("parseGIDType(%q) = %q", s, g)
		}
		if a, err := parsePCIAddress(s); err == nil && (len(a) != 12 || pciRoot("/devices/pci"+a[:7]+"/"+a) != "pci"+a[:7]) {
			t.Errorf("parsePCIAddress(%q) = %q", s, a)
		}
	})
}

// expand writes a GID as sysfs does.
func expand(b [16]byte) string {
	const hex = "0123456789abcdef"
	var sb strings.Builder
	for i := 0; i < 16; i += 2 {
		if i > 0 {
			sb.WriteByte(':')
		}
		for _, c := range b[i : i+2] {
			sb.WriteByte(hex[c>>4])
			sb.WriteByte(hex[c&15])
		}
	}
	return sb.String()
}

func TestPCIRoot(t *testing.T) {
	for path, want := range map[string]string{
		"/sys/devices/pci0000:3a/0000:3a:00.0/0000:3b:00.0": "pci0000:3a",
		"/tmp/x/devices/PCI0000:3a/0000:3b:00.0":            "",
		"/sys/devices/virtual/infiniband/rxe0":              "",
		"/sys/devices/pci0001:80/0001:80:02.0":              "pci0001:80",
	} {
		if got := pciRoot(path); got != want {
			t.Errorf("pciRoot(%s) = %q, want %q", path, got, want)
		}
	}
}
