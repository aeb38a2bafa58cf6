package wire

import (
	"fmt"
	"net/netip"
)

// Defaults of UDPConfig.
const (
	// RoCEv2Port is the IANA port of RoCEv2.
	RoCEv2Port = 4791
	// DefaultBatchSize is how many packets one sendmmsg or recvmmsg moves.
	DefaultBatchSize = 64
	// DefaultSocketBuffer is the SO_RCVBUF and SO_SNDBUF asked for (the
	// kernel doubles it for its bookkeeping).
	DefaultSocketBuffer = 8 << 20

	maxBatchSize = 1024 // UIO_MAXIOV: the kernel's limit on one sendmmsg
)

// UDPConfig configures a UDP wire.
type UDPConfig struct {
	// Addr is the local IP address, which is also the device's GID (an
	// IPv4 address becomes an IPv4-mapped GID). It must be a unicast
	// address of this host.
	Addr netip.Addr
	// Port is the UDP port of every device of one network, as RoCEv2 uses
	// 4791 everywhere: packets go to (destination GID, Port). Default 4791.
	Port uint16
	// BatchSize bounds the packets one system call moves (default 64, at
	// most 1024). Send takes any number; Recv returns at most this many.
	BatchSize int
	// ReadBuffer and WriteBuffer are the socket buffer sizes in bytes
	// (default DefaultSocketBuffer; negative keeps the system default). As
	// root they are forced past net.core.rmem_max/wmem_max.
	ReadBuffer, WriteBuffer int
	// NoOffload turns off UDP segmentation offload (UDP_SEGMENT: a run of
	// same-size packets to one destination leaves as one super-datagram)
	// and receive coalescing (UDP_GRO). Both are on by default where the
	// kernel has them, segmentation only on loopback addresses: elsewhere
	// the segments get numbered IPv4 IDs that the ICRC does not expect.
	NoOffload bool
}

func (c UDPConfig) withDefaults() (UDPConfig, error) {
	c.Addr = c.Addr.Unmap()
	if !c.Addr.IsValid() || c.Addr.IsUnspecified() || c.Addr.IsMulticast() {
		return c, fmt.Errorf("wire: listen udp: address %v is not a unicast address", c.Addr)
	}
	if c.Port == 0 {
		c.Port = RoCEv2Port
	}
	switch {
	case c.BatchSize <= 0:
		c.BatchSize = DefaultBatchSize
	case c.BatchSize > maxBatchSize:
		c.BatchSize = maxBatchSize
	}
	if c.ReadBuffer == 0 {
		c.ReadBuffer = DefaultSocketBuffer
	}
	if c.WriteBuffer == 0 {
		c.WriteBuffer = DefaultSocketBuffer
	}
	return c, nil
}
