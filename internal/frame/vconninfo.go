package frame

import "fmt"

// Transport is a vconn's transport as the agent reports it to the
// application. The numbers are the protocol's, not the engine's.
type Transport uint8

// Transports. TransportUnknown is what an agent that does not report one
// sends (arg2 zero): the client then assumes a reliable vconn.
const (
	TransportUnknown Transport = iota
	TransportRC
	TransportUC
	TransportUD
	TransportAuto
)

var transportNames = [...]string{"", "rc", "uc", "ud", "auto"}

func (t Transport) String() string {
	if int(t) < len(transportNames) {
		return transportNames[t]
	}
	return fmt.Sprintf("Transport(%d)", uint8(t))
}

// Reliable reports whether the transport delivers every message once,
// whole and in order (rc, auto), which a byte stream needs. UC loses
// messages; UD loses and reorders them. A transport this package does not
// know is taken as unreliable: refusing a stream is safer than corrupting
// one.
func (t Transport) Reliable() bool {
	return t == TransportUnknown || t == TransportRC || t == TransportAuto
}

// VConnInfo describes one vconn: it travels in arg2 of the OK reply to
// Dial and of Accept, as
//
//	bits  0-31  MaxMessage  the largest message this vconn carries
//	bits 32-39  Transport
//
// so that a vconn whose transport carries less than HelloInfo.MaxMessage
// (a UD datagram is one MTU) says so. Zero, as an agent that predates the
// field sends, means unknown: HelloInfo.MaxMessage and a reliable vconn.
type VConnInfo struct {
	Transport  Transport
	MaxMessage uint32
}

// Arg2 encodes the info for a frame's arg2.
func (v VConnInfo) Arg2() uint64 { return uint64(v.Transport)<<32 | uint64(v.MaxMessage) }

// VConnInfoOf decodes arg2 of a Dial reply or an Accept.
func VConnInfoOf(arg2 uint64) VConnInfo {
	return VConnInfo{Transport: Transport(arg2 >> 32), MaxMessage: uint32(arg2)}
}
