package agent

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/backoff"
	"google.golang.org/grpc/peer"

	"github.com/rdmavisor/rdmavisor/internal/agent/controlpb"
	"github.com/rdmavisor/rdmavisor/internal/engine"
	"github.com/rdmavisor/rdmavisor/internal/pki"
	"github.com/rdmavisor/rdmavisor/internal/verbs"
)

// remote is a peer agent: its gRPC client, its engine peer once known,
// and the heartbeat that watches it. A remote is a node's: under TLS,
// every answer on it must come with that node's certificate.
type remote struct {
	a      *Agent
	node   string
	addr   string
	conn   *grpc.ClientConn
	cl     controlpb.ControlClient
	cancel context.CancelFunc
	done   chan struct{}

	kick    chan struct{} // asks the announcer to run now; buffered 1
	annDone chan struct{} // closed when the announcer returned

	mu   sync.Mutex
	peer *engine.Peer // rail 0's engine peer; guarded by mu
	// rails are the engine peers of rails 1.. (index rail-1), nil until
	// used; guarded by mu. Rail i of this node talks to rail i of the
	// peer's only.
	rails       []*engine.Peer
	incarnation uint64 // last seen; guarded by mu
	// incMu makes a new incarnation and the failing of the engine peers
	// of the old one a single step for the calls that then pick a peer
	// (observe waits for it): a vconn of the new incarnation never joins
	// a peer about to fail for the old one, nor does a peer made for it
	// fail because the old one's news came late.
	incMu sync.Mutex
	// lost: the peer answered beats, then stopped; cleared by its next
	// answer. Guarded by mu.
	lost bool
	// annOK: the peer acknowledged this node's pod IPs as of annVer
	// (Agent.podsVer) in its incarnation annInc; guarded by mu.
	annOK          bool
	annVer, annInc uint64
}

// maxRemotes bounds the peer agents an agent keeps, a cluster's nodes and
// more, so callers claiming ever new nodes cannot make it hold
// connections and heartbeats without end.
const maxRemotes = 8192

// remoteFor returns node's peer agent, connecting to it at addr and
// starting its heartbeat on first use. A node has one remote whatever
// address it is claimed at: a caller's claim (Dial's) gets the one there
// is, so a peer claiming ever new ports of its address adds nothing;
// discovery's (move) replaces one at another address, which hands its
// engine peer over.
func (a *Agent) remoteFor(node, addr string, move bool) (*remote, error) {
	a.mu.Lock()
	if a.closed {
		a.mu.Unlock()
		return nil, errors.New("agent: shutting down")
	}
	old := a.remotes[node]
	if old != nil && (!move || old.addr == addr) {
		a.mu.Unlock()
		return old, nil
	}
	if old == nil && len(a.remotes) >= maxRemotes {
		a.mu.Unlock()
		return nil, fmt.Errorf("agent: peer %s at %s: already %d peer agents", node, addr, len(a.remotes))
	}
	// Reconnect within a second of a peer coming back (gRPC's default
	// backoff grows to two minutes).
	conn, err := grpc.NewClient("passthrough:///"+addr, grpc.WithTransportCredentials(a.creds),
		grpc.WithConnectParams(grpc.ConnectParams{Backoff: backoff.Config{BaseDelay: 50 * time.Millisecond, Multiplier: 1.6, Jitter: 0.2, MaxDelay: time.Second},
			MinConnectTimeout: 2 * time.Second}))
	if err != nil {
		a.mu.Unlock()
		return nil, fmt.Errorf("agent: peer %s at %s: %w", node, addr, err)
	}
	ctx, cancel := context.WithCancel(a.ctx)
	r := &remote{a: a, node: node, addr: addr, conn: conn, cl: controlpb.NewControlClient(conn), cancel: cancel, done: make(chan struct{}),
		kick: make(chan struct{}, 1), annDone: make(chan struct{})}
	a.remotes[node] = r
	go r.heartbeat(ctx)
	go r.announcer(ctx)
	a.mu.Unlock()
	if old != nil {
		old.close()
		r.adopt(old)
		a.log.Info("Peer agent moved", "peer", node, "from", old.addr, "to", addr)
	}
	return r, nil
}

// adopt takes over the engine peer and incarnation of the remote it
// replaces: the node is the same, only its address changed.
func (r *remote) adopt(old *remote) {
	old.mu.Lock()
	inc := old.incarnation
	peers := old.peersLocked()
	old.mu.Unlock()
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.incarnation == 0 {
		r.incarnation = inc
	}
	for rail, p := range peers {
		if p == nil || r.railPeer(rail) != nil || p.Err() != nil {
			continue
		}
		// The engine peer's control link moves to this connection.
		if q, err := r.a.engines[rail].Peer(p.GID(), link{r: r, gid: p.GID(), rail: rail}); err == nil {
			r.setRailPeer(rail, q)
		}
	}
}

// peersLocked returns the engine peers of every rail, by rail (nil where
// none); r.mu held.
func (r *remote) peersLocked() []*engine.Peer {
	return append([]*engine.Peer{r.peer}, r.rails...)
}

// railPeer returns rail's engine peer, or nil; r.mu held.
func (r *remote) railPeer(rail int) *engine.Peer {
	if rail == 0 {
		return r.peer
	}
	if rail-1 < len(r.rails) {
		return r.rails[rail-1]
	}
	return nil
}

// setRailPeer sets rail's engine peer; r.mu held.
func (r *remote) setRailPeer(rail int, p *engine.Peer) {
	if rail == 0 {
		r.peer = p
		return
	}
	for len(r.rails) < rail {
		r.rails = append(r.rails, nil)
	}
	r.rails[rail-1] = p
}

func (r *remote) close() {
	r.cancel()
	<-r.done
	<-r.annDone
	_ = r.conn.Close()
}

// enginePeer returns the engine's peer for this agent, learning its GID
// with Identity when the caller does not know it. The Identity reply is
// bound to the answering agent's certificate (identityOf): a node that
// answers with another's GID would have this engine route that node's
// QPs, and its heartbeat's verdicts, to itself.
//
// rail names the engine (this node's rail, paired with the peer's rail of
// the same index); gid is then the peer's GID on that rail.
func (r *remote) enginePeer(ctx context.Context, gid verbs.GID, rail int) (*engine.Peer, error) {
	eng, err := r.a.engineOf(rail)
	if err != nil {
		return nil, err
	}
	r.mu.Lock()
	p := r.railPeer(rail)
	r.mu.Unlock()
	if p != nil && p.Err() == nil {
		return p, nil
	}
	if gid == (verbs.GID{}) {
		var from peer.Peer
		rep, err := r.cl.Identity(ctx, &controlpb.IdentityRequest{Caller: r.a.self()}, grpc.Peer(&from))
		if err != nil {
			return nil, fmt.Errorf("agent: identity of peer %s at %s: %w", r.node, r.addr, err)
		}
		id, err := r.a.answerer(&from)
		if err == nil {
			gid, err = identityOf(rep, r.node, id, rail, r.a.railGIDListed)
		}
		if err == nil {
			if _, perr := negotiate(rep.GetNode()); perr != nil {
				err = errProtocol(perr)
			}
		}
		if err != nil {
			return nil, fmt.Errorf("agent: identity of peer %s at %s: %w", r.node, r.addr, err)
		}
		r.observe(rep.GetNode().GetIncarnation())
	}
	if err := r.a.bindGID(gid, r.node); err != nil {
		return nil, fmt.Errorf("agent: peer %s at %s: %w", r.node, r.addr, err)
	}
	p, err = eng.Peer(gid, link{r: r, gid: gid, rail: rail})
	if err != nil {
		return nil, err
	}
	r.mu.Lock()
	if q := r.railPeer(rail); q == nil || q.Err() != nil {
		// First use, or the peer failed (its agent restarted): the engine
		// gave a fresh peer with new QPs.
		r.setRailPeer(rail, p)
	}
	p = r.railPeer(rail)
	r.mu.Unlock()
	return p, nil
}

// observe records the peer agent's incarnation as a call from it (or its
// answer) states it. A new one means the agent restarted: the engine peer
// of the old one fails now, before a vconn is set up on QPs that lead
// nowhere, and the heartbeat, meeting the same incarnation later, does not
// fail the fresh peer made in between.
func (r *remote) observe(inc uint64) {
	if inc == 0 {
		return
	}
	// (gRPC's backoff is capped at a second (dial), so the heartbeat does
	// not wait long once the peer is up. ResetConnectBackoff would cut
	// that, but in grpc-go 1.85 it ranges over the connection's subchannel
	// map outside its lock, racing a dial that adds one: grpc-go#9155.)
	r.newIncarnation(inc)
}

// newIncarnation records inc as the peer agent's incarnation; if it
// replaces another, the engine peers of that one fail (their QPs were
// connected to the agent that is gone) before anyone sees inc: the calls
// of the new agent, which come all at once when its pods start, then
// make a fresh peer rather than joining the old one just before it fails.
// It reports whether inc was new.
func (r *remote) newIncarnation(inc uint64) bool {
	r.incMu.Lock()
	defer r.incMu.Unlock()
	r.mu.Lock()
	old := r.incarnation
	r.incarnation = inc
	r.mu.Unlock()
	if old == 0 || old == inc {
		return false
	}
	if f := beforeRestartFail.Load(); f != nil {
		(*f)()
	}
	r.fail(errRestarted)
	return true
}

// beforeRestartFail, when a test sets it, runs before a restarted peer's
// engine peers fail: a loaded node's scheduler, or the log line fail
// writes first, may stretch that moment.
var beforeRestartFail atomic.Pointer[func()]

// fail fails every vconn to the peer, on every rail.
func (r *remote) fail(err error) {
	r.mu.Lock()
	peers := r.peersLocked()
	r.mu.Unlock()
	logged := false
	for _, p := range peers {
		if p == nil {
			continue
		}
		if !logged {
			r.a.log.Info("Peer agent lost: failing its vconns", "peer", r.node, "address", r.addr, "reason", err.Error())
			logged = true
		}
		p.Fail(fmt.Errorf("agent %s at %s: %w", r.node, r.addr, err))
	}
}

// heartbeat keeps a beat stream open to the peer. A stream that breaks,
// a beat unanswered for HeartbeatTimeout or a new incarnation (the agent
// restarted) fails the peer's vconns.
func (r *remote) heartbeat(ctx context.Context) {
	defer close(r.done)
	interval, timeout := r.a.opts.HeartbeatInterval, r.a.opts.HeartbeatTimeout
	for ctx.Err() == nil {
		beating, err := r.beatOnce(ctx, interval, timeout)
		if ctx.Err() != nil {
			return
		}
		// Only a beat that was answered and stopped loses a peer (or a
		// new incarnation, which observe handles too): while a starting
		// peer is not reachable yet (its control plane not up, or gRPC
		// still backing off), vconns to it may already be set up through
		// its own calls to us, and must not be failed. That the peer has
		// called us is not enough: the attempt failing now may have begun
		// before, and failing the peer would retire the QPs it just
		// connected to us, which its UC traffic would then vanish into.
		if !beating && !errors.Is(err, errRestarted) {
			r.release()
			select {
			case <-ctx.Done():
				return
			case <-time.After(interval):
			}
			continue
		}
		if !errors.Is(err, errRestarted) {
			r.mu.Lock()
			r.lost = true
			r.mu.Unlock()
			// (A restart's peers failed when it was seen: the ones
			// there may be now are the new agent's.)
			r.fail(err)
		}
		r.release()
		select {
		case <-ctx.Done():
			return
		case <-time.After(interval):
		}
	}
}

// release gives back the engine peer of a node that was lost, once its
// applications closed the failed vconns: its QPs, regions and credits go
// now, not when the node comes back, which may be never. Until then the
// heartbeat calls it again every interval.
func (r *remote) release() {
	r.mu.Lock()
	peers := r.peersLocked()
	r.mu.Unlock()
	for rail, p := range peers {
		if p == nil || p.Err() == nil || !r.a.engines[rail].Release(p) {
			continue
		}
		r.mu.Lock()
		if r.railPeer(rail) == p {
			r.setRailPeer(rail, nil)
		}
		r.mu.Unlock()
	}
}

// errRestarted: the peer's beats carry a new incarnation.
var errRestarted = errors.New("peer agent restarted")

// beatOnce runs one heartbeat stream until it fails; beating reports
// whether the peer answered on it. The stream must come from the
// remote's node, and its answers speak for an engine peer only of a GID
// in the node's certificate: an agent at the address that is not the
// node can neither keep it alive nor fail it.
func (r *remote) beatOnce(ctx context.Context, interval, timeout time.Duration) (beating bool, _ error) {
	sctx, cancel := context.WithCancel(ctx)
	defer cancel()
	stream, err := r.cl.Heartbeat(sctx)
	if err != nil {
		return false, fmt.Errorf("heartbeat: %w", err)
	}
	from, _ := peer.FromContext(stream.Context())
	id, err := r.a.answerer(from)
	if err == nil {
		err = nodeIs(id, r.node)
	}
	if err != nil {
		return false, fmt.Errorf("heartbeat: %w", err)
	}
	var sent atomic.Uint64 // the last beat's seq
	go r.sendBeats(sctx, stream, interval, &sent)
	var timedOut bool
	var tmu sync.Mutex
	for {
		w := time.AfterFunc(timeout, func() { tmu.Lock(); timedOut = true; tmu.Unlock(); cancel() })
		b, err := stream.Recv()
		w.Stop()
		if err != nil {
			tmu.Lock()
			defer tmu.Unlock()
			if timedOut {
				return beating, fmt.Errorf("no heartbeat for %v", timeout)
			}
			return beating, fmt.Errorf("heartbeat: %w", err)
		}
		if err := beatOf(b, sent.Load()); err != nil {
			return beating, fmt.Errorf("heartbeat: %w", err)
		}
		beating = true
		restarted := r.newIncarnation(b.Incarnation)
		r.observeBeat(id, b)
		if restarted {
			return true, errRestarted
		}
	}
}

// sendBeats sends a beat every interval, numbered from 1, each number
// stored in sent first, until ctx ends or a send fails.
func (r *remote) sendBeats(ctx context.Context, stream controlpb.Control_HeartbeatClient, interval time.Duration, sent *atomic.Uint64) {
	var gid []byte
	if e := r.a.eng; e != nil {
		g := e.GID()
		gid = g[:]
	}
	var railGIDs [][]byte
	for _, e := range r.a.engines[min(1, len(r.a.engines)):] {
		g := e.GID()
		railGIDs = append(railGIDs, g[:])
	}
	t := time.NewTicker(interval)
	defer t.Stop()
	for seq := uint64(1); ; seq++ {
		sent.Store(seq)
		if stream.Send(&controlpb.Beat{Seq: seq, Incarnation: r.a.incarnation, Gid: gid, RailGids: railGIDs}) != nil {
			return
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// observeBeat marks the peer found again and tells each rail's engine the
// epoch of the peer's side of their connection, which the peer's identity
// id vouches for, from beat b.
func (r *remote) observeBeat(id *pki.Identity, b *controlpb.Beat) {
	r.mu.Lock()
	r.lost = false
	peers := r.peersLocked()
	r.mu.Unlock()
	for rail, p := range peers {
		epoch := b.PeerEpoch
		if rail > 0 {
			epoch = 0
			if rail <= len(b.RailEpochs) {
				epoch = b.RailEpochs[rail-1]
			}
		}
		if p != nil && vouchFor(id, r.node, p.GID(), rail, r.a.railGIDListed) == nil {
			// The peer's side of our connection is new: ours goes too.
			r.a.engines[rail].ObservePeerEpoch(p.GID(), epoch)
		}
	}
}

// beatOf checks a beat the peer answered: the echo of one of the beats
// sent so far (sent is the last one's seq), from an agent that has an
// incarnation. Anything else is no answer of an agent's.
func beatOf(b *controlpb.Beat, sent uint64) error {
	if b.GetSeq() == 0 || b.GetSeq() > sent {
		return fmt.Errorf("%w: beat %d answered, %d sent", errBadReply, b.GetSeq(), sent)
	}
	if b.GetIncarnation() == 0 {
		return fmt.Errorf("%w: beat without an incarnation", errBadReply)
	}
	return nil
}
