package engine

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/rdmavisor/rdmavisor/internal/transport"
	"github.com/rdmavisor/rdmavisor/internal/verbs/soft/wire"
)

// TestPeerEpoch: when one engine drops its side of a peer (its heartbeat
// lost the other, say) while the other keeps its own, the other's UC
// traffic goes into QPs that are gone, and no error ever says so. The
// epoch of the dropping side's new Peer, learnt from a heartbeat or from
// its next QP request, makes the other fail its stale side at once, so
// its vconns end with ErrPeerGone instead of timing out one by one, and
// new ones connect afresh and echo.
func TestPeerEpoch(t *testing.T) {
	for _, learn := range []string{"heartbeat", "request"} {
		t.Run(learn, func(t *testing.T) {
			a, b := testEngines(t, wire.Faults{}, Config{QPsPerPeer: 1})
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			va, vb, err := Pair(ctx, a, b, VConnOptions{Transport: transport.Auto}, VConnOptions{Transport: transport.Auto})
			if err != nil {
				t.Fatal(err)
			}
			echo(ctx, t, va, vb)
			echo(ctx, t, vb, va)
			old := b.PeerEpoch(a.GID())
			if old == 0 || a.PeerEpoch(b.GID()) == 0 {
				t.Fatalf("epochs of connected peers: %#x, %#x", old, a.PeerEpoch(b.GID()))
			}
			// b drops its side; a does not know.
			pb, err := b.Peer(a.GID(), nil)
			if err != nil {
				t.Fatal(err)
			}
			pb.Fail(errors.New("heartbeat lost"))
			waitFor(t, func() bool { return vb.Err() != nil }, "b's vconn to fail")
			if err := va.Err(); err != nil {
				t.Fatalf("a's vconn failed before a learnt anything: %v", err)
			}
			// b tells of the side it will have: a beat needs no new
			// Peer on b.
			fresh := b.PeerEpoch(a.GID())
			if fresh != old+1 {
				t.Fatalf("b's failed side: epoch %d, want %d", fresh, old+1)
			}
			switch learn {
			case "heartbeat":
				if a.ObservePeerEpoch(b.GID(), fresh) {
					t.Fatal("a took b's new epoch for the one it knew")
				}
			case "request":
				// A vconn set up on a's stale side: b's new side
				// connects its QPs to a with its epoch (when its end
				// connects, or at the latest when it sends), and a's
				// end fails rather than send into nothing.
				va2, vb2, err := Pair(ctx, a, b, VConnOptions{Transport: transport.Auto}, VConnOptions{Transport: transport.Auto})
				if err == nil {
					if err := vb2.Send(ctx, []byte("first")); err != nil {
						t.Fatal(err)
					}
					waitFor(t, func() bool { return errors.Is(va2.Err(), ErrPeerGone) }, "a's vconn on its stale side to fail")
				} else if !errors.Is(err, ErrPeerGone) {
					t.Fatalf("a vconn on a's stale side: %v; want ErrPeerGone", err)
				}
			}
			waitFor(t, func() bool { return errors.Is(va.Err(), ErrPeerGone) }, "a's old vconn to fail")
			if a.ObservePeerEpoch(b.GID(), old) == false {
				t.Fatal("old news failed a's new side")
			}
			if !a.ObservePeerEpoch(b.GID(), fresh) {
				t.Fatal("a's new side refused b's epoch")
			}
			va3, vb3, err := Pair(ctx, a, b, VConnOptions{Transport: transport.Auto}, VConnOptions{Transport: transport.Auto})
			if err != nil {
				t.Fatal(err)
			}
			if e := b.PeerEpoch(a.GID()); e != fresh {
				t.Fatalf("b's new side: epoch %d, want the %d it told", e, fresh)
			}
			for range 10 {
				echo(ctx, t, va3, vb3)
				echo(ctx, t, vb3, va3)
			}
		})
	}
}
