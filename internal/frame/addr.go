package frame

import (
	"fmt"
	"net"
	"strconv"
)

// SplitAddr parses a vconn address, "host:port" with a port of 1..65535,
// as both ends of the pod protocol read it: the SDK before it asks the
// agent (Listen's host may be empty), the agent when it serves a Dial. The
// host is not interpreted here.
func SplitAddr(addr string) (host string, port uint16, err error) {
	h, p, err := net.SplitHostPort(addr)
	if err != nil {
		return "", 0, fmt.Errorf("address %q: want host:port: %w", addr, err)
	}
	n, err := strconv.ParseUint(p, 10, 16)
	if err != nil || n == 0 {
		return "", 0, fmt.Errorf("address %q: port %q: want 1..65535", addr, p)
	}
	return h, uint16(n), nil
}
