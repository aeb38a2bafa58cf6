package wire

import (
	"errors"
	"fmt"
	"net"

	"github.com/rdmavisor/rdmavisor/internal/verbs"
)

// MaxPacketLen is the largest packet a wire carries: a 4096-byte MTU payload
// plus the largest RoCEv2 header stack (BTH, RETH, ImmDt, ICRC), with room to
// spare. Longer packets are dropped on Send and counted in
// Stats.DropOversize. Receive buffers of this length never truncate.
const MaxPacketLen = 4096 + 256

// Packet is one datagram in a caller-owned buffer.
//
// Send transmits Buf[:N] to Addr. Recv fills Buf[:len(Buf)] (the length,
// not the capacity, bounds what fits), sets N to the datagram's length and
// Addr to the sender's GID; it never reslices Buf. A datagram longer than
// len(Buf) is dropped and counted in Stats.DropTruncated, never returned cut.
type Packet struct {
	Buf  []byte
	N    int
	Addr verbs.GID // Send: destination; Recv: source
	// Port is, on Recv, the source UDP port, which the ICRC covers; 0 where
	// the wire has none (the in-memory fabric: every device sends from the
	// network's port). Send ignores it: packets leave from the wire's port.
	Port uint16
}

// Wire moves packets between devices. Send and Recv are safe for concurrent
// use; each serialises with itself, so one receive goroutine per wire is the
// intended use.
//
// Close rules: Close unblocks a Recv blocked on the wire, which then returns
// an error that errors.Is(err, net.ErrClosed); Send and Recv after Close
// return such an error; Close is idempotent (a second Close returns nil).
type Wire interface {
	// LocalGID is the address other devices send to to reach this one.
	LocalGID() verbs.GID
	// Send transmits a batch and returns how many packets it consumed: all
	// of them unless it returns an error. The buffers are the caller's
	// again when it returns. A lost packet is not an error (it is a
	// network): it is counted in Stats. An error means the wire is closed
	// or broken.
	Send(pkts []Packet) (int, error)
	// Recv blocks until at least one packet arrives and fills up to
	// len(pkts) of them; it returns how many. After Close, or once closed
	// while blocked, it returns 0 and an error that
	// errors.Is(err, net.ErrClosed).
	Recv(pkts []Packet) (int, error)
	Close() error
	// Stats returns the wire's counters.
	Stats() Stats
}

// ErrGIDInUse is returned by Fabric.Attach for a GID already attached.
var ErrGIDInUse = errors.New("wire: GID already attached")

// errClosed is returned by every operation on a closed wire.
var errClosed = fmt.Errorf("wire: %w", net.ErrClosed)
