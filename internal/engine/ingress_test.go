package engine

import (
	"errors"
	"net/netip"
	"testing"
	"time"

	"github.com/rdmavisor/rdmavisor/internal/transport"
	"github.com/rdmavisor/rdmavisor/internal/verbs"
	"github.com/rdmavisor/rdmavisor/internal/verbs/soft/wire"
)

// TestIngressIsBounded: a peer holds one QP per index of its pools on
// this node: asking again for an index replaces the QP there (it failed
// on the peer's side), so however often it asks, the QPs stay bounded.
// The QP replaced is kept (routed, not receiving) until the index is
// replaced again, for its last messages still in the CQ: at most two per
// index.
func TestIngressIsBounded(t *testing.T) {
	e, _ := testEngines(t, wire.Faults{}, Config{QPsPerPeer: 2})
	gid := verbs.GIDFromAddr(netip.MustParseAddr("10.9.9.9"))
	var qpns []uint32
	for i := range 20 {
		rep, err := e.AcceptQP(QPRequest{GID: gid, Type: verbs.QPTypeRC, QPN: uint32(100 + i), PSN: 1, MTU: verbs.MTU1024, Index: i % 4, Pool: 4})
		if err != nil {
			t.Fatal(err)
		}
		qpns = append(qpns, rep.QPN)
	}
	p, _ := e.Peer(gid, nil)
	p.mu.Lock()
	n, evicted := len(p.ingress), len(p.evicted)
	p.mu.Unlock()
	if n != 4 || evicted != 4 {
		t.Fatalf("%d ingress QPs and %d replaced kept, want 4 and 4", n, evicted)
	}
	for k, qpn := range qpns {
		_, routed := e.ingress.Load(qpn)
		if want := k >= 12; routed != want {
			t.Errorf("QP %d of 20 (%#x): routed %v, want %v", k, qpn, routed, want)
		}
	}
	if _, err := e.AcceptQP(QPRequest{GID: gid, Type: verbs.QPTypeRC, QPN: 999, PSN: 1, MTU: verbs.MTU1024, Index: maxIndex, Pool: maxIndex}); !errors.Is(err, verbs.ErrInvalid) {
		t.Fatalf("index %d: %v, want ErrInvalid", maxIndex, err)
	}
	for _, pool := range []int{0, 1, maxIndex + 1} {
		if _, err := e.AcceptQP(QPRequest{GID: gid, Type: verbs.QPTypeRC, QPN: 999, PSN: 1, MTU: verbs.MTU1024, Index: 1, Pool: pool}); !errors.Is(err, verbs.ErrInvalid) {
			t.Fatalf("index 1 of a pool of %d: %v, want ErrInvalid", pool, err)
		}
	}
}

// TestForget: a peer no vconn uses is dropped, one in use is kept.
func TestForget(t *testing.T) {
	_, a, b, va, _ := testPair(t, wire.Faults{}, transport.RC, 10*time.Second)
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
