package engine

import (
	"context"
	"fmt"
	"sync/atomic"
	"time"

	"github.com/rdmavisor/rdmavisor/internal/engine/credit"
	"github.com/rdmavisor/rdmavisor/internal/engine/format"
	"github.com/rdmavisor/rdmavisor/internal/transport"
	"github.com/rdmavisor/rdmavisor/internal/vqpn"
)

// VConn states.
const (
	stateConnecting uint32 = iota // allocated, peer's vQPN not known yet
	stateOpen
	stateClosing // closed locally; FIN queued, waiting for the peer's
	stateClosed  // vQPN released
	stateFailed  // peer gone, QP failed or engine closed
)

// Handler receives a vconn's messages on a poller goroutine. It must not
// block, and must Release every message exactly once, soon: an unreleased
// message holds a receive credit.
type Handler func(vc *VConn, m Message)

// VConnOptions configure a vconn.
type VConnOptions struct {
	// Handler, if set, gets every message; otherwise messages queue for
	// Recv.
	Handler Handler
	// Transport is the vconn's policy; both ends must use the same. The
	// zero value (transport.Unknown) is RC, or the engine's Config.Transport when
	// UseEngineDefault is set.
	Transport transport.Kind
	// UseEngineDefault takes Transport from the engine's configuration.
	UseEngineDefault bool
}

// VConn is a logical connection to a vconn on a peer engine.
//
// Its state is split by owner, each part a type with its methods beside
// it (and its fields touched in those files alone: TestOwners): the
// sender's queue (sender, send.go), the reader's queue (reader,
// recv.go), what the poller that serves the vconn keeps (served,
// serve.go) and what the poller that receives its chunks keeps
// (reassembly, recv.go), and Auto's reliability (autoLink, auto.go). What
// stays here is shared: set once, atomic, or guarded as its comment says.
//
// The fields a message touches come first, so that with many vconns (each
// touched about once per message, long after the last time) a message
// costs few cache lines on each side: the first line holds what both the
// sender and the poller read, the second what else the receive path and
// the poller's serve use, then comes the sender's queue, its entries (two
// lines) and a line of its own that the sender and the poller each read
// once per message; the rest is cold. (Which line a field is in is
// checked by TestVConnLayout.)
type VConn struct {
	// Line 0.
	e         *Engine
	sq        *sendQP // RC: data of RC vconns, control of all
	state     atomic.Uint32
	scheduled atomic.Bool   // on the poller's run queue
	limit     credit.Limit  // credits the peer granted, cumulative
	window    credit.Window // receive buffers released, credits granted beyond them, the last grant sent
	id        vqpn.ID
	remote    atomic.Uint32 // the peer vconn's vqpn.ID
	srv       served        // the serving poller's (serve.go)
	tr        transport.Kind

	// Line 1.
	peer      *Peer
	handler   Handler
	dq        *sendQP                 // the UC QP of a UC or Auto vconn (UD vconns use their poller's UD QP)
	regions   atomic.Pointer[regions] // one-sided state, created on first use
	creditDue atomic.Bool             // a credit grant should go out
	ackDue    atomic.Bool             // an Auto acknowledgement should go out
	// taken counts the peer's messages that took a receive credit
	// (takeCredit); taken-consumed of them are held here.
	taken   credit.Taken
	finDue  atomic.Bool // Close or CloseWrite asked for a FIN after the queued data
	rstDue  atomic.Bool // Abort asked for a RST
	finSent atomic.Bool // the FIN's send completed
	// closeTimer releases a closing vconn whose peer never answers (cold,
	// but it fills the line, so that the sender's queue starts the next).
	closeTimer atomic.Pointer[time.Timer]

	// Lines 2-4.
	snd sender // the sender's queue (send.go)

	// Cold.
	prev *VConn     // peer list; guarded by peer.mu
	next *VConn     //
	auto autoLink   // Auto's reliability (auto.go)
	asm  reassembly // the receiving poller's (recv.go)
	rcv  reader     // the reader's queue (recv.go)
}

// NewVConn allocates a vconn to peer on one of its shared QPs (connecting
// the QP first if this is its first use). The vconn sends once Connect has
// told it the peer's vconn.
func (e *Engine) NewVConn(ctx context.Context, peer *Peer, o VConnOptions) (*VConn, error) {
	if e.closed.Load() {
		return nil, ErrEngineClosed
	}
	tr := o.Transport
	if o.UseEngineDefault {
		tr = e.cfg.Transport
	}
	if tr == transport.Unknown {
		tr = transport.RC
	}
	if tr > transport.Auto {
		return nil, fmt.Errorf("engine: new vconn: transport %v", tr)
	}
	vc := &VConn{e: e, peer: peer, handler: o.Handler, tr: tr}
	vc.limit.Init(uint32(e.cfg.Credits))
	vc.window.Init(uint32(e.cfg.Credits))
	id, err := e.vconns.Alloc(vc)
	if err != nil {
		return nil, fmt.Errorf("engine: new vconn to %v: %w", peer.gid, err)
	}
	vc.id = id
	// vQPNs are dense, so consecutive vconns spread over the pool.
	q, err := peer.sendQP(ctx, int(id.VQPN())%e.cfg.QPsPerPeer)
	if err != nil {
		_ = e.vconns.Release(id)
		return nil, err
	}
	vc.sq = q
	switch tr {
	case transport.UC, transport.Auto:
		vc.dq, err = peer.ucQP(ctx, int(id.VQPN())%e.cfg.QPsPerPeer)
	case transport.UD:
		err = peer.ensureAH() // the poller's UD QP carries the data
	}
	if err != nil {
		_ = e.vconns.Release(id)
		return nil, err
	}
	peer.link(vc)
	return vc, nil
}

// ID is the vconn's vQPN and generation, which the peer's vconn needs.
func (vc *VConn) ID() vqpn.ID { return vc.id }

// Peer is the node the vconn reaches.
func (vc *VConn) Peer() *Peer { return vc.peer }

// Connect records the peer vconn and opens the vconn.
func (vc *VConn) Connect(remote vqpn.ID) error {
	if !remote.Valid() {
		return fmt.Errorf("engine: connect vconn %v: invalid remote %v", vc.id, remote)
	}
	vc.remote.Store(uint32(remote))
	if !vc.state.CompareAndSwap(stateConnecting, stateOpen) {
		return fmt.Errorf("engine: connect vconn %v: %w", vc.id, vc.stateErr())
	}
	// What came before, the peer's first messages, may owe it a grant or
	// an acknowledgement, which serve held back without a remote.
	vc.schedule()
	return nil
}

// stateErr explains why the vconn cannot send.
func (vc *VConn) stateErr() error {
	switch vc.state.Load() {
	case stateConnecting:
		return ErrNotOpen
	case stateClosing, stateClosed:
		return ErrClosed
	case stateFailed:
		return vc.rcv.failure()
	}
	return nil
}

// MaxMessage is the largest message the vconn's transport carries.
func (vc *VConn) MaxMessage() int {
	switch vc.tr {
	case transport.UD:
		return vc.e.cfg.MTU.Bytes() - format.HeaderLen
	case transport.UC:
		return vc.e.cfg.ChunkSize - format.HeaderLen
	}
	return vc.e.cfg.MaxMessage
}

// Transport is the vconn's transport policy.
func (vc *VConn) Transport() transport.Kind { return vc.tr }

// onPeerFin: the peer closed its side; data before it was delivered.
func (vc *VConn) onPeerFin() {
	// The peer closed: the regions it exported to this vconn are
	// withdrawn with it. No one-sided operation starts after this (they
	// check under rg.mu), and those before it are ahead of our FIN and
	// of the confirmations, which let the peer deregister the memory now
	// rather than after our FIN and its grace (the application here may
	// not close for long).
	if rg := vc.regions.Load(); rg != nil {
		rg.mu.Lock()
		for id := range rg.remote {
			rg.unexportAcks = append(rg.unexportAcks, unexportAck{id: id, after: rg.marks})
		}
		confirm := len(rg.remote) > 0
		rg.remote = nil
		rg.mu.Unlock()
		if confirm {
			vc.schedule()
		}
	}
	if vc.finInOrder() {
		vc.peerFinished()
	}
}

// finInOrder reports whether the peer's FIN ends the stream now. Every
// message the peer sent came before it, or was lost: one half
// reassembled, or an Auto message past which later ones wait. Lost ones
// fail the vconn (ErrLost), and the peer is reset: ending with io.EOF
// would pass a stream cut short for a whole one. Where another poller
// is handing over Auto messages that came before the FIN, it ends the
// stream after them (deliverSeq). The poller that received the FIN.
func (vc *VConn) finInOrder() bool {
	// An unreliable vconn's lost chunks are its contract, not a failure.
	lost, later := vc.tr.Reliable() && vc.asm.underway(), false
	if r := vc.auto.loaded(); r != nil && !lost {
		r.rx.Lock()
		lost, later = r.rx.Fin()
		r.rx.Unlock()
	}
	if lost {
		vc.rstDue.Store(true)
		vc.fail(ErrLost)
		return false
	}
	return !later
}

// peerFinished ends the stream: Recv returns io.EOF once the queue is
// empty, and a vconn closed here and whose FIN went is released.
func (vc *VConn) peerFinished() {
	vc.rcv.finish()
	if vc.state.Load() == stateClosing && vc.finSent.Load() {
		vc.release()
	}
}

// onFinSent: our FIN reached the peer. If the peer's FIN does not follow
// within CloseTimeout (its vconn failed, or its application never closes),
// the vQPN is released anyway, as TCP leaves FIN_WAIT_2.
func (vc *VConn) onFinSent() {
	vc.finSent.Store(true)
	if vc.state.Load() == stateOpen {
		// Half-closed (CloseWrite): the vconn still receives, and
		// Close, which sees finSent, does the rest.
		return
	}
	if vc.rcv.finished() {
		vc.release()
		return
	}
	vc.armClose(vc.release)
}

// watchClose aborts a closing vconn whose FIN cannot go because the peer
// stopped granting credits for the data queued before it (the peer's
// application stopped reading, or the peer released its end): after
// CloseTimeout with data still queued and no grant since limit, the peer
// is told by a RST and the vQPN released, as Linux kills an orphaned
// socket whose peer's window stays shut. A grant re-arms it; once the
// queue is empty the FIN goes, and onFinSent's timer takes over.
func (vc *VConn) watchClose(limit uint32) {
	vc.armClose(func() {
		if vc.state.Load() != stateClosing || vc.finSent.Load() || vc.snd.empty() {
			// Nothing waits for a grant: the FIN is on its way (once
			// closed the ring only empties), bounded by its QP's
			// retries; a slow network is no reason to reset.
			return
		}
		if l := vc.limit.Load(); l != limit {
			vc.watchClose(l)
			if vc.finSent.Load() {
				// The FIN went meanwhile: the re-arm may have
				// stopped onFinSent's timer.
				vc.armClose(vc.release)
			}
			return
		}
		vc.Abort()
	})
}

// armClose runs f after CloseTimeout unless the vconn is released first.
func (vc *VConn) armClose(f func()) {
	t := time.AfterFunc(vc.e.cfg.CloseTimeout, f)
	if old := vc.closeTimer.Swap(t); old != nil {
		old.Stop()
	}
	if vc.state.Load() == stateClosed {
		t.Stop() // released meanwhile
	}
}

// Close closes the vconn: queued messages are still sent, then a FIN; the
// vQPN is released once the peer closed too (or failed). Unread messages
// are dropped.
func (vc *VConn) Close() error {
	for {
		switch st := vc.state.Load(); st {
		case stateConnecting, stateFailed:
			if vc.state.CompareAndSwap(st, stateClosing) {
				vc.rcv.drop()
				vc.release()
				return nil
			}
		case stateOpen:
			if vc.state.CompareAndSwap(st, stateClosing) {
				vc.rcv.drop()
				if vc.finSent.Load() {
					// CloseWrite's FIN went before: what onFinSent
					// left to the close.
					vc.onFinSent()
					return nil
				}
				vc.finDue.Store(true)
				vc.watchClose(vc.limit.Load())
				vc.schedule()
				return nil
			}
		default:
			return nil
		}
	}
}

// CloseWrite ends the vconn's sending side, as shutdown(SHUT_WR) does a
// TCP connection's: messages already queued are still sent, then a FIN,
// after which the peer's Recv returns io.EOF; this side goes on receiving
// until the peer closes too. Sends after it fail with ErrClosed. Close
// still ends the vconn (and releases it once the peer's FIN came).
func (vc *VConn) CloseWrite() error {
	if st := vc.state.Load(); st != stateOpen {
		return fmt.Errorf("engine: close-write of vconn %v: %w", vc.id, vc.stateErr())
	}
	vc.snd.closeWrite()
	vc.finDue.Store(true)
	vc.schedule()
	return nil
}

// Abort closes the vconn at once, like a TCP reset: queued messages are
// dropped, the peer's vconn fails with ErrReset, and the vQPN is free for
// reuse immediately; whatever is still in flight for it is dropped by the
// generation check.
func (vc *VConn) Abort() {
	if vc.state.Load() == stateClosed {
		return
	}
	if vqpn.ID(vc.remote.Load()).Valid() {
		vc.rstDue.Store(true)
	}
	vc.rcv.drop()
	vc.release()
}

// release frees the vQPN. Completions still in flight for it are dropped
// by the table's generation check.
func (vc *VConn) release() {
	for {
		st := vc.state.Load()
		if st == stateClosed {
			return
		}
		if vc.state.CompareAndSwap(st, stateClosed) {
			break
		}
	}
	// A message the poller queued after the reader's queue was last
	// drained (Abort drains it before the state changes) would hold its
	// receive buffer for good: deliver queues only while the state, read
	// under the reader's lock, is not closed, so draining after the change gets it.
	vc.rcv.drop()
	if t := vc.closeTimer.Load(); t != nil {
		t.Stop()
	}
	vc.peer.unlink(vc)
	vc.releaseRegions()
	vc.auto.dropEarly()
	vc.window.Shrink(uint32(vc.e.cfg.Credits), vc.windowBudget())
	_ = vc.e.vconns.Release(vc.id)
	vc.abandonOp(fmt.Errorf("engine: vconn %v: %w", vc.id, ErrClosed))
	// The poller returns whatever is still queued to the pool.
	vc.schedule()
	vc.rcv.wakeReader()
	vc.snd.wakeSender()
}

// fail moves the vconn to failed with err, waking its reader and sender.
func (vc *VConn) fail(err error) {
	for {
		st := vc.state.Load()
		if st == stateFailed || st == stateClosed {
			return
		}
		if st == stateClosing {
			vc.release() // closed locally; nothing left to report
			return
		}
		vc.rcv.setFailure(fmt.Errorf("engine: vconn %v: %w", vc.id, err))
		if vc.state.CompareAndSwap(st, stateFailed) {
			break
		}
	}
	vc.schedule()
	vc.rcv.wakeReader()
	vc.snd.wakeSender()
}

// Err returns why the vconn failed, or nil.
func (vc *VConn) Err() error {
	if vc.state.Load() != stateFailed {
		return nil
	}
	return vc.rcv.failure()
}

// hotLines reads the vconn's two hot cache lines (see touch), for a
// sum that nothing uses.
func (vc *VConn) hotLines() uint32 {
	x := vc.state.Load()
	if vc.creditDue.Load() {
		x++
	}
	return x
}

// served is what the poller that serves a vconn keeps of it: its fields
// are touched in serve.go alone (TestOwners).
type served struct {
	sent      uint32 // data chunks posted (credits used)
	finPosted bool   // the FIN is posted, or about to be
	rcChunks  uint16 // an Auto vconn's data chunks posted on RC, mod 2^16 (format.Header.AutoChunkNo)
}

// schedule puts the vconn on its poller's run queue, once until served.
// Any goroutine.
func (vc *VConn) schedule() {
	if !vc.scheduled.Swap(true) {
		vc.sq.p.enqueue(vc)
	}
}
