package engine

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/rdmavisor/rdmavisor/internal/transport"
	"github.com/rdmavisor/rdmavisor/internal/verbs/soft/wire"
)

// TestTrafficStats: after known traffic each side counts the messages and
// payload bytes of each transport once, long messages (chunked) and
// bundles included, and the peers, QPs and vconn states are as set up.
func TestTrafficStats(t *testing.T) {
	for _, tc := range []struct {
		tr             transport.Kind
		sizes          []int
		wantRC, wantUC int // QPs created per side
	}{
		{transport.RC, []int{1, 100, 40000}, 1, 0},          // 40000 B: three chunks
		{transport.Auto, []int{10, 10, 10, 10, 5000}, 1, 1}, // sent back to back: bundled
		{transport.UD, []int{64}, 1, 0},
	} {
		t.Run(tc.tr.String(), func(t *testing.T) {
			a, b := testEngines(t, wire.Faults{}, Config{})
			ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
			defer cancel()
			va, vb, err := Pair(ctx, a, b, VConnOptions{Transport: tc.tr}, VConnOptions{Transport: tc.tr})
			if err != nil {
				t.Fatal(err)
			}
			total := 0
			for _, n := range tc.sizes {
				if err := va.Send(ctx, make([]byte, n)); err != nil {
					t.Fatal(err)
				}
				total += n
			}
			for range tc.sizes {
				m, err := vb.Recv(ctx)
				if err != nil {
					t.Fatal(err)
				}
				m.Release()
			}
			want := Traffic{Msgs: uint64(len(tc.sizes)), Bytes: uint64(total)}
			sent, _ := a.TrafficStats()
			_, recv := b.TrafficStats()
			for tr := range NumTransports {
				w := Traffic{}
				if transport.Kind(tr) == tc.tr {
					w = want
				}
				if sent[tr] != w {
					t.Errorf("sent on %v: %+v, want %+v", transport.Kind(tr), sent[tr], w)
				}
				if recv[tr] != w {
					t.Errorf("received on %v: %+v, want %+v", transport.Kind(tr), recv[tr], w)
				}
			}
			if tc.tr == transport.Auto && a.Stats().Bundled == 0 {
				t.Log("no bundle formed; the bundle path went uncounted")
			}
			peers, states := a.PeerStats()
			if len(peers) != 1 || peers[0].GID != b.GID() {
				t.Fatalf("peers %+v, want one, %v", peers, b.GID())
			}
			if p := peers[0]; p.RCQPs != tc.wantRC || p.UCQPs != tc.wantUC || p.VConns != (StateCounts{Open: 1}) {
				t.Errorf("peer %+v, want %d RC, %d UC QPs and one open vconn", p, tc.wantRC, tc.wantUC)
			}
			if states != (StateCounts{Open: 1}) {
				t.Errorf("states %+v, want one open", states)
			}
			if bp, _ := b.PeerStats(); len(bp) != 1 || bp[0].IngressQPs != tc.wantRC+tc.wantUC {
				t.Errorf("b's peers %+v, want %d ingress QPs", bp, tc.wantRC+tc.wantUC)
			}
			if err := va.Close(); err != nil {
				t.Fatal(err)
			}
			if _, states := a.PeerStats(); states.Open != 0 {
				t.Errorf("after Close: states %+v, want none open", states)
			}
		})
	}
}

// TestPollerBusy: a poller that moved messages reports busy time, at most
// its uptime, and the busy time never goes backwards while traffic runs
// and snapshots race the pollers.
func TestPollerBusy(t *testing.T) {
	_, a, _, va, vb := testPair(t, wire.Faults{}, transport.RC, 20*time.Second)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	done := make(chan error, 1)
	go func() {
		for range 2000 {
			m, err := vb.Recv(ctx)
			if err != nil {
				done <- err
				return
			}
			m.Release()
		}
		done <- nil
	}()
	last := make([]time.Duration, len(a.pollers))
	for i := range 2000 {
		if err := va.Send(ctx, make([]byte, 64)); err != nil {
			t.Fatal(err)
		}
		if i%50 == 0 {
			for j, ps := range a.PollerStats() {
				if ps.Busy < last[j] {
					t.Fatalf("poller %d busy time went from %v to %v", j, last[j], ps.Busy)
				}
				last[j] = ps.Busy
			}
		}
	}
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	var busy time.Duration
	for j, ps := range a.PollerStats() {
		if ps.Busy > ps.Uptime {
			t.Errorf("poller %d busy %v of %v uptime", j, ps.Busy, ps.Uptime)
		}
		busy += ps.Busy
	}
	if busy <= 0 {
		t.Errorf("pollers that sent 2000 messages report no busy time: %v", fmt.Sprint(a.PollerStats()))
	}
}
