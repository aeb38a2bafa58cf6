package vconn

import (
	"fmt"

	"github.com/rdmavisor/rdmavisor/internal/transport"
)

// Transport is how a vconn's messages travel, as the agent reports it when
// the vconn opens (the RDMAService's transport policy).
type Transport string

// Transports. A vconn from an agent that does not report its transport
// has TransportUnknown and is taken to be reliable.
const (
	TransportUnknown Transport = ""
	// TransportRC: reliable connected QPs; every message, in order.
	TransportRC Transport = "rc"
	// TransportUC: unreliable connected QPs; in order, but a lost
	// message is lost whole.
	TransportUC Transport = "uc"
	// TransportUD: datagrams of at most one MTU; may be lost or
	// reordered.
	TransportUD Transport = "ud"
	// TransportAuto: reliable and ordered like rc, small messages sent as
	// datagrams with the agent's own acknowledgements.
	TransportAuto Transport = "auto"
)

// Reliable reports whether the transport delivers every message once,
// whole and in order: what Read and Write, a byte stream, need. One this
// package does not know is taken as unreliable.
func (t Transport) Reliable() bool {
	if t == TransportUnknown {
		return true
	}
	k, err := transport.Parse(string(t))
	return err == nil && k.Reliable()
}

// Transport is the vconn's transport: the agent's transport.Kind, spelled
// as the RDMAService spells it (one this package does not know reads
// "Transport(n)").
func (c *Conn) Transport() Transport { return Transport(c.info.Transport.String()) }

// MaxMessage is the largest message SendMsg takes on this vconn: what its
// transport carries (on ud, one MTU less the agent's header; on uc, one
// receive buffer) within what the agent's socket carries.
func (c *Conn) MaxMessage() int {
	if c.info.MaxMessage != 0 {
		return int(c.info.MaxMessage)
	}
	return int(c.s.info.MaxMessage) // an agent that does not say per vconn
}

// streamable refuses Read and Write on a vconn that may lose messages: a
// byte stream with a hole in it is corrupt without anyone knowing, so it is
// refused up front, with ErrNotStream.
func (c *Conn) streamable() error {
	if tr := c.info.Transport; !tr.Reliable() {
		return &Error{Code: CodeNotStream, Message: fmt.Sprintf("the vconn's transport, %s, can lose messages: a byte stream (Read, Write) needs rc or auto; use SendMsg and RecvMsg", tr)}
	}
	return nil
}
