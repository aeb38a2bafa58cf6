package vconn_test

import (
	"net"
	"strconv"
	"testing"

	"github.com/rdmavisor/rdmavisor/pkg/vconn"
)

// FuzzSplitAddr: Dial's and Listen's addresses parse as host:port with a
// port of 1..65535, or are refused; what parses joins back the same.
func FuzzSplitAddr(f *testing.F) {
	for _, s := range []string{"10.244.1.5:7000", "[fd00::1]:80", ":7000", "echo.default.svc:7000",
		"10.0.0.1", "a:0", "a:65536", "[::1%eth0]:1", "a:b:c", "", "x:-1", "x:07"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, addr string) {
		host, port, err := vconn.SplitAddr(addr)
		if err != nil {
			return
		}
		if port == 0 {
			t.Fatalf("%q: port 0", addr)
		}
		h2, p2, err := vconn.SplitAddr(net.JoinHostPort(host, strconv.Itoa(int(port))))
		if err != nil || h2 != host || p2 != port {
			t.Fatalf("%q: rejoined parses as %q %d, %v", addr, h2, p2, err)
		}
	})
}
