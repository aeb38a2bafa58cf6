// Package transport owns the one definition of a vconn's transport (rc, uc,
// ud, auto) and of the queue-pair settings every layer shares: the engine
// runs it, the agent's configuration names it, the pod protocol carries it
// and the SDK reports it. Each of those uses Kind or converts to it in one
// place; the RDMAService API, which may not import internal packages, spells
// the same names, and a test holds the two together.
package transport

import (
	"fmt"
	"slices"
)

// Kind is a vconn's transport. Its numbers are the pod protocol's
// (frame.VConnInfo carries them as they are): append, never renumber.
type Kind uint8

// Kinds. Unknown is what an agent that does not report a transport sends,
// and what a vconn that does not choose one asks for: RC. (The transport
// of a node's vconns that take their node's policy is another default,
// Default.)
const (
	Unknown Kind = iota
	// RC: reliable, ordered, any size.
	RC
	// UC: ordered, loss-tolerant: a lost message is lost whole, never in
	// part; for data the application can afford to miss.
	UC
	// UD: datagrams of at most one MTU less the header, unreliable.
	UD
	// Auto: reliable and ordered like RC; messages of up to a chunk
	// travel as UC datagrams with the engine's own sequencing,
	// acknowledgements and retransmission, longer ones over RC.
	Auto
)

// Count is the number of Kind values, Unknown included: the length of an
// array indexed by Kind.
const Count = int(Auto) + 1

// names are the kinds as configuration, the API and the SDK spell them;
// Unknown's is empty, as an unset field is.
var names = [Count]string{Unknown: "", RC: "rc", UC: "uc", UD: "ud", Auto: "auto"}

func (k Kind) String() string {
	if int(k) < Count {
		return names[k]
	}
	return fmt.Sprintf("Transport(%d)", uint8(k))
}

// Names lists the transports one may ask for, in order: rc, uc, ud, auto.
func Names() []string { return slices.Clone(names[RC:]) }

// Parse reads "rc", "uc", "ud" or "auto".
func Parse(s string) (Kind, error) {
	for k := RC; k <= Auto; k++ {
		if names[k] == s {
			return k, nil
		}
	}
	return Unknown, fmt.Errorf("transport: unknown transport %q: want rc, uc, ud or auto", s)
}

// Reliable reports whether the transport delivers every message once,
// whole and in order (rc, auto, and Unknown, which means rc), which a byte
// stream needs. UC loses messages; UD loses and reorders them. A value
// this package does not know is taken as unreliable: refusing a stream is
// safer than corrupting one.
func (k Kind) Reliable() bool { return k == Unknown || k == RC || k == Auto }

// The product's defaults: the agent configuration's (config.Default), and
// so the RDMAService's, whose kubebuilder marker repeats the transport (a
// test compares them), and those of an engine configured with zeros.
const (
	// Default is the transport policy of a node's vconns that do not
	// choose one.
	Default = Auto
	// DefaultMaxMessage is the largest message a vconn carries, in bytes:
	// 1 MiB.
	DefaultMaxMessage = 1 << 20
)

// Queue pairs per peer: how many RC QPs (and, for auto, as many UC ones) an
// engine keeps to each peer node, which every vconn to it shares.
const (
	// DefaultQPsPerPeer is the engine's, the agent configuration's and the
	// RDMAService's default (its kubebuilder marker repeats it; a test
	// compares them).
	DefaultQPsPerPeer = 2
	// MaxQPsPerPeer bounds it everywhere: it is also the bound of the
	// index a peer may ask for when it connects a QP.
	MaxQPsPerPeer = 64
)
