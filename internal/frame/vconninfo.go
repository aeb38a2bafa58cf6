package frame

import "github.com/rdmavisor/rdmavisor/internal/transport"

// VConnInfo describes one vconn: it travels in arg2 of the OK reply to
// Dial and of Accept, as
//
//	bits  0-31  MaxMessage  the largest message this vconn carries
//	bits 32-39  Transport   a transport.Kind: 1 rc, 2 uc, 3 ud, 4 auto
//
// so that a vconn whose transport carries less than HelloInfo.MaxMessage
// (a UD datagram is one MTU) says so. Zero, as an agent that predates the
// field sends, means unknown: HelloInfo.MaxMessage and a reliable vconn
// (transport.Unknown is reliable).
type VConnInfo struct {
	Transport  transport.Kind
	MaxMessage uint32
}

// Arg2 encodes the info for a frame's arg2.
func (v VConnInfo) Arg2() uint64 { return uint64(v.Transport)<<32 | uint64(v.MaxMessage) }

// VConnInfoOf decodes arg2 of a Dial reply or an Accept.
func VConnInfoOf(arg2 uint64) VConnInfo {
	return VConnInfo{Transport: transport.Kind(arg2 >> 32), MaxMessage: uint32(arg2)}
}
