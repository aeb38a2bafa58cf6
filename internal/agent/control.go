package agent

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net/netip"
	"sync"
	"sync/atomic"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/backoff"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/status"

	"github.com/rdmavisor/rdmavisor/internal/agent/controlpb"
	"github.com/rdmavisor/rdmavisor/internal/discovery"
	"github.com/rdmavisor/rdmavisor/internal/engine"
	"github.com/rdmavisor/rdmavisor/internal/pki"
	"github.com/rdmavisor/rdmavisor/internal/verbs"
	"github.com/rdmavisor/rdmavisor/internal/vqpn"
)

// Failure classes of the control plane, from the peer agent's gRPC status
// (statusError); codeOf maps them to the application protocol's codes.
var (
	errRefused     = errors.New("refused by the peer agent")   // NotFound: nothing listens
	errPeerQuota   = errors.New("peer allocation full")        // ResourceExhausted
	errUnreachable = errors.New("peer agent unreachable")      // Unavailable, DeadlineExceeded
	errPeerInvalid = errors.New("peer agent: invalid request") // InvalidArgument
)

// classified is a control-plane error with its failure class. Its
// message is the error's own: the class only answers errors.Is.
type classified struct {
	class, err error
}

func (e *classified) Error() string   { return e.err.Error() }
func (e *classified) Unwrap() []error { return []error{e.class, e.err} }

// statusError attaches the failure class of a gRPC status in err's chain;
// other errors pass unchanged. Every control-plane call whose error can
// reach an application goes through it: the client side of ConnectQP
// (link) and dialPeer.
func statusError(err error) error {
	st, ok := status.FromError(err)
	if err == nil || !ok {
		return err
	}
	var class error
	switch st.Code() {
	case codes.NotFound:
		class = errRefused
	case codes.ResourceExhausted:
		class = errPeerQuota
	case codes.Unavailable, codes.DeadlineExceeded:
		class = errUnreachable
	case codes.InvalidArgument:
		class = errPeerInvalid
	default:
		return err
	}
	return &classified{class: class, err: err}
}

// controlServer is the agent's side of the agent-to-agent gRPC service.
type controlServer struct {
	controlpb.UnimplementedControlServer
	a *Agent
}

func (a *Agent) self() *controlpb.Node {
	gid := a.eng.GID()
	return &controlpb.Node{Name: a.cfg.NodeName, ControlAddress: a.ctlAddr, Gid: gid[:], Incarnation: a.incarnation}
}

func (s *controlServer) Identity(ctx context.Context, req *controlpb.IdentityRequest) (*controlpb.IdentityReply, error) {
	c, err := claimOf(req.GetCaller())
	if err != nil {
		return nil, err
	}
	if err := s.a.authorize(ctx, c); err != nil {
		return nil, err
	}
	ec := s.a.eng.Config()
	return &controlpb.IdentityReply{Node: s.a.self(), Qkey: ec.QKey, Mtu: uint32(ec.MTU.Bytes())}, nil
}

// claimOf is what a Node message claims: all of it, its GID of 16
// bytes; nil claims nothing.
func claimOf(n *controlpb.Node) (claim, error) {
	if n == nil {
		return claim{}, nil
	}
	gid, err := gidOf(n.Gid)
	return claim{node: n.Name, address: n.ControlAddress, gid: gid, of: claimsAll}, err
}

func gidOf(b []byte) (verbs.GID, error) {
	var g verbs.GID
	if len(b) != len(g) {
		return g, status.Errorf(codes.InvalidArgument, "gid of %d bytes", len(b))
	}
	copy(g[:], b)
	return g, nil
}

func (s *controlServer) ConnectQP(ctx context.Context, req *controlpb.QPRequest) (*controlpb.QPReply, error) {
	gid, err := gidOf(req.Gid)
	if err != nil {
		return nil, err
	}
	// The QP is set up for gid's node: only that node may ask.
	if err := s.a.authorize(ctx, claim{gid: gid, of: claimsGID}); err != nil {
		return nil, err
	}
	if req.Type > 255 || req.Mtu > 255 {
		return nil, status.Error(codes.InvalidArgument, "bad QP type or MTU")
	}
	rep, err := s.a.eng.AcceptQP(engine.QPRequest{GID: gid, Type: verbs.QPType(req.Type), QPN: req.Qpn, PSN: req.Psn,
		MTU: verbs.MTU(req.Mtu), UDQPNs: req.UdQpns, Index: int(min(req.Index, 1<<16)), Epoch: req.Epoch, Pool: int(min(req.Pool, 1<<16))})
	if err != nil {
		return nil, status.Error(codes.FailedPrecondition, err.Error())
	}
	return &controlpb.QPReply{Qpn: rep.QPN, Psn: rep.PSN, UdQpns: rep.UDQPNs, Epoch: rep.Epoch}, nil
}

// Dial gives the caller's vconn a peer on a listener of this node.
func (s *controlServer) Dial(ctx context.Context, req *controlpb.DialRequest) (*controlpb.DialReply, error) {
	a := s.a
	c := req.GetCaller()
	if c == nil || req.Port == 0 || req.Port > 65535 || !vqpn.ID(req.Vconn).Valid() {
		return nil, status.Error(codes.InvalidArgument, "dial: caller, port and vconn are required")
	}
	// The caller's whole identity, its GID above all: without one, this
	// agent would learn it from the caller's Identity reply, which says
	// what the caller likes.
	cl, err := claimOf(c)
	if err != nil {
		return nil, err
	}
	if err := a.authorize(ctx, cl); err != nil {
		return nil, err
	}
	gid := cl.gid
	key, err := a.portOf(req.GetIp(), req.Port)
	if err != nil {
		return nil, err
	}
	a.mu.Lock()
	l := a.listeners[key]
	a.mu.Unlock()
	if l == nil {
		return nil, status.Errorf(codes.NotFound, "nothing listens on port %d of %s", req.Port, placeOf(req.GetIp(), a.cfg.NodeName))
	}
	if !l.sess.al.take() {
		return nil, status.Errorf(codes.ResourceExhausted, "listener on port %d: allocation %s has all its %d vconns in use", req.Port, l.sess.al.id, l.sess.al.quota)
	}
	r, err := a.remoteFor(c.Name, c.ControlAddress, false)
	if err != nil {
		l.sess.al.give()
		return nil, status.Error(codes.Unavailable, err.Error())
	}
	r.observe(c.Incarnation)
	ep, err := r.enginePeer(ctx, gid)
	if err != nil {
		l.sess.al.give()
		return nil, status.Error(codes.Unavailable, err.Error())
	}
	vc, err := a.eng.NewVConn(ctx, ep, engine.VConnOptions{UseEngineDefault: true})
	if err != nil {
		l.sess.al.give()
		return nil, status.Error(codes.Unavailable, err.Error())
	}
	if err := vc.Connect(vqpn.ID(req.Vconn)); err != nil {
		_ = vc.Close()
		l.sess.al.give()
		return nil, status.Error(codes.Internal, err.Error())
	}
	if !l.sess.accepted(l, vc, remoteOf(req.GetFromIp(), c.Name)) {
		vc.Abort()
		l.sess.al.give()
		return nil, status.Errorf(codes.NotFound, "listener on port %d closed", req.Port)
	}
	return &controlpb.DialReply{Vconn: uint32(vc.ID())}, nil
}

// Heartbeat echoes beats, stamped with this agent's incarnation.
func (s *controlServer) Heartbeat(stream grpc.BidiStreamingServer[controlpb.Beat, controlpb.Beat]) error {
	if err := s.a.authorize(stream.Context(), claim{}); err != nil {
		return err
	}
	var caller []byte // the GID authorized on this stream
	for {
		b, err := stream.Recv()
		if err != nil {
			return nil
		}
		// The answer says which side of a connection to the caller we
		// have (engine.Peer.Epoch), so that it learns when ours changed.
		var epoch uint64
		if len(b.Gid) > 0 {
			gid, err := gidOf(b.Gid)
			if err != nil {
				return err
			}
			if !bytes.Equal(b.Gid, caller) {
				if err := s.a.authorize(stream.Context(), claim{gid: gid, of: claimsGID}); err != nil {
					return err
				}
				caller = bytes.Clone(b.Gid)
			}
			epoch = s.a.eng.PeerEpoch(gid)
		}
		if err := stream.Send(&controlpb.Beat{Seq: b.Seq, Incarnation: s.a.incarnation, PeerEpoch: epoch}); err != nil {
			return nil
		}
	}
}

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

	mu          sync.Mutex
	peer        *engine.Peer // guarded by mu
	incarnation uint64       // last seen; guarded by mu
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
	p, inc := old.peer, old.incarnation
	old.mu.Unlock()
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.incarnation == 0 {
		r.incarnation = inc
	}
	if p == nil || r.peer != nil || p.Err() != nil {
		return
	}
	// The engine peer's control link moves to this connection.
	if q, err := r.a.eng.Peer(p.GID(), link{r: r, gid: p.GID()}); err == nil {
		r.peer = q
	}
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
func (r *remote) enginePeer(ctx context.Context, gid verbs.GID) (*engine.Peer, error) {
	r.mu.Lock()
	p := r.peer
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
			gid, err = identityOf(rep, r.node, id)
		}
		if err != nil {
			return nil, fmt.Errorf("agent: identity of peer %s at %s: %w", r.node, r.addr, err)
		}
		r.observe(rep.GetNode().GetIncarnation())
	}
	if err := r.a.bindGID(gid, r.node); err != nil {
		return nil, fmt.Errorf("agent: peer %s at %s: %w", r.node, r.addr, err)
	}
	p, err := r.a.eng.Peer(gid, link{r: r, gid: gid})
	if err != nil {
		return nil, err
	}
	r.mu.Lock()
	if r.peer == nil || r.peer.Err() != nil {
		// First use, or the peer failed (its agent restarted): the engine
		// gave a fresh peer with new QPs.
		r.peer = p
	}
	p = r.peer
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
	r.mu.Lock()
	old := r.incarnation
	r.incarnation = inc
	r.mu.Unlock()
	// (gRPC's backoff is capped at a second (dial), so the heartbeat does
	// not wait long once the peer is up. ResetConnectBackoff would cut
	// that, but in grpc-go 1.85 it ranges over the connection's subchannel
	// map outside its lock, racing a dial that adds one: grpc-go#9155.)
	if old != 0 && old != inc {
		r.fail(errRestarted)
	}
}

// fail fails every vconn to the peer.
func (r *remote) fail(err error) {
	r.mu.Lock()
	p := r.peer
	r.mu.Unlock()
	if p == nil {
		return
	}
	r.a.log.Info("Peer agent lost: failing its vconns", "peer", r.node, "address", r.addr, "reason", err.Error())
	p.Fail(fmt.Errorf("agent %s at %s: %w", r.node, r.addr, err))
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
		}
		r.fail(err)
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
	p := r.peer
	r.mu.Unlock()
	if p == nil || p.Err() == nil || !r.a.eng.Release(p) {
		return
	}
	r.mu.Lock()
	if r.peer == p {
		r.peer = nil
	}
	r.mu.Unlock()
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
	var gid []byte
	if e := r.a.eng; e != nil {
		g := e.GID()
		gid = g[:]
	}
	var sent atomic.Uint64 // the last beat's seq
	go func() {
		t := time.NewTicker(interval)
		defer t.Stop()
		for seq := uint64(1); ; seq++ {
			sent.Store(seq)
			if stream.Send(&controlpb.Beat{Seq: seq, Incarnation: r.a.incarnation, Gid: gid}) != nil {
				return
			}
			select {
			case <-sctx.Done():
				return
			case <-t.C:
			}
		}
	}()
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
		r.mu.Lock()
		r.lost = false
		old := r.incarnation
		r.incarnation = b.Incarnation
		p := r.peer
		r.mu.Unlock()
		if p != nil && vouchFor(id, r.node, p.GID()) == nil {
			// The peer's side of our connection is new: ours goes too.
			r.a.eng.ObservePeerEpoch(p.GID(), b.PeerEpoch)
		}
		if old != 0 && old != b.Incarnation {
			return true, errRestarted
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

// peersChanged connects to discovered peers so heartbeats watch them, and
// forgets the ones that left once no vconn uses them: their control
// connection, heartbeat and engine peer (with its QPs) go.
func (a *Agent) peersChanged(peers []discovery.Peer) {
	known := make(map[string]bool, len(peers))
	for _, p := range peers {
		known[p.NodeName] = true
		if _, err := a.remoteFor(p.NodeName, p.Address, true); err != nil {
			a.log.Error(err, "Cannot reach peer agent", "peer", p.NodeName)
		}
	}
	var gone []*remote
	a.mu.Lock()
	for node, r := range a.remotes {
		if !known[node] && r.forget() {
			delete(a.remotes, node)
			gone = append(gone, r)
		}
	}
	for gid, node := range a.gids {
		if a.remotes[node] == nil {
			delete(a.gids, gid)
		}
	}
	for node := range a.announced {
		if a.remotes[node] == nil {
			delete(a.announced, node)
		}
	}
	a.mu.Unlock()
	for _, r := range gone {
		r.close()
		a.log.Info("Forgot a peer agent that left", "peer", r.node, "address", r.addr)
	}
}

// forget drops the remote's engine peer unless a vconn uses it, and
// reports whether the remote may go.
func (r *remote) forget() bool {
	r.mu.Lock()
	p := r.peer
	r.mu.Unlock()
	return p == nil || r.a.eng.Forget(p.GID(), errors.New("its node left the cluster"))
}

// link is engine.PeerLink over the control plane, for the engine peer at
// gid: its replies must come from the remote's node, with a certificate
// that holds gid, since the engine connects its QP to what they say.
type link struct {
	r   *remote
	gid verbs.GID
}

func (l link) ConnectQP(ctx context.Context, req engine.QPRequest) (engine.QPReply, error) {
	var from peer.Peer
	rep, err := l.r.cl.ConnectQP(ctx, &controlpb.QPRequest{Gid: req.GID[:], Type: uint32(req.Type), Qpn: req.QPN,
		Psn: req.PSN, Mtu: uint32(req.MTU), UdQpns: req.UDQPNs, Index: uint32(req.Index), Epoch: req.Epoch, Pool: uint32(req.Pool)},
		grpc.Peer(&from))
	if err != nil {
		return engine.QPReply{}, statusError(err)
	}
	id, err := l.r.a.answerer(&from)
	if err == nil {
		err = vouchFor(id, l.r.node, l.gid)
	}
	var qp engine.QPReply
	if err == nil {
		qp, err = qpReplyOf(rep)
	}
	if err != nil {
		return engine.QPReply{}, fmt.Errorf("agent: QP of peer %s at %s: %w", l.r.node, l.r.addr, err)
	}
	return qp, nil
}

// maxUDQPNs is the most UD QPs an engine lists, as AcceptQP takes them
// from a request.
const maxUDQPNs = 64

// qpReplyOf checks a peer's answer to ConnectQP: QP numbers and PSN of 24
// bits (QPN 0 is no engine's), at most maxUDQPNs UD QPs, and an epoch,
// which starts at 1.
func qpReplyOf(rep *controlpb.QPReply) (engine.QPReply, error) {
	const qpnLimit = 1 << 24
	switch {
	case rep.GetQpn() == 0 || rep.GetQpn() >= qpnLimit:
		return engine.QPReply{}, fmt.Errorf("%w: QPN %#x", errBadReply, rep.GetQpn())
	case rep.GetPsn() >= qpnLimit:
		return engine.QPReply{}, fmt.Errorf("%w: PSN %#x", errBadReply, rep.GetPsn())
	case len(rep.GetUdQpns()) > maxUDQPNs:
		return engine.QPReply{}, fmt.Errorf("%w: %d UD QPs", errBadReply, len(rep.GetUdQpns()))
	case rep.GetEpoch() == 0:
		return engine.QPReply{}, fmt.Errorf("%w: epoch 0", errBadReply)
	}
	for _, q := range rep.GetUdQpns() {
		if q == 0 || q >= qpnLimit {
			return engine.QPReply{}, fmt.Errorf("%w: UD QPN %#x", errBadReply, q)
		}
	}
	return engine.QPReply{QPN: rep.GetQpn(), PSN: rep.GetPsn(), UDQPNs: rep.GetUdQpns(), Epoch: rep.GetEpoch()}, nil
}

// dialPeer connects a new vconn to a listener on another node. Its
// errors carry their control-plane failure class (statusError).
func (a *Agent) dialPeer(ctx context.Context, t target, from netip.Addr, port uint32) (*engine.VConn, error) {
	vc, err := a.dialRemote(ctx, t, from, port)
	return vc, statusError(err)
}

func (a *Agent) dialRemote(ctx context.Context, t target, from netip.Addr, port uint32) (*engine.VConn, error) {
	p := t.peer
	// Discovery says where a node's agent is (move).
	r, err := a.remoteFor(p.NodeName, p.Address, true)
	if err != nil {
		return nil, err
	}
	ep, err := r.enginePeer(ctx, verbs.GID{})
	if err != nil {
		return nil, err
	}
	vc, err := a.eng.NewVConn(ctx, ep, engine.VConnOptions{UseEngineDefault: true})
	if err != nil {
		return nil, err
	}
	var answer peer.Peer
	req := &controlpb.DialRequest{Caller: a.self(), Port: port, Vconn: uint32(vc.ID())}
	if t.ip.IsValid() {
		req.Ip = t.ip.AsSlice()
	}
	if from.IsValid() {
		req.FromIp = from.AsSlice()
	}
	rep, err := r.cl.Dial(ctx, req, grpc.Peer(&answer))
	if err == nil {
		var id *pki.Identity
		if id, err = a.answerer(&answer); err == nil {
			err = vouchFor(id, r.node, ep.GID())
		}
		if err != nil {
			err = fmt.Errorf("agent: dial of peer %s at %s: %w", r.node, r.addr, err)
		}
	}
	if err != nil {
		_ = vc.Close()
		return nil, err
	}
	if err := vc.Connect(vqpn.ID(rep.Vconn)); err != nil {
		vc.Abort()
		return nil, err
	}
	return vc, nil
}
