package soft

import (
	"errors"
	"fmt"
	"net/netip"

	"github.com/rdmavisor/rdmavisor/internal/verbs/soft/wire"
)

// OpenUDP opens a device named "soft-<bind>" on a UDP wire bound to
// bind:port, as the node agent runs it. Closing the device closes the wire.
func OpenUDP(bind string, port int) (*Device, error) {
	if bind == "" {
		return nil, errors.New("soft: no bind address: set soft.bindAddress, --node-ip or NODE_IP")
	}
	addr, err := netip.ParseAddr(bind)
	if err != nil {
		return nil, fmt.Errorf("soft: bind address: %w", err)
	}
	w, err := wire.ListenUDP(wire.UDPConfig{Addr: addr, Port: uint16(port)})
	if err != nil {
		return nil, fmt.Errorf("soft: open device on %s: %w", addr, err)
	}
	dev, err := Open(Config{Name: "soft-" + addr.String(), Wire: w})
	if err != nil {
		_ = w.Close()
		return nil, fmt.Errorf("soft: open device on %s: %w", addr, err)
	}
	return dev, nil
}
