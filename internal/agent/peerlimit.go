package agent

import (
	"context"
	"net"
	"strings"
	"sync"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/status"
)

// Bounds on what one peer may have in flight on this agent's control
// plane at once, whatever number of connections it spreads it over
// (peerLimiter). Variables only so that a test can lower them.
var (
	// peerStreamLimit bounds a peer's streams (Heartbeat). A peer agent
	// keeps one open to this one (remote.heartbeat) and opens the next
	// only once the last broke; this side may still be winding the broken
	// one down when the next arrives, and a restarted agent's first
	// stream can come before its old connection's goes. Twice those, and
	// no more: each stream is a goroutine and buffers here.
	peerStreamLimit = 8
	// peerCallLimit bounds a peer's unary calls in flight (Identity,
	// ConnectQP, Dial) besides its Dials: a Dial runs while its caller's
	// application dials, and the peer's node may dial as many vconns at
	// once as its pods hold, at most vconnsPerNode (the services' shared
	// configuration), so the bound is vconnsPerNode and this many more
	// (callLimit). An e2e client dialling 500 vconns at once met a bound of
	// 256. It bounds the goroutines, QPs being set up and quota slots
	// that one peer can hold with calls it never lets finish.
	peerCallLimit = 256
	// peerDialsPerVConn: Dials allowed in flight per vconn of
	// vconnsPerNode, besides peerCallLimit (a test sets 0).
	peerDialsPerVConn = 1
)

// peerLimiter counts each peer's streams and unary calls in flight, keyed
// by the peer's identity: its certificate's node under TLS, so that a
// node cannot get around the bounds with more connections or addresses;
// without TLS, where any host can claim to be any node, its IP address.
type peerLimiter struct {
	a *Agent

	mu      sync.Mutex
	streams map[string]int // guarded by mu
	calls   map[string]int // guarded by mu
}

func newPeerLimiter(a *Agent) *peerLimiter {
	return &peerLimiter{a: a, streams: make(map[string]int), calls: make(map[string]int)}
}

// serverOptions are the interceptors that enforce the bounds.
func (p *peerLimiter) serverOptions() []grpc.ServerOption {
	return []grpc.ServerOption{grpc.ChainUnaryInterceptor(p.unary), grpc.ChainStreamInterceptor(p.stream)}
}

// key names the caller of ctx for the bounds.
func (p *peerLimiter) key(ctx context.Context) (string, error) {
	id, err := p.a.caller(ctx)
	if err != nil {
		return "", err
	}
	if id != nil {
		return "node " + id.Node, nil
	}
	pr, ok := peer.FromContext(ctx)
	if !ok || pr.Addr == nil {
		return "", status.Error(codes.Unauthenticated, "no peer")
	}
	host, _, err := net.SplitHostPort(pr.Addr.String())
	if err != nil {
		host = pr.Addr.String()
	}
	return "address " + host, nil
}

// acquire counts one more of kind ("streams", "calls") in flight for the
// caller of ctx, within limit; release gives it back. Past the limit the
// call is refused, ResourceExhausted, with the limit named.
func (p *peerLimiter) acquire(ctx context.Context, counts map[string]int, kind string, limit int, method string) (release func(), _ error) {
	key, err := p.key(ctx)
	if err != nil {
		return nil, err
	}
	p.mu.Lock()
	n := counts[key]
	if n >= limit {
		p.mu.Unlock()
		p.a.log.V(1).Info("Control-plane call refused: peer at its limit", "peer", key, "method", method, "kind", kind, "limit", limit)
		return nil, status.Errorf(codes.ResourceExhausted, "%s refused: %s has %d control-plane %s in flight, the limit for one peer", method, key, n, kind)
	}
	counts[key] = n + 1
	p.mu.Unlock()
	return func() {
		p.mu.Lock()
		defer p.mu.Unlock()
		if counts[key]--; counts[key] <= 0 {
			delete(counts, key) // a peer that went holds no entry
		}
	}, nil
}

func (p *peerLimiter) unary(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
	release, err := p.acquire(ctx, p.calls, "calls", p.callLimit(info.FullMethod), info.FullMethod)
	if err != nil {
		return nil, err
	}
	defer release()
	return handler(ctx, req)
}

func (p *peerLimiter) stream(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, handler grpc.StreamHandler) error {
	release, err := p.acquire(ss.Context(), p.streams, "streams", peerStreamLimit, info.FullMethod)
	if err != nil {
		return err
	}
	defer release()
	return handler(srv, ss)
}

// callLimit is peerCallLimit, and for Dial the vconnsPerNode the peer's
// node may be dialling at once besides.
func (p *peerLimiter) callLimit(method string) int {
	if strings.HasSuffix(method, "/Dial") {
		return peerCallLimit + peerDialsPerVConn*p.a.cfg.VConnsPerNode
	}
	return peerCallLimit
}
