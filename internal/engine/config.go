package engine

import (
	"errors"
	"fmt"
	"time"

	"github.com/go-logr/logr"

	"github.com/rdmavisor/rdmavisor/internal/engine/format"
	"github.com/rdmavisor/rdmavisor/internal/transport"
	"github.com/rdmavisor/rdmavisor/internal/verbs"
	"github.com/rdmavisor/rdmavisor/internal/vqpn"
)

// Config configures an Engine. Zero fields take the defaults noted.
type Config struct {
	Device verbs.Device
	Log    logr.Logger

	// QPsPerPeer is P, the RC QPs this engine opens to each peer (default
	// DefaultQPsPerPeer).
	QPsPerPeer int
	// Pollers is the number of polling goroutines, each with its own CQ
	// (default 1).
	Pollers int
	// MTU is the path MTU of the QPs (default: the device's active MTU).
	MTU verbs.MTU
	// MaxVConns bounds the vconns open at once (default 1<<20).
	MaxVConns int
	// MaxMessage is the largest message a vconn carries (default
	// transport.DefaultMaxMessage, 1 MiB, the agent's).
	MaxMessage int
	// RecvBuffers is the SRQ depth shared by all RC QPs (default 4096).
	RecvBuffers int
	// ChunkSize is the size of a receive buffer and so of the largest
	// SEND, header included (default DefaultChunkSize). Longer messages
	// are chunked.
	ChunkSize int
	// SendBuffers is the number of send buffers of each size class
	// (default 4096).
	SendBuffers int
	// Credits is how many receive buffers one vconn may hold at the peer
	// before the peer's application reads (default 32): its starting
	// credit window.
	Credits int
	// MaxCredits bounds a vconn's credit window (default 512, or Credits
	// when Credits is set: a window set by hand stays fixed). A window
	// grows, doubling, while its sender uses all of it and the
	// application reads everything, as TCP's receive window tunes itself:
	// a window must cover the grants' round trip at the message rate, and
	// that round trip is unknown in advance (a few µs on a NIC, tens where
	// pollers share cores). The growth beyond Credits comes from a budget
	// of half the receive buffers the vconn's messages land in, so one
	// vconn may not take more than half of them, nor all vconns together.
	MaxCredits int
	// SQDepth is the send queue of each QP (default 512).
	SQDepth int
	// Transport is the policy of vconns that take the engine's
	// (VConnOptions.UseEngineDefault; default transport.Default, auto, the
	// agent's). A vconn's own zero value, transport.Unknown, is RC.
	Transport transport.Kind
	// AutoThreshold is the largest message Auto sends as a datagram
	// (default: measured; see DefaultAutoThreshold).
	AutoThreshold int
	// DgramBuffers is the depth of the SRQ shared by the UD and UC QPs
	// (default 1024). Unreliable traffic has its own receive buffers so it
	// can never take the reliable vconns' away.
	DgramBuffers int
	// QKey is the Q_Key of the engines' UD QPs (default 0x52444d56).
	QKey uint32
	// CloseTimeout bounds how long a closed vconn waits for its peer's FIN
	// before its vQPN is released, and how long one whose FIN waits behind
	// data the peer does not read goes without a grant before it is reset
	// (default 10 s).
	CloseTimeout time.Duration
	// SpinPolls is how many empty polls a poller makes, yielding the
	// processor between them, before it parks until a completion or work
	// (default 0: it parks at once). Parking costs a goroutine wake-up,
	// about a microsecond; spinning with fewer spare CPUs than spinners
	// cost far more (see poller.run), and burns a core that other pods on
	// the node could use.
	SpinPolls int
	// MaxRegisteredBytes bounds the memory exported regions keep
	// registered, all vconns together (default 0: no bound). A region
	// counts from its export until its memory is deregistered, which may
	// be well after it was withdrawn (Region.Close) or its vconn ended:
	// the peer confirms first, or the grace ends. Staging memory
	// (VConn.Stage) counts the same way. An export or staging past it
	// fails with ErrRegisteredLimit.
	MaxRegisteredBytes int64

	// cqDepth is each poller's CQ depth: maxCQDepth, or less where the
	// device's CQs are smaller (rxe's hold 32,767).
	cqDepth int
}

// Defaults that other layers share: the agent's configuration and the
// RDMAService take these from here; the QPs per peer, the transport and
// the largest message all of them take from internal/transport, so an
// engine configured with zeros runs as a default agent's does.
const (
	DefaultQPsPerPeer = transport.DefaultQPsPerPeer
	// DefaultChunkSize is the size of a receive buffer, 16 KiB: UC's
	// largest message, and the unit the agent sizes its buffer pool in.
	DefaultChunkSize = 16 << 10
)

const (
	defaultMaxVConns    = 1 << 20
	defaultRecvBuffers  = 4096
	defaultSendBuffers  = 4096
	defaultCredits      = 32
	defaultMaxCredits   = 512
	defaultDgramBuffers = 1024
	defaultSQDepth      = 512
	defaultSpinPolls    = 0
	maxCQDepth          = 1 << 16
)

// withDefaults fills zero fields and validates the rest.
func (c Config) withDefaults() (Config, error) {
	if c.Device == nil {
		return c, errors.New("engine: config: no device")
	}
	set := func(v *int, d int) {
		if *v == 0 {
			*v = d
		}
	}
	set(&c.QPsPerPeer, DefaultQPsPerPeer)
	set(&c.Pollers, 1)
	set(&c.MaxVConns, defaultMaxVConns)
	set(&c.MaxMessage, transport.DefaultMaxMessage)
	set(&c.RecvBuffers, defaultRecvBuffers)
	set(&c.ChunkSize, DefaultChunkSize)
	set(&c.SendBuffers, defaultSendBuffers)
	if c.MaxCredits == 0 && c.Credits != 0 {
		c.MaxCredits = c.Credits // a window set by hand stays as set
	}
	set(&c.Credits, defaultCredits)
	set(&c.MaxCredits, max(c.Credits, min(defaultMaxCredits, c.RecvBuffers)))
	set(&c.SQDepth, defaultSQDepth)
	set(&c.SpinPolls, defaultSpinPolls)
	set(&c.DgramBuffers, defaultDgramBuffers)
	if c.CloseTimeout == 0 {
		c.CloseTimeout = 10 * time.Second
	}
	if c.QKey == 0 {
		c.QKey = 0x52444d56
	}
	if c.MTU == 0 {
		c.MTU = c.Device.Attr().ActiveMTU
	}
	if c.Transport == transport.Unknown {
		c.Transport = transport.Default
	}
	if c.AutoThreshold == 0 {
		c.AutoThreshold = DefaultAutoThreshold
	}
	var errs []error
	check := func(ok bool, msg string, args ...any) {
		if !ok {
			errs = append(errs, fmt.Errorf("engine: config: "+msg, args...))
		}
	}
	check(c.QPsPerPeer >= 1 && c.QPsPerPeer <= transport.MaxQPsPerPeer, "QPsPerPeer %d: want 1..%d", c.QPsPerPeer, transport.MaxQPsPerPeer)
	check(c.Pollers >= 1 && c.Pollers <= 64, "Pollers %d: want 1..64", c.Pollers)
	check(c.MaxVConns >= 1 && c.MaxVConns <= vqpn.MaxCapacity, "MaxVConns %d: want 1..%d", c.MaxVConns, vqpn.MaxCapacity)
	check(c.ChunkSize >= 256+format.HeaderLen && c.ChunkSize <= 1<<20, "ChunkSize %d: want %d..%d", c.ChunkSize, 256+format.HeaderLen, 1<<20)
	check(c.MaxMessage >= 1 && c.MaxMessage <= 1<<30, "MaxMessage %d: want 1..1 GiB", c.MaxMessage)
	check(c.RecvBuffers >= 16 && c.RecvBuffers <= 1<<20, "RecvBuffers %d: want 16..%d", c.RecvBuffers, 1<<20)
	check(c.SendBuffers >= 16 && c.SendBuffers <= 1<<22, "SendBuffers %d: want 16..%d", c.SendBuffers, 1<<22)
	check(c.Credits >= 2 && c.Credits <= c.RecvBuffers, "Credits %d: want 2..RecvBuffers (%d)", c.Credits, c.RecvBuffers)
	check(c.MaxCredits >= c.Credits && c.MaxCredits <= c.RecvBuffers, "MaxCredits %d: want Credits (%d)..RecvBuffers (%d)", c.MaxCredits, c.Credits, c.RecvBuffers)
	check(c.DgramBuffers >= 16 && c.DgramBuffers <= 1<<20, "DgramBuffers %d: want 16..%d", c.DgramBuffers, 1<<20)
	check(c.SQDepth >= 16 && c.SQDepth <= 1<<15, "SQDepth %d: want 16..32768", c.SQDepth)
	check(c.MTU.Bytes() != 0, "MTU %v is not an IB MTU", c.MTU)
	check(c.Transport <= transport.Auto, "transport %v", c.Transport)
	check(c.AutoThreshold >= 0, "AutoThreshold %d", c.AutoThreshold)
	check(c.MaxRegisteredBytes >= 0, "MaxRegisteredBytes %d: want 0 (no bound) or more", c.MaxRegisteredBytes)
	// What the device holds: a NIC refuses larger queues at creation, so
	// say which setting does not fit rather than fail there.
	a := c.Device.Attr()
	c.cqDepth = maxCQDepth
	if a.MaxCQE > 0 {
		c.cqDepth = min(c.cqDepth, a.MaxCQE)
	}
	if a.MaxSRQWR > 0 {
		check(c.RecvBuffers <= a.MaxSRQWR && c.DgramBuffers <= a.MaxSRQWR, "RecvBuffers %d, DgramBuffers %d: device %s's SRQs hold %d", c.RecvBuffers, c.DgramBuffers, a.Name, a.MaxSRQWR)
	}
	if a.MaxQPWR > 0 {
		check(c.SQDepth <= a.MaxQPWR, "SQDepth %d: device %s's QPs hold %d", c.SQDepth, a.Name, a.MaxQPWR)
	}
	check(c.sendBudget() >= c.SQDepth, "RecvBuffers %d and DgramBuffers %d leave %d of device %s's %d CQ entries for sends, under SQDepth %d",
		c.RecvBuffers, c.DgramBuffers, c.sendBudget(), a.Name, c.cqDepth, c.SQDepth)
	return c, errors.Join(errs...)
}

// sendBudget is how many sends a poller may have outstanding: its CQ holds
// every receive buffer's completion (both SRQs') and a poll batch besides.
func (c *Config) sendBudget() int { return c.cqDepth - c.RecvBuffers - c.DgramBuffers - pollBatch }

// pollBatch is the most completions one CQ poll takes.
const pollBatch = 256

// DefaultAutoThreshold is the largest message the Auto policy sends as a
// datagram (it is capped at a chunk, ChunkSize less the header, which is
// what one UC message carries); larger ones go over RC, chunked. Measured
// on the soft provider (the e5 suite; bench/results): one vconn streaming
// messages of 16 B to 4 KiB moved them at 1.05-1.4x the rate over UC as
// over RC, so every message that fits a chunk goes as a datagram.
const DefaultAutoThreshold = DefaultChunkSize - format.HeaderLen
