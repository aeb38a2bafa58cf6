package engine

import (
	"context"
	crand "crypto/rand"
	"encoding/binary"
	"fmt"
	"math/rand/v2"
	"sync/atomic"
	"time"

	"github.com/rdmavisor/rdmavisor/internal/engine/reliable"
	"github.com/rdmavisor/rdmavisor/internal/transport"
	"github.com/rdmavisor/rdmavisor/internal/verbs"
	"github.com/rdmavisor/rdmavisor/internal/vqpn"
)

// The shared QPs between this engine and a peer: the ones this engine
// creates and sends on (connected on first use, through the control
// plane), and the ones the peer creates toward it (AcceptQP), on which
// messages arrive.

// QPRequest asks a peer engine to create a QP connected to ours.
type QPRequest struct {
	GID  verbs.GID    // the requesting engine
	Type verbs.QPType // RC or UC
	QPN  uint32
	PSN  uint32
	MTU  verbs.MTU
	// UDQPNs are the requesting engine's UD QPs, one per poller.
	UDQPNs []uint32
	// Index of the QP in the requester's pool of Type: a request for an
	// index replaces the QP the previous one made there, which failed.
	Index int
	// Epoch names the requester's side of the connection (Peer.Epoch).
	Epoch uint64
	// Pool is the size of the requester's pools (its QPsPerPeer): its
	// vconn of vQPN v sends on the QPs of index v mod Pool, so this
	// engine knows which of the peer's QPs may carry that vconn's
	// messages and its one-sided requests.
	Pool int
	// LID is the requester's port LID on InfiniBand (0 on RoCE): the
	// acceptor's QP routes to it without a GRH.
	LID uint16
	// Resends: the requester numbers its RC vconns' data chunks and marks
	// those it sends again on a replacement QP (repair.go). An older
	// engine numbers nothing: its chunks are taken as they come.
	Resends bool
	// ResendsAuto: it numbers its Auto vconns' RC data chunks as well
	// (format.Header.Chunk) and marks those it sends again. An engine
	// with Resends alone numbers only RC vconns' chunks.
	ResendsAuto bool
}

// maxIndex bounds QPRequest.Index and Pool: a peer's QPsPerPeer.
const maxIndex = transport.MaxQPsPerPeer

// ingressSlot names a QP a peer made toward us by its place in the peer's
// pools.
type ingressSlot struct {
	t verbs.QPType
	i int
}

// ingressQP is what the receive path finds by the QPN a message arrived
// on: the peer that made the QP toward us, and the QP's index in its pool.
type ingressQP struct {
	peer  *Peer
	index int
	// secret is what every message on the QP must carry
	// (format.Authentic): drawn here, given to the peer only in the
	// reply to its ConnectQP, over the control plane.
	secret uint64
	// poller is the index of the poller whose CQ the QP completes on:
	// its replacement's too, so that a vconn's chunks, those resent
	// after the replacement included, reach one poller in order.
	poller int
}

// QPReply is the peer's side of the new connection.
type QPReply struct {
	QPN    uint32
	PSN    uint32
	UDQPNs []uint32
	Epoch  uint64 // the acceptor's side of the connection (Peer.Epoch)
	// Secret is the new QP pair's: the requester stamps it on every
	// message it sends on the QP, and the acceptor drops what arrives
	// there without it (format.Authentic). UDSecret is the same for the
	// requester's datagrams to the acceptor's UD QPs. Both are random,
	// drawn by the acceptor, never zero, and travel only in this reply:
	// a host that spoofs the requester's address on the fabric does not
	// know them.
	Secret   uint64
	UDSecret uint64
	// LID is the acceptor's port LID on InfiniBand, as QPRequest.LID.
	LID uint16
	// Resends: the acceptor drops the marked resends it has had already
	// (QPRequest.Resends); only then are vconns carried over to a QP
	// that replaces a failed one toward it.
	Resends bool
	// ResendsAuto: it does so for Auto vconns' RC chunks too
	// (QPRequest.ResendsAuto): only then are Auto vconns carried, and
	// their chunks numbered at all (an engine without it refuses a header
	// with bytes 2..3 set).
	ResendsAuto bool
}

// newSecret draws a QP pair's secret: 64 random bits, never zero (the
// value no pair has).
func newSecret() uint64 {
	var b [8]byte
	for {
		_, _ = crand.Read(b[:]) // never fails (crypto/rand)
		if s := binary.BigEndian.Uint64(b[:]); s != 0 {
			return s
		}
	}
}

// PeerLink is the control plane toward one peer engine: the agents' gRPC
// in production, a direct call in tests.
type PeerLink interface {
	// ConnectQP has the peer engine create an RC or UC QP connected to
	// req and return its end and secrets, as Engine.AcceptQP does. The
	// reply must come from the peer itself, on a channel no one else
	// reads: it carries the secrets (the agents' mutual TLS).
	ConnectQP(ctx context.Context, req QPRequest) (QPReply, error)
}

// LocalLink reaches an engine in the same process.
type LocalLink struct{ To *Engine }

// ConnectQP calls AcceptQP on the peer engine.
func (l LocalLink) ConnectQP(_ context.Context, req QPRequest) (QPReply, error) {
	return l.To.AcceptQP(req)
}

// sendQP is an RC QP this engine posts on. Its batch and outstanding count
// belong to its poller.
type sendQP struct {
	// qp is the device's QP; a replacement (repair.go) swaps it, on the
	// poller, under peer.mu (which retire and destroy hold to reach it).
	qp          verbs.QP
	peer        *Peer
	p           *poller
	batch       []verbs.SendWR // poller-owned
	outstanding int            // poller-owned: posted, not completed
	queued      bool           // poller-owned: on the poller's dirty list
	runq        []*VConn       // poller-owned: vconns with work, from runHead on

	// backlog counts the messages in the rings of the vconns that send on
	// this QP; blocking senders wait while it is at maxBacklog (throttle),
	// and unthrottled is closed when it falls to half.
	backlog     atomic.Int32
	maxBacklog  int32
	throttled   atomic.Bool   // a sender waits on unthrottled
	unthrottled chan struct{} // guarded by p.inbox.mu
	runHead     int
	active      bool // poller-owned: on the poller's active list
	failed      bool // guarded by peer.mu
	// secret is the QP pair's, which the peer drew (QPReply.Secret):
	// every message posted here carries it. Set before the QP is shared.
	secret uint64
	// path is a UC QP's loss and round-trip estimate, and which way
	// Auto's small messages take (reliable.Path). Poller-owned.
	path reliable.Path

	// Replacement (repair.go). typ and index are where the QP sits in
	// its peer's pools (set at creation). progress: a send completed on
	// the device's QP now in place; repair, the replacement under way;
	// replaced, how many were made since since: poller-owned. next is the
	// replacement connected and not yet in place, guarded by peer.mu.
	typ      verbs.QPType
	index    int
	progress bool
	repair   *qpRepair
	replaced int
	since    time.Time
	next     verbs.QP
}

// newQP creates an RC QP on the SRQ, or a UC QP on the datagram SRQ.
func (e *Engine) newQP(t verbs.QPType, cq verbs.CQ) (verbs.QP, error) {
	srq := e.srq
	if t == verbs.QPTypeUC {
		srq = e.dsrq
	}
	return e.pd.CreateQP(&verbs.QPInitAttr{
		Type: t, SendCQ: cq, RecvCQ: cq, SRQ: srq,
		Cap: verbs.QPCap{MaxSendWR: uint32(e.cfg.SQDepth), MaxSendSGE: verbs.MaxSGE, MaxRecvSGE: 1}, // a gathered bundle
	})
}

// pathOptions are a QP's attributes. Only RC QPs allow remote access: the
// engine's one-sided operations travel on them alone. A UC QP takes a
// message's first packet whatever its PSN and drops a bad key silently
// (no NAK on UC), so one that allowed RDMA WRITE would let a host that
// spoofs the peer's address try keys freely, and write to a region
// exported without a window (whose MR key holds on every QP) with no PSN
// at all.
func (e *Engine) pathOptions(t verbs.QPType, psn uint32) verbs.PathOptions {
	access := verbs.AccessRemoteWrite | verbs.AccessRemoteRead
	if t == verbs.QPTypeUC {
		access = 0
	}
	return verbs.PathOptions{
		MTU:       e.cfg.MTU,
		Access:    access,
		SQPSN:     psn,
		LinkLayer: e.ll,
		// Retry for about two seconds before declaring the path dead:
		// 7 retries of 4.096 µs × 2^16 ≈ 268 ms. The agents' heartbeats
		// notice a dead node sooner; this only has to outlast a
		// descheduled peer.
		Timeout:  16,
		RetryCnt: 7,
		RNRRetry: 7,
	}
}

// sendQP returns the RC QP of index i, creating and connecting it on first
// use.
func (p *Peer) sendQP(ctx context.Context, i int) (*sendQP, error) {
	return p.connected(ctx, verbs.QPTypeRC, i)
}

// ucQP returns the UC QP of index i (on the same poller as RC QP i).
func (p *Peer) ucQP(ctx context.Context, i int) (*sendQP, error) {
	return p.connected(ctx, verbs.QPTypeUC, i)
}

func (p *Peer) table(t verbs.QPType) []*sendQP {
	if t == verbs.QPTypeUC {
		return p.ucs
	}
	return p.qps
}

func (p *Peer) connected(ctx context.Context, t verbs.QPType, i int) (*sendQP, error) {
	p.mu.Lock()
	q, err, link := p.table(t)[i], p.err, p.ctl
	p.mu.Unlock()
	if err != nil {
		return nil, err
	}
	if q != nil {
		return q, nil
	}
	setup := &p.setup[i]
	if t == verbs.QPTypeUC {
		setup = &p.setup[len(p.qps)+i]
	}
	setup.Lock()
	defer setup.Unlock()
	p.mu.Lock()
	q = p.table(t)[i]
	p.mu.Unlock()
	if q != nil {
		return q, nil
	}
	poller := p.e.pollers[i%len(p.e.pollers)]
	qp, reply, err := p.dial(ctx, t, i, poller, link)
	if err != nil {
		return nil, err
	}
	e := p.e
	// A send queue's worth waiting behind the send queue: enough to
	// refill it between rounds, few enough to stay in cache.
	q = &sendQP{qp: qp, peer: p, p: poller, maxBacklog: int32(p.e.cfg.SQDepth), secret: reply.Secret, typ: t, index: i}
	q.path.Policy = e.pathPolicy
	poller.sendQPs.Store(qp.QPN(), q)
	p.mu.Lock()
	if p.err != nil {
		err := p.err
		p.mu.Unlock()
		poller.sendQPs.Delete(qp.QPN())
		_ = qp.Close()
		return nil, err
	}
	p.table(t)[i] = q
	p.adopt(&reply)
	p.mu.Unlock()
	e.log.V(1).Info("Connected QP to peer", "peer", p.gid, "type", t, "index", i, "qpn", qp.QPN(), "remoteQPN", reply.QPN)
	return q, nil
}

// dial creates a QP of type t on poller's CQ and has the peer connect one
// to it for index i of its pools, over link; it returns the QP, connected,
// and the peer's reply.
func (p *Peer) dial(ctx context.Context, t verbs.QPType, i int, poller *poller, link PeerLink) (verbs.QP, QPReply, error) {
	if link == nil {
		return nil, QPReply{}, fmt.Errorf("engine: peer %v: no control-plane link", p.gid)
	}
	e := p.e
	qp, err := e.newQP(t, poller.cq)
	if err != nil {
		return nil, QPReply{}, fmt.Errorf("engine: QP to peer %v: %w", p.gid, err)
	}
	psn := rand.Uint32() & (1<<24 - 1)
	reply, err := link.ConnectQP(ctx, QPRequest{GID: e.gid, Type: t, QPN: qp.QPN(), PSN: psn, MTU: e.cfg.MTU, UDQPNs: e.UDQPNs(), Index: i, Epoch: p.epoch, Pool: e.cfg.QPsPerPeer, LID: e.lid, Resends: true, ResendsAuto: true})
	switch {
	case err != nil:
		err = fmt.Errorf("engine: connect QP to peer %v: %w", p.gid, err)
	case !p.observeEpoch(reply.Epoch, true):
		err = fmt.Errorf("engine: connect QP to peer %v: %w", p.gid, p.Err())
	case reply.Secret == 0 || reply.UDSecret == 0:
		// Messages without one would all be dropped as forged.
		err = fmt.Errorf("engine: connect QP to peer %v: %w: reply without a secret", p.gid, verbs.ErrInvalid)
	default:
		if err = verbs.ConnectQP(qp, verbs.Remote{GID: p.gid, QPN: reply.QPN, PSN: reply.PSN, LID: reply.LID}, e.pathOptions(t, psn)); err != nil {
			err = fmt.Errorf("engine: connect QP to peer %v: %w", p.gid, err)
		}
	}
	if err != nil {
		_ = qp.Close()
		return nil, QPReply{}, err
	}
	return qp, reply, nil
}

// adopt takes what a QP reply says of the peer's datagram side; p.mu held.
func (p *Peer) adopt(reply *QPReply) {
	if len(reply.UDQPNs) > 0 {
		p.udQPNs = reply.UDQPNs
	}
	p.udSecretOut = reply.UDSecret
	p.lid.Store(uint32(reply.LID))
	p.dedups.Store(reply.Resends)
	p.dedupsAuto.Store(reply.ResendsAuto)
}

// AcceptQP creates the receiving end of a peer's RC or UC QP: a QP on the
// shared SRQ (the datagram SRQ for UC), connected to req, and returns its
// end, with a fresh secret for the pair and the peer's datagram secret.
func (e *Engine) AcceptQP(req QPRequest) (QPReply, error) {
	if e.closed.Load() {
		return QPReply{}, ErrEngineClosed
	}
	if req.Type == 0 {
		req.Type = verbs.QPTypeRC
	}
	if req.MTU.Bytes() == 0 || req.QPN == 0 || req.QPN >= 1<<24 || req.PSN >= 1<<24 ||
		req.Type != verbs.QPTypeRC && req.Type != verbs.QPTypeUC || len(req.UDQPNs) > 64 ||
		req.Pool < 1 || req.Pool > maxIndex || req.Index < 0 || req.Index >= req.Pool {
		return QPReply{}, fmt.Errorf("engine: accept QP from %v: %w: bad request %+v", req.GID, verbs.ErrInvalid, req)
	}
	p, err := e.Peer(req.GID, nil)
	if err != nil {
		return QPReply{}, err
	}
	if !p.observeEpoch(req.Epoch, true) {
		// The peer's side is new: ours, failed now, gives way to a new
		// one, which this QP joins.
		if p, err = e.Peer(req.GID, nil); err != nil {
			return QPReply{}, err
		}
		p.observeEpoch(req.Epoch, true)
	}
	slot := ingressSlot{req.Type, req.Index}
	p.mu.Lock()
	pi := len(p.ingress) % len(e.pollers)
	old := p.ingress[slot]
	perr := p.err
	p.mu.Unlock()
	if perr != nil {
		return QPReply{}, perr
	}
	if old != nil {
		// A replacement for a QP that failed on the peer's side: on the
		// old one's poller, which reads the old one's last messages
		// before any of the new one's (the peer resends on the new one
		// what the old one may have delivered: recv.go's inOrder).
		if v, ok := e.ingress.Load(old.QPN()); ok {
			pi = v.(*ingressQP).poller
		}
	}
	poller := e.pollers[pi]
	qp, err := e.newQP(req.Type, poller.cq)
	if err != nil {
		return QPReply{}, fmt.Errorf("engine: accept QP from %v: %w", req.GID, err)
	}
	psn := rand.Uint32() & (1<<24 - 1)
	opt := e.pathOptions(req.Type, psn)
	opt.MTU = min(req.MTU, e.cfg.MTU)
	if err := verbs.ConnectQP(qp, verbs.Remote{GID: req.GID, QPN: req.QPN, PSN: req.PSN, LID: req.LID}, opt); err != nil {
		_ = qp.Close()
		return QPReply{}, fmt.Errorf("engine: accept QP from %v: %w", req.GID, err)
	}
	p.mu.Lock()
	// One QP per index of the peer's pools: a new one for an index
	// replaces the last (it failed on the peer's side). The one replaced
	// stops receiving now but is destroyed only when the index is
	// replaced again (or the peer goes): the messages it received may
	// still wait in its poller's CQ, and a provider may drop a destroyed
	// QP's completions (mlx5 does). So a peer holds at most three pools'
	// worth of QPs on this node, however often it asks.
	evicted := p.ingress[slot]
	if p.ingress == nil {
		p.ingress = make(map[ingressSlot]verbs.QP)
		p.evicted = make(map[ingressSlot]verbs.QP)
	}
	p.ingress[slot] = qp
	stale := p.evicted[slot]
	if evicted != nil {
		p.evicted[slot] = evicted
	}
	// A peer's pool size is its configuration: a new one (it restarted
	// with another) applies to the vconns made after it.
	p.pool.Store(int32(req.Pool))
	p.numbers.Store(req.Resends)
	p.numbersAuto.Store(req.ResendsAuto)
	if len(req.UDQPNs) > 0 {
		p.udQPNs = req.UDQPNs
	}
	p.lid.Store(uint32(req.LID))
	p.mu.Unlock()
	if evicted != nil {
		_ = evicted.Modify(&verbs.QPAttr{State: verbs.QPStateErr}, verbs.QPAttrState)
	}
	if stale != nil && stale != evicted {
		e.ingress.Delete(stale.QPN())
		_ = stale.Close()
	}
	secret := newSecret()
	e.ingress.Store(qp.QPN(), &ingressQP{peer: p, index: req.Index, secret: secret, poller: pi})
	return QPReply{QPN: qp.QPN(), PSN: psn, UDQPNs: e.UDQPNs(), Epoch: p.epoch, Secret: secret, UDSecret: p.udSecretIn, LID: e.lid, Resends: true, ResendsAuto: true}, nil
}

// ingressIndex is the index of the peer's QPs that its vconn remote sends
// on, or -1 before the peer made any QP toward us.
func (p *Peer) ingressIndex(remote vqpn.ID) int {
	n := p.pool.Load()
	if n <= 0 {
		return -1
	}
	return int(remote.VQPN()) % int(n)
}

// ingressQP returns the QP of type t the peer's vconn remote sends on
// toward us, or nil.
func (p *Peer) ingressQP(t verbs.QPType, remote vqpn.ID) verbs.QP {
	i := p.ingressIndex(remote)
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.ingress[ingressSlot{t, i}]
}

// udRoute returns the address handle, the UD QPN and the secret for a
// datagram to the peer; k spreads vconns over the peer's UD QPs.
func (p *Peer) udRoute(k int) (ah, qpn uint32, secret uint64) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.ah == nil || len(p.udQPNs) == 0 {
		return 0, 0, 0 // not routable: the post fails and the vconn with it
	}
	return p.ah.Handle(), p.udQPNs[k%len(p.udQPNs)], p.udSecretOut
}

// ensureAH creates the peer's address handle for datagrams: to its GID on
// RoCE, to its LID on InfiniBand (learnt with the RC QP a vconn connects
// first).
func (p *Peer) ensureAH() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.ah != nil {
		return nil
	}
	av, err := verbs.AddressVector(p.e.ll, verbs.Remote{GID: p.gid, LID: uint16(p.lid.Load())}, 0, 0)
	if err != nil {
		return fmt.Errorf("engine: address handle for peer %v: %w", p.gid, err)
	}
	ah, err := p.e.pd.CreateAH(&av)
	if err != nil {
		return fmt.Errorf("engine: address handle for peer %v: %w", p.gid, err)
	}
	p.ah = ah
	return nil
}

// udFailed replaces a UD QP that went to ERR (datagrams in flight are
// lost, as datagrams may be); the dead one is destroyed once drained.
func (p *poller) udFailed(q *sendQP, err error) {
	if q == p.udq.qp {
		p.e.log.Info("UD QP failed; replacing it", "qpn", q.qp.QPN(), "err", err)
		p.udq.dead = append(p.udq.dead, q)
		if err := p.openUD(); err != nil {
			p.e.log.Error(err, "Replacing the UD QP failed")
		}
	}
	for i, x := range p.udq.dead {
		if x == q && q.outstanding <= 0 {
			p.sendQPs.Delete(q.qp.QPN())
			_ = q.qp.Close()
			p.udq.dead = append(p.udq.dead[:i], p.udq.dead[i+1:]...)
			break
		}
	}
}
