package engine

import (
	"errors"
	"net/netip"
	"testing"
	"time"

	"github.com/rdmavisor/rdmavisor/internal/verbs"
	"github.com/rdmavisor/rdmavisor/internal/verbs/soft/wire"
)

// TestIngressIsBounded: a peer that keeps asking for QPs holds at most its
// two pools' worth on this node; the oldest go.
func TestIngressIsBounded(t *testing.T) {
	e, _ := testEngines(t, wire.Faults{}, Config{QPsPerPeer: 2})
	gid := verbs.GIDFromAddr(netip.MustParseAddr("10.9.9.9"))
	var qpns []uint32
	for i := range 20 {
		rep, err := e.AcceptQP(QPRequest{GID: gid, Type: verbs.QPTypeRC, QPN: uint32(100 + i), PSN: 1, MTU: verbs.MTU1024})
		if err != nil {
			t.Fatal(err)
		}
		qpns = append(qpns, rep.QPN)
	}
	p, _ := e.Peer(gid, nil)
	p.mu.Lock()
	n := len(p.ingress)
	newest := p.ingress[n-1].QPN()
	p.mu.Unlock()
	if n != 4 || newest != qpns[19] {
		t.Fatalf("%d ingress QPs (newest %#x), want 4 ending with %#x", n, newest, qpns[19])
	}
	if _, ok := e.ingress.Load(qpns[0]); ok {
		t.Fatal("an evicted QP still routes to the peer")
	}
	if _, ok := e.ingress.Load(qpns[19]); !ok {
		t.Fatal("the newest QP does not route to the peer")
	}
}

// TestForget: a peer no vconn uses is dropped, one in use is kept.
func TestForget(t *testing.T) {
	_, a, b, va, _ := testPair(t, wire.Faults{}, RC, 10*time.Second)
	left := errors.New("left")
	if a.Forget(b.GID(), left) {
		t.Fatal("a peer with an open vconn was forgotten")
	}
	va.Abort()
	if !a.Forget(b.GID(), left) {
		t.Fatal("an unused peer was kept")
	}
	a.peersMu.Lock()
	_, still := a.peers[b.GID()]
	a.peersMu.Unlock()
	if still {
		t.Fatal("forgotten peer still in the table")
	}
	if !a.Forget(verbs.GID{1}, left) {
		t.Fatal("an unknown peer is not gone")
	}
}
