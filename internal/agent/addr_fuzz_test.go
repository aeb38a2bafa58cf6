package agent

import (
	"net"
	"net/netip"
	"strconv"
	"testing"
)

// FuzzDialAddr: a Dial's address parses as host:port with a port of
// 1..65535 and a host, or is refused; what parses joins back to an address
// that parses the same.
func FuzzDialAddr(f *testing.F) {
	for _, s := range []string{"10.244.1.5:7000", "[fd00::1]:80", "node-b:9", "echo.default.svc:7000",
		"10.0.0.1", ":80", "a:0", "a:65536", "[::1%eth0]:1", "a:b:c", "", "[]:1", "x:+1", "x:0x10"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, addr string) {
		host, port, err := parseDialAddr(addr)
		if err != nil {
			return
		}
		if host == "" || port == 0 || port > 65535 {
			t.Fatalf("%q parsed as host %q port %d", addr, host, port)
		}
		h2, p2, err := parseDialAddr(net.JoinHostPort(host, strconv.Itoa(int(port))))
		if err != nil || h2 != host || p2 != port {
			t.Fatalf("%q: rejoined parses as %q %d, %v", addr, h2, p2, err)
		}
	})
}

// FuzzAnnounce: an announcement's IPs are 4 or 16 bytes each, unicast, at
// most maxAnnounced; anything else is refused whole.
func FuzzAnnounce(f *testing.F) {
	f.Add([]byte{10, 244, 1, 5}, []byte(netip.MustParseAddr("fd00::1").AsSlice()), []byte{})
	f.Add([]byte{0, 0, 0, 0}, []byte{224, 0, 0, 1}, []byte{127, 0, 0, 1})
	f.Add([]byte{1, 2, 3}, []byte(netip.MustParseAddr("::ffff:10.0.0.1").AsSlice()), []byte{10, 0, 0, 1})
	f.Fuzz(func(t *testing.T, a, b, c []byte) {
		ips, err := announcedIPs([][]byte{a, b, c})
		if err != nil {
			return
		}
		if len(ips) == 0 || len(ips) > 3 {
			t.Fatalf("%d IPs from 3", len(ips))
		}
		for ip := range ips {
			if !ip.IsValid() || ip.Is4In6() || ip.IsUnspecified() || ip.IsMulticast() || ip.IsLoopback() {
				t.Fatalf("accepted %v", ip)
			}
		}
		for _, raw := range [][]byte{a, b, c} {
			if len(raw) != 4 && len(raw) != 16 {
				t.Fatalf("accepted an IP of %d bytes", len(raw))
			}
		}
	})
}

func TestAnnounceBound(t *testing.T) {
	raw := make([][]byte, maxAnnounced+1)
	for i := range raw {
		raw[i] = []byte{10, byte(i >> 16), byte(i >> 8), byte(i)}
	}
	if _, err := announcedIPs(raw); err == nil {
		t.Fatalf("an announcement of %d IPs accepted, want at most %d", len(raw), maxAnnounced)
	}
	if ips, err := announcedIPs(raw[:maxAnnounced]); err != nil || len(ips) != maxAnnounced {
		t.Fatalf("an announcement of %d IPs: %d, %v", maxAnnounced, len(ips), err)
	}
}
