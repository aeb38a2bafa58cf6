package agent

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net/netip"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/status"

	"github.com/rdmavisor/rdmavisor/internal/agent/controlpb"
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
	case codes.PermissionDenied:
		if !policyDenied(st) {
			return err
		}
		class = errPolicy
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
	return withProtocol(&controlpb.Node{Name: a.cfg.NodeName, ControlAddress: a.ctlAddr, Gid: gid[:], Incarnation: a.incarnation})
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
	rep := &controlpb.IdentityReply{Node: s.a.self(), Qkey: ec.QKey, Mtu: uint32(ec.MTU.Bytes())}
	for _, e := range s.a.engines[1:] {
		g := e.GID()
		rep.RailGids = append(rep.RailGids, g[:])
	}
	return rep, nil
}

// claimOf is what a Node message claims: all of it, its GID of 16
// bytes; nil claims nothing.
func claimOf(n *controlpb.Node) (claim, error) {
	if n == nil {
		return claim{}, nil
	}
	if _, err := negotiate(n); err != nil {
		return claim{}, err
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
	if err := s.a.authorize(ctx, claim{gid: gid, rail: int(min(req.Rail, 1<<16)), of: claimsGID}); err != nil {
		return nil, err
	}
	if req.Type > 255 || req.Mtu > 255 || req.Lid > verbs.MaxUnicastLID {
		return nil, status.Error(codes.InvalidArgument, "bad QP type, MTU or LID")
	}
	eng, err := s.a.engineOf(int(min(req.Rail, 1<<16)))
	if err != nil {
		return nil, status.Error(codes.InvalidArgument, err.Error())
	}
	rep, err := eng.AcceptQP(engine.QPRequest{GID: gid, Type: verbs.QPType(req.Type), QPN: req.Qpn, PSN: req.Psn,
		MTU: verbs.MTU(req.Mtu), UDQPNs: req.UdQpns, Index: int(min(req.Index, 1<<16)), Epoch: req.Epoch, Pool: int(min(req.Pool, 1<<16)),
		LID: uint16(req.Lid), Resends: req.Resends, ResendsAuto: req.ResendsAuto})
	if err != nil {
		return nil, status.Error(codes.FailedPrecondition, err.Error())
	}
	return &controlpb.QPReply{Qpn: rep.QPN, Psn: rep.PSN, UdQpns: rep.UDQPNs, Epoch: rep.Epoch, Secret: rep.Secret, UdSecret: rep.UDSecret, Lid: uint32(rep.LID),
		Resends: rep.Resends, ResendsAuto: rep.ResendsAuto}, nil
}

// Dial gives the caller's vconn a peer on a listener of this node.
func (s *controlServer) Dial(ctx context.Context, req *controlpb.DialRequest) (*controlpb.DialReply, error) {
	a := s.a
	// Bounded here too: a caller that sets no deadline would otherwise
	// hold the listener's quota slot, and the call's place in
	// peerCallLimit, for as long as the work waits on it (its ConnectQP).
	ctx, cancel := context.WithTimeout(ctx, dialTimeout)
	defer cancel()
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
	rail := int(min(req.GetRail(), 1<<16))
	eng, err := a.engineOf(rail)
	if err != nil {
		return nil, status.Error(codes.InvalidArgument, err.Error())
	}
	if rail > 0 {
		// The caller's vconn is on its rail: ours of the same index
		// reaches it, at the GID the caller has there (its certificate's,
		// under TLS, as rail 0's).
		if gid, err = gidOf(req.GetRailGid()); err != nil {
			return nil, err
		}
		if err := a.authorize(ctx, claim{gid: gid, rail: rail, of: claimsGID}); err != nil {
			return nil, err
		}
	}
	if err := a.checkFromIP(ctx, req.GetFromIp(), c.Name); err != nil {
		return nil, err
	}
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
	if l.bridged && !eng.Config().Transport.Reliable() {
		// Listen refuses a bridged listener where its allocation's
		// vconns are unreliable (bridgeable); this guards an engine of
		// another rail. Refused here, nothing reaches the listener.
		return nil, status.Errorf(codes.InvalidArgument, "listener on port %d is bridged, and this node's vconns are %v, which cannot carry a stream", req.Port, eng.Config().Transport)
	}
	// The caller's IP is the API server's (checkFromIP): the listener's
	// pod's ingress policies decide by it.
	if err := a.checkIngress(c, req.GetFromIp(), req.GetIp(), l); err != nil {
		return nil, err
	}
	return s.accept(ctx, l, eng, req, gid, rail)
}

// accept gives listener l a vconn connected to the caller's, on eng (of
// the caller's rail, at its gid there), within the caller's share of the
// listener's quota.
func (s *controlServer) accept(ctx context.Context, l *listener, eng *engine.Engine, req *controlpb.DialRequest, gid verbs.GID, rail int) (*controlpb.DialReply, error) {
	c := req.GetCaller()
	// Each caller within its share of the quota (acceptKept).
	slot, err := l.sess.al.takeAccept(l, acceptCaller(c.Name, req.GetFromIp()))
	if err != nil {
		return nil, status.Errorf(codes.ResourceExhausted, "listener on port %d: %v", req.Port, err)
	}
	r, err := s.a.remoteFor(c.Name, c.ControlAddress, false)
	if err != nil {
		l.sess.al.giveFor(slot)
		return nil, status.Error(codes.Unavailable, err.Error())
	}
	r.observe(c.Incarnation)
	ep, err := r.enginePeer(ctx, gid, rail)
	if err != nil {
		l.sess.al.giveFor(slot)
		return nil, status.Error(codes.Unavailable, err.Error())
	}
	vc, err := eng.NewVConn(ctx, ep, engine.VConnOptions{UseEngineDefault: true})
	if err != nil {
		l.sess.al.giveFor(slot)
		return nil, status.Error(codes.Unavailable, err.Error())
	}
	if err := vc.Connect(vqpn.ID(req.Vconn)); err != nil {
		_ = vc.Close()
		l.sess.al.giveFor(slot)
		return nil, status.Error(codes.Internal, err.Error())
	}
	if !l.sess.accepted(l, vc, remoteOf(req.GetFromIp(), c.Name), slot) {
		vc.Abort()
		l.sess.al.giveFor(slot)
		return nil, status.Errorf(codes.NotFound, "listener on port %d closed", req.Port)
	}
	return &controlpb.DialReply{Vconn: uint32(vc.ID())}, nil
}

// Heartbeat echoes beats, stamped with this agent's incarnation.
func (s *controlServer) Heartbeat(stream grpc.BidiStreamingServer[controlpb.Beat, controlpb.Beat]) error {
	if err := s.a.authorize(stream.Context(), claim{}); err != nil {
		return err
	}
	var caller []byte               // the GID authorized on this stream
	railOK := make(map[string]bool) // the caller's rail GIDs, authorized or not
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
		ans := &controlpb.Beat{Seq: b.Seq, Incarnation: s.a.incarnation, PeerEpoch: epoch}
		if len(b.RailGids) > 0 {
			ans.RailEpochs = s.railEpochs(stream.Context(), b.RailGids, railOK)
		}
		if err := stream.Send(ans); err != nil {
			return nil
		}
	}
}

// railEpochs answers a beat's rail GIDs (rails 1..) with this agent's
// epochs for them, on its engines of the same rails: 0 (no news) past its
// rails, and for a GID the caller's certificate does not hold (the
// stream goes on: rail 0 still speaks). ok caches the authorization of
// each GID for the stream.
func (s *controlServer) railEpochs(ctx context.Context, gids [][]byte, ok map[string]bool) []uint64 {
	a := s.a
	n := min(len(gids), len(a.engines)-1)
	out := make([]uint64, n)
	for i := range n {
		gid, err := gidOf(gids[i])
		if err != nil {
			continue
		}
		k := string(gids[i])
		allowed, seen := ok[k]
		if !seen {
			if len(ok) >= 64 { // bounds what a stream makes this agent remember
				continue
			}
			allowed = a.authorize(ctx, claim{gid: gid, rail: i + 1, of: claimsGID}) == nil
			ok[k] = allowed
		}
		if allowed {
			out[i] = a.engines[i+1].PeerEpoch(gid)
		}
	}
	return out
}

// link is engine.PeerLink over the control plane, for the engine peer at
// gid: its replies must come from the remote's node, with a certificate
// that holds gid, since the engine connects its QP to what they say.
type link struct {
	r    *remote
	gid  verbs.GID
	rail int // the engine's rail, and the peer's engine that accepts
}

func (l link) ConnectQP(ctx context.Context, req engine.QPRequest) (engine.QPReply, error) {
	var from peer.Peer
	rep, err := l.r.cl.ConnectQP(ctx, &controlpb.QPRequest{Gid: req.GID[:], Type: uint32(req.Type), Qpn: req.QPN,
		Psn: req.PSN, Mtu: uint32(req.MTU), UdQpns: req.UDQPNs, Index: uint32(req.Index), Epoch: req.Epoch, Pool: uint32(req.Pool), Lid: uint32(req.LID), Rail: uint32(l.rail),
		Resends: req.Resends, ResendsAuto: req.ResendsAuto},
		grpc.Peer(&from))
	if err != nil {
		return engine.QPReply{}, statusError(err)
	}
	id, err := l.r.a.answerer(&from)
	if err == nil {
		err = vouchFor(id, l.r.node, l.gid, l.rail, l.r.a.railGIDListed)
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
// bits (QPN 0 is no engine's), at most maxUDQPNs UD QPs, an epoch, which
// starts at 1, and the secrets our messages to it must carry, never 0 (an
// agent without them, of an older version, speaks an older engine format).
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
	case rep.GetSecret() == 0 || rep.GetUdSecret() == 0:
		return engine.QPReply{}, fmt.Errorf("%w: no secret", errBadReply)
	case rep.GetLid() > verbs.MaxUnicastLID:
		return engine.QPReply{}, fmt.Errorf("%w: LID %#x is not unicast", errBadReply, rep.GetLid())
	}
	for _, q := range rep.GetUdQpns() {
		if q == 0 || q >= qpnLimit {
			return engine.QPReply{}, fmt.Errorf("%w: UD QPN %#x", errBadReply, q)
		}
	}
	return engine.QPReply{QPN: rep.GetQpn(), PSN: rep.GetPsn(), UDQPNs: rep.GetUdQpns(), Epoch: rep.GetEpoch(),
		Secret: rep.GetSecret(), UDSecret: rep.GetUdSecret(), LID: uint16(rep.GetLid()), Resends: rep.GetResends(), ResendsAuto: rep.GetResendsAuto()}, nil
}

// dialPeer connects a new vconn to a listener on another node. Its
// errors carry their control-plane failure class (statusError).
//
// The vconn is on rail (the dialing allocation's), and so is the peer's.
func (a *Agent) dialPeer(ctx context.Context, t target, from netip.Addr, port uint32, rail int) (*engine.VConn, error) {
	vc, err := a.dialRemote(ctx, t, from, port, rail)
	return vc, statusError(err)
}

func (a *Agent) dialRemote(ctx context.Context, t target, from netip.Addr, port uint32, rail int) (*engine.VConn, error) {
	eng, err := a.engineOf(rail)
	if err != nil {
		return nil, err
	}
	p := t.peer
	// Discovery says where a node's agent is (move).
	r, err := a.remoteFor(p.NodeName, p.Address, true)
	if err != nil {
		return nil, err
	}
	ep, err := r.enginePeer(ctx, verbs.GID{}, rail)
	if err != nil {
		return nil, err
	}
	vc, err := eng.NewVConn(ctx, ep, engine.VConnOptions{UseEngineDefault: true})
	if err != nil {
		return nil, err
	}
	var answer peer.Peer
	req := &controlpb.DialRequest{Caller: a.self(), Port: port, Vconn: uint32(vc.ID())}
	if rail > 0 {
		g := eng.GID()
		req.Rail, req.RailGid = uint32(rail), g[:]
	}
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
			err = vouchFor(id, r.node, ep.GID(), rail, a.railGIDListed)
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
