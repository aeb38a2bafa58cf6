package agent

import (
	"context"
	"errors"
	"fmt"
)

// errLimit: a request would take an allocation past one of its limits
// (config.Limits); the application gets frame.CodeLimit.
var errLimit = errors.New("allocation limit reached")

// held is what an allocation holds against its limits; guarded by
// allocation.mu.
type held struct {
	listeners   int
	regions     int
	regionBytes int64
	// rxBytes: received messages the agent took from the engine and has
	// not yet handed to the pod (written into its socket or pushed into
	// its RX ring). txBytes: payloads of the pod's operations accepted
	// and not yet done (a Send's until the engine copied it into a send
	// buffer). Each is at most limits.queuedBytes.
	rxBytes, txBytes int64
	rxFreed          chan struct{} // closed when rxBytes shrinks; nil if no one waits
}

// claimListener counts a listener against the allocation's limit.
func (al *allocation) claimListener() error {
	lim := al.a.cfg.Limits.Listeners
	al.mu.Lock()
	defer al.mu.Unlock()
	if al.held.listeners >= lim {
		return fmt.Errorf("listen: allocation %s already listens on %d ports (limits.listeners): %w", al.id, lim, errLimit)
	}
	al.held.listeners++
	return nil
}

func (al *allocation) releaseListener() {
	al.mu.Lock()
	al.held.listeners--
	al.mu.Unlock()
}

// claimRegion counts an exported region of size bytes against the
// allocation's limits, until releaseRegion: once its memory is
// deregistered, which a withdrawn region's is only when the peer
// confirmed it stopped using it, and an ended vconn's after the engine's
// grace. Counting to the unexport instead let a pod whose peer never
// confirmed (its send ring stalled) register without bound.
func (al *allocation) claimRegion(size int64) error {
	l := al.a.cfg.Limits
	al.mu.Lock()
	defer al.mu.Unlock()
	switch {
	case al.held.regions >= l.Regions:
		return fmt.Errorf("export: allocation %s already has %d regions registered, withdrawn ones until the peer confirmed (limits.regions): %w", al.id, l.Regions, errLimit)
	case size > l.RegionBytes-al.held.regionBytes:
		return fmt.Errorf("export %d bytes: allocation %s has %d of its %d bytes of regions registered, withdrawn ones until the peer confirmed (limits.regionBytes): %w",
			size, al.id, al.held.regionBytes, l.RegionBytes, errLimit)
	}
	if err := al.a.registered.claim(al, "export", size, l.RegisteredBytes); err != nil {
		return err
	}
	al.held.regions++
	al.held.regionBytes += size
	return nil
}

// releaseRegion gives back a region claimRegion counted; the engine calls
// it (Export's released), on whichever goroutine deregistered the memory.
func (al *allocation) releaseRegion(size int64) {
	al.mu.Lock()
	al.held.regions--
	al.held.regionBytes -= size
	al.mu.Unlock()
	al.a.registered.release(al, size)
}

// claimStaging counts a vconn's staging memory (frame.OpStage) of size
// bytes against limits.regionBytes, until releaseStaging: it is
// registered memory as a region's is, but no region (limits.regions).
func (al *allocation) claimStaging(size int64) error {
	l := al.a.cfg.Limits
	al.mu.Lock()
	defer al.mu.Unlock()
	if size > l.RegionBytes-al.held.regionBytes {
		return fmt.Errorf("stage %d bytes: allocation %s has %d of its %d bytes of regions and staging memory registered (limits.regionBytes): %w",
			size, al.id, al.held.regionBytes, l.RegionBytes, errLimit)
	}
	if err := al.a.registered.claim(al, "stage", size, l.RegisteredBytes); err != nil {
		return err
	}
	al.held.regionBytes += size
	return nil
}

// releaseStaging gives back what claimStaging counted, once the memory is
// deregistered (Stage's released).
func (al *allocation) releaseStaging(size int64) {
	al.mu.Lock()
	al.held.regionBytes -= size
	al.mu.Unlock()
	al.a.registered.release(al, size)
}

// Queued bytes (limits.queuedBytes). Where a message waits in the agent on
// behalf of an allocation, and what bounds it:
//
//   - In the engine's receive queue of each vconn, until the agent takes
//     it (Recv): engine memory, bounded per vconn by the receive credits
//     the engine granted (SECURITY.md), and not counted here. A message
//     holds its credit until Release, so a message left there, or taken
//     and not yet released, stops the peer's sender once its credits are
//     spent.
//   - Taken by the vconn's pump (socket) or serveRX (shared memory) on
//     its way to the pod: at most one per vconn, until the socket write
//     or the ring push returns and the message is released. Counted in
//     rxBytes. What the kernel's socket buffer and the RX ring hold
//     after that is bounded by their fixed sizes per session and vconn.
//   - Sent by the pod over the socket: each operation's payload is copied
//     out of the socket, and waits in the vconn's queue (at most
//     SendWindow operations) and then in the engine's Send, which blocks
//     while the peer grants no credit. Counted in txBytes from the copy
//     to the operation's end. A shared-memory vconn's sends are copied
//     from its TX ring straight into the engine's send buffers: nothing
//     waits in the agent's memory.
//
// The two directions are bounded apart because they are enforced apart,
// and a wait of one on the other could deadlock: a received message that
// does not fit waits (claimRx) until the pod takes others, while sends
// wait for the peer's credits, which may be this same pod's receiving
// vconn (a loopback dial).

// claimRx counts n received bytes against the allocation, waiting while
// they would take it past limits.queuedBytes: the caller holds the
// engine's message, unreleased, meanwhile, so its receive credit stops
// the peer's sender and no message is dropped. Only the allocation's own
// deliveries wait. A message larger than the limit (which validation
// forbids: it is at least the largest message the agent hands over) is
// admitted alone. The error is ctx's: the vconn ended.
func (al *allocation) claimRx(ctx context.Context, n int64) error {
	lim := al.a.cfg.Limits.QueuedBytes
	for {
		al.mu.Lock()
		if al.held.rxBytes+n <= lim || al.held.rxBytes == 0 {
			al.held.rxBytes += n
			al.mu.Unlock()
			return nil
		}
		if al.held.rxFreed == nil {
			al.held.rxFreed = make(chan struct{})
		}
		freed := al.held.rxFreed
		al.mu.Unlock()
		select {
		case <-freed:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}

// releaseRx returns n bytes claimed by claimRx: the message was handed to
// the pod, or dropped with its vconn.
func (al *allocation) releaseRx(n int64) {
	al.mu.Lock()
	al.held.rxBytes -= n
	if al.held.rxFreed != nil {
		close(al.held.rxFreed)
		al.held.rxFreed = nil
	}
	al.mu.Unlock()
}

// claimTx counts the payload of an operation the pod sent against the
// allocation. Past limits.queuedBytes the operation fails with the limit
// code at once, as one past the vconn's send window fails with the window
// code, rather than waiting: the reader that copies payloads out of the
// socket also serves the session's grants and closes, so it must not
// wait, and a wait there could be for this same pod's grant (see above).
// The vconn then refuses its later sends too (vconnHandle.txRefused):
// the client pipelines sends, so those made before it learned would
// otherwise go on past a hole.
func (al *allocation) claimTx(op fmt.Stringer, n int64) error {
	lim := al.a.cfg.Limits.QueuedBytes
	al.mu.Lock()
	defer al.mu.Unlock()
	if n > lim-al.held.txBytes {
		return fmt.Errorf("%v of %d bytes: allocation %s has %d of its %d bytes of sends queued (limits.queuedBytes): %w",
			op, n, al.id, al.held.txBytes, lim, errLimit)
	}
	al.held.txBytes += n
	return nil
}

func (al *allocation) releaseTx(n int64) {
	al.mu.Lock()
	al.held.txBytes -= n
	al.mu.Unlock()
}

// queued reports the allocation's queued bytes, received and sent.
func (al *allocation) queued() (rx, tx int64) {
	al.mu.Lock()
	defer al.mu.Unlock()
	return al.held.rxBytes, al.held.txBytes
}
