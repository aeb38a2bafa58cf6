package engine

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"

	"github.com/rdmavisor/rdmavisor/internal/verbs"
)

// Peer is a remote node: the RC QPs this engine sends on to reach it,
// created on first use, and the QPs it created toward us.
type Peer struct {
	e     *Engine
	gid   verbs.GID
	ctl   PeerLink // guarded by mu
	epoch uint64   // this side of the connection (Epoch)

	mu      sync.Mutex
	qps     []*sendQP                // by index, nil until first used; guarded by mu
	ucs     []*sendQP                // UC QPs, likewise; guarded by mu
	udQPNs  []uint32                 // the peer's UD QPs; guarded by mu
	ah      verbs.AH                 // address handle for datagrams to the peer; guarded by mu
	ingress map[ingressSlot]verbs.QP // the QPs it made toward us; guarded by mu
	evicted map[ingressSlot]verbs.QP // the ones those replaced, not destroyed yet (AcceptQP); guarded by mu
	err     error                    // set once the peer failed; guarded by mu
	list    *VConn                   // vconns to this peer, linked by VConn.prev/next; guarded by mu
	dead    []*sendQP                // failed QPs awaiting their last completions; guarded by mu
	remote  uint64                   // the peer's epoch for us, once known; guarded by mu
	pool    atomic.Int32             // the peer's QPRequest.Pool, once it made a QP toward us
	// numbers: the peer's engine numbers its RC chunks toward us (its
	// QPRequest.Resends); dedups: it drops the resends it has had (its
	// QPReply.Resends). Older engines do neither (repair.go). The Auto
	// ones say the same of Auto vconns' RC chunks (ResendsAuto).
	numbers     atomic.Bool
	dedups      atomic.Bool
	numbersAuto atomic.Bool
	dedupsAuto  atomic.Bool
	// lid is the peer's port LID on InfiniBand (QPRequest.LID or
	// QPReply.LID, the latest), what names its datagrams without a GRH.
	lid atomic.Uint32
	// udSecretIn is what the peer's datagrams to our UD QPs must carry
	// (drawn with the peer, given it in every QPReply); udSecretOut what
	// ours to its UD QPs carry (its QPReply.UDSecret), guarded by mu.
	udSecretIn  uint64
	udSecretOut uint64
	// setup serialises QP creation per index without holding mu across
	// the control-plane call.
	setup []sync.Mutex
}

// Peer returns the engine's peer at gid, creating it with link. A peer
// that failed is retired and replaced by a fresh one: the node came back
// (its agent restarted) and gets new QPs.
func (e *Engine) Peer(gid verbs.GID, link PeerLink) (*Peer, error) {
	if e.closed.Load() {
		return nil, ErrEngineClosed
	}
	e.peersMu.Lock()
	defer e.peersMu.Unlock()
	if p := e.peers[gid]; p != nil {
		p.mu.Lock()
		failed := p.err != nil
		if !failed && link != nil {
			p.ctl = link
		}
		p.mu.Unlock()
		if !failed {
			return p, nil
		}
		e.drop(p)
	}
	n := e.cfg.QPsPerPeer
	if e.epochs == nil {
		e.epochs = make(map[verbs.GID]uint64)
	}
	e.epochs[gid]++
	p := &Peer{e: e, gid: gid, ctl: link, epoch: e.epochs[gid], qps: make([]*sendQP, n), ucs: make([]*sendQP, n), setup: make([]sync.Mutex, 2*n),
		udSecretIn: newSecret()}
	e.peers[gid] = p
	return p, nil
}

// Forget drops the peer at gid if no vconn uses it: its node left the
// cluster. Its QPs go as a failed peer's do. It reports whether the peer
// is gone (or was never there).
func (e *Engine) Forget(gid verbs.GID, err error) bool {
	e.peersMu.Lock()
	defer e.peersMu.Unlock()
	p := e.peers[gid]
	if p == nil {
		return true
	}
	p.mu.Lock()
	busy := p.list != nil
	if !busy && p.err == nil {
		p.err = fmt.Errorf("%w: %w", ErrPeerGone, err)
	}
	p.mu.Unlock()
	if busy {
		return false
	}
	e.drop(p)
	return true
}

// Release retires p, a failed peer, once no vconn uses it, if it is still
// the engine's peer for its GID: its QPs, and the regions and credits they
// held, go now rather than when the node comes back. It reports whether p
// is gone from the engine (released now, or replaced or forgotten before).
func (e *Engine) Release(p *Peer) bool {
	e.peersMu.Lock()
	defer e.peersMu.Unlock()
	if e.peers[p.gid] != p {
		return true
	}
	p.mu.Lock()
	idle := p.err != nil && p.list == nil
	p.mu.Unlock()
	if !idle {
		return false
	}
	e.drop(p)
	return true
}

// drop takes a failed or forgotten peer out of the engine: the next Peer
// for its GID is a new one, and its QPs go (retire). With peersMu held.
func (e *Engine) drop(p *Peer) {
	delete(e.peers, p.gid)
	e.retired = append(e.retired, p)
	p.retire()
}

// GID is the peer's address.
func (p *Peer) GID() verbs.GID { return p.gid }

// Epoch names this side of the connection to the peer: 1 for the first
// Peer an engine makes for a GID, one more for each that replaces a failed
// or forgotten one. The peer learns it with every QP request and reply and
// every heartbeat, and a larger one tells it that this side dropped the QPs
// it had connected and failed its vconns: RC traffic to those QPs would
// error out in time, but UC traffic would vanish without a trace. (An
// engine that restarts counts from 1 again; its agent's new incarnation
// says so.)
func (p *Peer) Epoch() uint64 { return p.epoch }

// observeEpoch compares the epoch the peer has for us with the one this
// Peer connected with. A larger one means the peer's side is gone, and
// with it the QPs ours sends to and the vconns ours are joined to: this
// Peer fails, so that the next vconns connect afresh. A smaller one is
// news older than what we know, and 0 is no news. Only a QP request or
// reply, which joins this Peer to the peer's side, makes its epoch the one
// this Peer knows (learn): a heartbeat may speak of a side it never met. It
// reports whether this Peer is still current.
func (p *Peer) observeEpoch(epoch uint64, learn bool) bool {
	if epoch == 0 {
		return true
	}
	p.mu.Lock()
	old := p.remote
	if old == 0 && learn {
		p.remote = epoch
	}
	p.mu.Unlock()
	if old == 0 || epoch <= old {
		return true
	}
	p.e.log.Info("Peer dropped its side of the connection: failing ours", "peer", p.gid, "epoch", old, "peerEpoch", epoch)
	p.fail(fmt.Errorf("%w: it dropped its side of the connection", ErrPeerGone))
	return false
}

// PeerEpoch returns the epoch of this engine's side of the connection to
// gid (Peer.Epoch): the live Peer's or, where it failed or there is none,
// the one its replacement will have.
func (e *Engine) PeerEpoch(gid verbs.GID) uint64 {
	e.peersMu.Lock()
	defer e.peersMu.Unlock()
	if p := e.peers[gid]; p != nil && p.Err() == nil {
		return p.epoch
	}
	return e.epochs[gid] + 1
}

// ObservePeerEpoch takes news of the epoch the peer at gid has for us, from
// a heartbeat: if it is larger than the one our live side of the
// connection (if any) was joined to, ours fails (Peer.Epoch). It reports
// whether our side, if any, is still current.
func (e *Engine) ObservePeerEpoch(gid verbs.GID, epoch uint64) bool {
	e.peersMu.Lock()
	p := e.peers[gid]
	e.peersMu.Unlock()
	return p == nil || p.Err() != nil || p.observeEpoch(epoch, false)
}

// Err is why the peer failed, or nil.
func (p *Peer) Err() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.err
}

// Fail marks the peer gone: every vconn to it fails with ErrPeerGone
// wrapped in err's context, now, rather than when its QPs time out.
func (p *Peer) Fail(err error) { p.fail(fmt.Errorf("%w: %w", ErrPeerGone, err)) }

func (p *Peer) fail(err error) {
	p.mu.Lock()
	if p.err == nil {
		p.err = err
	}
	p.mu.Unlock()
	p.failWhere(func(*VConn) bool { return true }, err)
}

// failWhere fails the peer's vconns that match.
func (p *Peer) failWhere(match func(*VConn) bool, err error) {
	var victims []*VConn
	p.mu.Lock()
	for vc := p.list; vc != nil; vc = vc.next {
		if match(vc) {
			victims = append(victims, vc)
		}
	}
	p.mu.Unlock()
	for _, vc := range victims {
		vc.fail(err)
	}
}

func (p *Peer) link(vc *VConn) {
	p.mu.Lock()
	vc.next = p.list
	if p.list != nil {
		p.list.prev = vc
	}
	p.list = vc
	p.mu.Unlock()
}

func (p *Peer) unlink(vc *VConn) {
	p.mu.Lock()
	if vc.prev != nil {
		vc.prev.next = vc.next
	} else if p.list == vc {
		p.list = vc.next
	}
	if vc.next != nil {
		vc.next.prev = vc.prev
	}
	vc.prev, vc.next = nil, nil
	p.mu.Unlock()
}

// destroy closes the peer's QPs; the engine is closing and pollers stopped.
func (p *Peer) destroy() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	var errs []error
	for _, t := range [][]*sendQP{p.qps, p.ucs, p.dead} {
		for i, q := range t {
			if q == nil {
				continue
			}
			errs = append(errs, q.qp.Close())
			if q.next != nil { // a replacement never put in place
				errs = append(errs, q.next.Close())
				q.next = nil
			}
			t[i] = nil
		}
	}
	if p.ah != nil {
		errs = append(errs, p.ah.Close())
		p.ah = nil
	}
	p.dead = nil
	p.e.releaseGracedOf(p)
	for _, qp := range p.ingress {
		errs = append(errs, qp.Close())
	}
	for _, qp := range p.evicted {
		errs = append(errs, qp.Close())
	}
	p.ingress, p.evicted = nil, nil
	return errors.Join(errs...)
}

// Pair connects a new vconn on a to a new vconn on b, both engines in this
// process: what two agents do over their control plane, done directly.
func Pair(ctx context.Context, a, b *Engine, oa, ob VConnOptions) (*VConn, *VConn, error) {
	pa, err := a.Peer(b.gid, LocalLink{To: b})
	if err != nil {
		return nil, nil, err
	}
	pb, err := b.Peer(a.gid, LocalLink{To: a})
	if err != nil {
		return nil, nil, err
	}
	va, err := a.NewVConn(ctx, pa, oa)
	if err != nil {
		return nil, nil, err
	}
	vb, err := b.NewVConn(ctx, pb, ob)
	if err != nil {
		_ = va.Close()
		return nil, nil, err
	}
	if err := errors.Join(vb.Connect(va.ID()), va.Connect(vb.ID())); err != nil {
		_ = va.Close()
		_ = vb.Close()
		return nil, nil, err
	}
	return va, vb, nil
}

// retire takes a failed peer's QPs out of service: the ones this engine
// sends on go to ERR, so their outstanding work requests flush back through
// the pollers (which destroy each QP once drained); the ones the peer
// created are destroyed now (nothing is ever posted on them). Called with
// the engine's peersMu held, after the peer failed.
func (p *Peer) retire() {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, t := range [][]*sendQP{p.qps, p.ucs} {
		for i, q := range t {
			if q == nil {
				continue
			}
			t[i] = nil
			p.dead = append(p.dead, q)
			_ = q.qp.Modify(&verbs.QPAttr{State: verbs.QPStateErr}, verbs.QPAttrState)
		}
	}
	p.e.releaseGracedOf(p)
	for _, qp := range p.ingress {
		p.e.ingress.Delete(qp.QPN())
		_ = qp.Close()
	}
	for _, qp := range p.evicted {
		p.e.ingress.Delete(qp.QPN())
		_ = qp.Close()
	}
	p.ingress, p.evicted = nil, nil
}
