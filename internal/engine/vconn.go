package engine

import (
	"context"
	"encoding/binary"
	"fmt"
	"io"
	"runtime"
	"sync"
	"sync/atomic"
	"time"

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
	// zero value is RC, or the engine's Config.Transport when
	// UseEngineDefault is set.
	Transport Transport
	// UseEngineDefault takes Transport from the engine's configuration.
	UseEngineDefault bool
}

// VConn is a logical connection to a vconn on a peer engine.
//
// The fields a message touches come first, so that with many vconns (each
// touched about once per message, long after the last time) a message
// costs few cache lines on each side: the first line holds what Send
// uses, the second what else the receive path and the poller's serve use,
// then come the ring's entries; the rest is cold. (Which line a field is in is
// checked by TestVConnLayout.)
type VConn struct {
	// Line 0.
	e          *Engine
	sq         *sendQP // RC: data of RC vconns, control of all
	sendMu     sync.Mutex
	state      atomic.Uint32
	limit      atomic.Uint32 // credits the peer granted, cumulative
	consumed   atomic.Uint32 // receive buffers released, cumulative
	advertised atomic.Uint32 // last credit grant sent
	window     atomic.Uint32 // credits granted beyond consumed: Credits, grown up to MaxCredits
	txSeq      uint32        // guarded by sendMu
	scheduled  atomic.Bool   // on the poller's run queue
	ring       ring          // the producer is whoever holds sendMu; the consumer the QP's poller
	tr         Transport
	finPosted  bool // poller-owned
	rtxWatched bool // poller-owned: on the poller's retransmission list

	// Line 1.
	peer      *Peer
	handler   Handler
	dq        *sendQP                 // the UC QP of a UC or Auto vconn (UD vconns use their poller's UD QP)
	regions   atomic.Pointer[regions] // one-sided state, created on first use
	id        vqpn.ID
	remote    atomic.Uint32 // the peer vconn's vqpn.ID
	sent      uint32        // poller-owned: data chunks posted
	creditDue atomic.Bool   // a credit grant should go out
	ackDue    atomic.Bool   // an Auto acknowledgement should go out
	finDue    atomic.Bool   // Close asked for a FIN after the queued data
	txWaiting atomic.Bool
	uncounted int32 // poller-owned: ring entries taken off the QP's backlog while credits ran out

	ents ringEntries

	// Cold.
	txWake     chan struct{}              // created by the producer before it sets txWaiting
	rel        atomic.Pointer[rel]        // Auto's reliability state, created on first use
	rstDue     atomic.Bool                // Abort asked for a RST
	finSent    atomic.Bool                // the FIN's send completed
	closeTimer atomic.Pointer[time.Timer] // releases a closing vconn whose peer never answers
	prev       *VConn                     // peer list; guarded by peer.mu
	next       *VConn
	asm        []byte // poller-owned: message being reassembled
	asmOff     uint32

	rxMu    sync.Mutex
	rxq     []Message     // guarded by rxMu
	rxHead  int           // guarded by rxMu
	rxN     int           // guarded by rxMu
	rxWake  chan struct{} // guarded by rxMu
	peerFin bool          // guarded by rxMu
	err     error         // guarded by rxMu: why the vconn failed
	ackWait atomic.Bool   // on a poller's delayed-acknowledgement list
	nackDue atomic.Bool   // an Auto gap report should go out (see reportGap)
	ackRecv atomic.Bool   // another poller received acknowledgements for the send side (see onAck)

	_ [20]byte // to 448 bytes, a size class of whole cache lines, so the hot lines are aligned
}

// Message is one received message. Data is valid until Release.
type Message struct {
	Data    []byte
	Imm     uint32
	HasImm  bool
	shared  bool // slot holds other messages too (a bundle's)
	vc      *VConn
	slot    uint32 // receive buffer holding Data, or noSlot
	credits uint32 // credits Release gives back (a bundle's: see dropCredit)
}

const noSlot = ^uint32(0)

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
	if tr > Auto {
		return nil, fmt.Errorf("engine: new vconn: transport %v", tr)
	}
	vc := &VConn{e: e, peer: peer, handler: o.Handler, tr: tr}
	vc.limit.Store(uint32(e.cfg.Credits))
	vc.advertised.Store(uint32(e.cfg.Credits))
	vc.window.Store(uint32(e.cfg.Credits))
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
	case UC, Auto:
		vc.dq, err = peer.ucQP(ctx, int(id.VQPN())%e.cfg.QPsPerPeer)
	case UD:
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
		vc.rxMu.Lock()
		defer vc.rxMu.Unlock()
		return vc.err
	}
	return nil
}

// Send sends one message, blocking while the vconn's queue is full (the
// peer is not reading: credits ran out) or its QP's backlog is.
func (vc *VConn) Send(ctx context.Context, data []byte) error {
	_, err := vc.send(ctx, data, 0, false, true)
	return err
}

// SendImm sends one message with an application immediate.
func (vc *VConn) SendImm(ctx context.Context, data []byte, imm uint32) error {
	_, err := vc.send(ctx, data, imm, true, true)
	return err
}

// TrySend sends one message if it fits in the vconn's queue now; it
// reports false, without error, when it does not.
func (vc *VConn) TrySend(data []byte) (bool, error) {
	return vc.send(context.Background(), data, 0, false, false)
}

// MaxMessage is the largest message the vconn's transport carries.
func (vc *VConn) MaxMessage() int {
	switch vc.tr {
	case UD:
		return vc.e.cfg.MTU.Bytes() - headerLen
	case UC:
		return vc.e.cfg.ChunkSize - headerLen
	}
	return vc.e.cfg.MaxMessage
}

// Transport is the vconn's transport policy.
func (vc *VConn) Transport() Transport { return vc.tr }

func (vc *VConn) send(ctx context.Context, data []byte, imm uint32, hasImm, block bool) (bool, error) {
	e := vc.e
	if max := vc.MaxMessage(); len(data) > max {
		return false, fmt.Errorf("engine: send %d bytes on %v vconn %v: %w (%d)", len(data), vc.tr, vc.id, ErrTooLarge, max)
	}
	if st := vc.state.Load(); st != stateOpen {
		return false, fmt.Errorf("engine: send on vconn %v: %w", vc.id, vc.stateErr())
	}
	per := e.cfg.ChunkSize - headerLen
	chunks := max(1, (len(data)+per-1)/per)
	if block {
		if err := vc.sq.throttle(ctx); err != nil {
			return false, err
		}
		if st := vc.state.Load(); st != stateOpen { // changed while throttled
			return false, fmt.Errorf("engine: send on vconn %v: %w", vc.id, vc.stateErr())
		}
		vc.sendMu.Lock()
	} else if !vc.sendMu.TryLock() {
		return false, nil
	}
	defer vc.sendMu.Unlock()
	if !block && vc.ring.free() < chunks {
		return false, nil
	}
	h := header{typ: msgData, length: uint32(len(data)), seq: vc.txSeq, imm: imm}
	if hasImm {
		h.flags |= flagImm
	}
	for i := 0; i < chunks; i++ {
		part := data[min(i*per, len(data)):min((i+1)*per, len(data))]
		h.flags &^= flagFirst | flagLast
		if i == 0 {
			h.flags |= flagFirst
		}
		if i == chunks-1 {
			h.flags |= flagLast
		}
		slot, err := vc.getBuffer(ctx, headerLen+len(part), block)
		if err != nil || slot == noSlot {
			// Nothing of this message is queued unless i > 0, which only a
			// blocking send reaches; its ctx ended, the vconn is broken.
			if i > 0 {
				vc.fail(fmt.Errorf("engine: message abandoned half-queued: %w", err))
			}
			return false, err
		}
		b := e.pool.bytes(slot)
		h.put(b)
		copy(b[headerLen:], part)
		if err := vc.waitRing(ctx, block); err != nil {
			e.pool.put(slot)
			if i > 0 {
				vc.fail(fmt.Errorf("engine: message abandoned half-queued: %w", err))
			}
			return false, err
		}
		vc.push(uint64(slot)<<32 | uint64(headerLen+len(part)))
		if chunks > 1 {
			vc.schedule()
		}
	}
	vc.txSeq++
	vc.schedule()
	return true, nil
}

// push queues a ring entry; the caller holds sendMu and checked free.
func (vc *VConn) push(ent uint64) {
	vc.ring.push(&vc.ents, ent)
	vc.sq.backlog.Add(1)
}

// getBuffer takes a send buffer for n bytes, waiting for one if the pool is
// empty and block is set. The wait ends on a buffer's return, the context,
// or (checked every 10 ms) the vconn failing.
func (vc *VConn) getBuffer(ctx context.Context, n int, block bool) (uint32, error) {
	p := vc.e.pool
	ci := p.class(n)
	for {
		if slot, ok := p.get(ci); ok {
			return slot, nil
		}
		if !block {
			return noSlot, nil
		}
		if err := vc.sendable(ctx); err != nil {
			return noSlot, err
		}
		tctx, cancel := context.WithTimeout(ctx, 10*time.Millisecond)
		p.wait(ci, tctx.Done())
		cancel()
	}
}

// waitRing waits for room in the ring.
func (vc *VConn) waitRing(ctx context.Context, block bool) error {
	for spin := 0; vc.ring.free() == 0; spin++ {
		if !block {
			return fmt.Errorf("engine: vconn %v queue full", vc.id)
		}
		if spin < ringSpins {
			// The poller is draining the ring, or about to: yielding a
			// few times costs less than parking and being woken.
			vc.schedule()
			runtime.Gosched()
			continue
		}
		if vc.txWake == nil {
			vc.txWake = make(chan struct{}, 1)
		}
		vc.txWaiting.Store(true)
		vc.schedule()
		if vc.ring.free() > 0 {
			break
		}
		if err := vc.sendable(ctx); err != nil {
			return err
		}
		select {
		case <-vc.txWake:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	return nil
}

func (vc *VConn) sendable(ctx context.Context) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	if vc.state.Load() != stateOpen {
		return fmt.Errorf("engine: vconn %v: %w", vc.id, vc.stateErr())
	}
	return nil
}

// wakeSender wakes a producer waiting for ring space.
func (vc *VConn) wakeSender() {
	// Load before Swap: the common case (nobody waits) stays a read.
	if vc.txWaiting.Load() && vc.txWaiting.Swap(false) {
		select {
		case vc.txWake <- struct{}{}:
		default:
		}
	}
}

// schedule puts the vconn on its poller's run queue.
func (vc *VConn) schedule() {
	if !vc.scheduled.Swap(true) {
		vc.sq.p.enqueue(vc)
	}
}

// grant records a credit grant from the peer, and reschedules a vconn that
// waited for it.
func (vc *VConn) grant(credit uint32) {
	if !advance(&vc.limit, credit) {
		return
	}
	if !vc.ring.empty() {
		vc.schedule()
	}
}

// advance sets a to v if v is later in serial-number order (RFC 1982, as
// grants and acknowledgements wrap), and reports whether it did.
func advance(a *atomic.Uint32, v uint32) bool {
	for {
		old := a.Load()
		if int32(v-old) <= 0 {
			return false
		}
		if a.CompareAndSwap(old, v) {
			return true
		}
	}
}

// deliver hands a received message to the handler or the receive queue.
func (vc *VConn) deliver(m Message) {
	vc.e.stats.msgsReceived.Add(1)
	if vc.handler != nil {
		vc.handler(vc, m)
		return
	}
	vc.rxMu.Lock()
	if st := vc.state.Load(); st == stateClosed || st == stateFailed {
		vc.rxMu.Unlock()
		m.Release()
		return
	}
	if vc.rxN == len(vc.rxq) {
		grown := make([]Message, max(4, 2*len(vc.rxq)))
		for i := 0; i < vc.rxN; i++ {
			grown[i] = vc.rxq[(vc.rxHead+i)%len(vc.rxq)]
		}
		vc.rxq, vc.rxHead = grown, 0
	}
	vc.rxq[(vc.rxHead+vc.rxN)%len(vc.rxq)] = m
	vc.rxN++
	w := vc.rxWake
	vc.rxMu.Unlock()
	notify(w)
}

// wakeReader wakes a Recv blocked on the vconn.
func (vc *VConn) wakeReader() {
	vc.rxMu.Lock()
	w := vc.rxWake
	vc.rxMu.Unlock()
	notify(w)
}

func notify(w chan struct{}) {
	if w != nil {
		select {
		case w <- struct{}{}:
		default:
		}
	}
}

// Recv returns the next message: io.EOF once the peer closed and every
// message before its close was received; the failure once the vconn failed.
func (vc *VConn) Recv(ctx context.Context) (Message, error) {
	for {
		vc.rxMu.Lock()
		if vc.rxN > 0 {
			m := vc.rxq[vc.rxHead]
			vc.rxq[vc.rxHead] = Message{}
			vc.rxHead = (vc.rxHead + 1) % len(vc.rxq)
			vc.rxN--
			vc.rxMu.Unlock()
			return m, nil
		}
		switch st := vc.state.Load(); {
		case st == stateFailed:
			err := vc.err
			vc.rxMu.Unlock()
			return Message{}, err
		case vc.peerFin:
			vc.rxMu.Unlock()
			return Message{}, io.EOF
		case st == stateClosing || st == stateClosed:
			vc.rxMu.Unlock()
			return Message{}, fmt.Errorf("engine: recv on vconn %v: %w", vc.id, ErrClosed)
		}
		if vc.rxWake == nil {
			vc.rxWake = make(chan struct{}, 1)
		}
		w := vc.rxWake
		vc.rxMu.Unlock()
		select {
		case <-w:
		case <-ctx.Done():
			return Message{}, ctx.Err()
		}
	}
}

// Release returns the message's buffer and its receive credits.
func (m Message) Release() {
	vc := m.vc
	if vc == nil {
		return
	}
	e := vc.e
	if m.slot == noSlot || !m.shared || e.pool.unshare(m.slot) {
		if m.slot != noSlot {
			e.pollers[0].repostRecv(m.slot)
		}
		// A bundle's credit comes back with its buffer, after the last
		// of its messages (see bundle.go).
		vc.returnCredits(m.credits)
	}
}

// dropCredit marks a message that took no receive credit (a duplicate).
// A bundle's messages keep theirs: the bundle's one credit goes with its
// buffer whichever of them is released last, and onBundle decided it.
func (m *Message) dropCredit() {
	if !m.shared {
		m.credits = 0
	}
}

func (vc *VConn) returnCredits(n uint32) {
	if n == 0 {
		return
	}
	c := vc.consumed.Add(n)
	adv := vc.advertised.Load()
	w := vc.window.Load()
	if c == adv {
		// The sender used every credit granted and the application read
		// it all: the window, not the reader, limits the vconn.
		w = vc.growWindow(w)
	}
	if c+w-adv >= w/2 && vc.state.Load() == stateOpen {
		if !vc.creditDue.Swap(true) {
			vc.schedule()
		}
	}
}

// windowBudget is the budget a vconn's window grows from: that of the
// receive buffers its messages use, the datagram SRQ's for Auto (whose
// small messages land there), the SRQ's for the rest.
func (vc *VConn) windowBudget() *atomic.Int64 {
	if vc.tr == Auto {
		return &vc.e.windowBudget[1]
	}
	return &vc.e.windowBudget[0]
}

// growWindow doubles the credit window w if MaxCredits and the engine's
// budget allow; it returns the window now. Only returnCredits grows it,
// and a grant made from it is never taken back: windows shrink only when
// their vconns end (see shrinkWindow).
func (vc *VConn) growWindow(w uint32) uint32 {
	if 2*w > uint32(vc.e.cfg.MaxCredits) || vc.state.Load() != stateOpen {
		return w
	}
	b := vc.windowBudget()
	if b.Add(-int64(w)) < 0 {
		b.Add(int64(w))
		return w
	}
	if !vc.window.CompareAndSwap(w, 2*w) {
		b.Add(int64(w)) // another release grew it first
		return vc.window.Load()
	}
	return 2 * w
}

// shrinkWindow gives a released vconn's window growth back to the budget.
func (vc *VConn) shrinkWindow() {
	if w := vc.window.Swap(uint32(vc.e.cfg.Credits)); w > uint32(vc.e.cfg.Credits) {
		vc.windowBudget().Add(int64(w) - int64(vc.e.cfg.Credits))
	}
}

// onPeerFin: the peer closed its side; data before it was delivered.
func (vc *VConn) onPeerFin() {
	vc.rxMu.Lock()
	vc.peerFin = true
	w := vc.rxWake
	vc.rxMu.Unlock()
	notify(w)
	if vc.state.Load() == stateClosing && vc.finSent.Load() {
		vc.release()
	}
}

// onFinSent: our FIN reached the peer. If the peer's FIN does not follow
// within CloseTimeout (its vconn failed, or its application never closes),
// the vQPN is released anyway, as TCP leaves FIN_WAIT_2.
func (vc *VConn) onFinSent() {
	vc.finSent.Store(true)
	vc.rxMu.Lock()
	fin := vc.peerFin
	vc.rxMu.Unlock()
	if fin {
		vc.release()
		return
	}
	t := time.AfterFunc(vc.e.cfg.CloseTimeout, vc.release)
	vc.closeTimer.Store(t)
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
				vc.dropReceived()
				vc.release()
				return nil
			}
		case stateOpen:
			if vc.state.CompareAndSwap(st, stateClosing) {
				vc.dropReceived()
				vc.finDue.Store(true)
				vc.schedule()
				return nil
			}
		default:
			return nil
		}
	}
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
	vc.dropReceived()
	vc.release()
}

func (vc *VConn) dropReceived() {
	vc.rxMu.Lock()
	msgs := make([]Message, 0, vc.rxN)
	for vc.rxN > 0 {
		msgs = append(msgs, vc.rxq[vc.rxHead])
		vc.rxq[vc.rxHead] = Message{}
		vc.rxHead = (vc.rxHead + 1) % len(vc.rxq)
		vc.rxN--
	}
	vc.rxMu.Unlock()
	for _, m := range msgs {
		m.Release()
	}
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
	if t := vc.closeTimer.Load(); t != nil {
		t.Stop()
	}
	vc.peer.unlink(vc)
	vc.releaseRegions()
	vc.releaseRel()
	vc.shrinkWindow()
	_ = vc.e.vconns.Release(vc.id)
	vc.abandonOp(fmt.Errorf("engine: vconn %v: %w", vc.id, ErrClosed))
	// The poller returns whatever is still queued to the pool.
	vc.schedule()
	vc.wakeReader()
	vc.wakeSender()
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
		vc.rxMu.Lock()
		vc.err = fmt.Errorf("engine: vconn %v: %w", vc.id, err)
		vc.rxMu.Unlock()
		if vc.state.CompareAndSwap(st, stateFailed) {
			break
		}
	}
	vc.schedule()
	vc.wakeReader()
	vc.wakeSender()
}

// Err returns why the vconn failed, or nil.
func (vc *VConn) Err() error {
	if vc.state.Load() != stateFailed {
		return nil
	}
	vc.rxMu.Lock()
	defer vc.rxMu.Unlock()
	return vc.err
}

// stampCredit writes the current grant into a queued buffer's header, and
// on an Auto vconn's data and grants the acknowledgement too; no separate
// grant is due after it.
func (vc *VConn) stampCredit(b []byte) {
	g := vc.consumed.Load() + vc.window.Load()
	binary.BigEndian.PutUint32(b[4:], g)
	// Stores only on change: an atomic store is a full barrier, which
	// waits for every store before it, cache misses included.
	if vc.advertised.Load() != g {
		vc.advertised.Store(g)
	}
	if vc.creditDue.Load() {
		vc.creditDue.Store(false) // the grant goes out with b
	}
	if t := msgType(b[0]); vc.tr == Auto && (t == msgData || t == msgCredit || t == msgBundle) {
		binary.BigEndian.PutUint32(b[20:], vc.ackValue())
		if vc.ackDue.Load() {
			vc.ackDue.Store(false)
		}
	}
}
