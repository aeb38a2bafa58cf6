package main

import (
	"math"
	"testing"
	"time"
)

// TestSchedulerFractions: over 100k packets the drop and hold fractions are
// what was asked, and every packet not dropped is accepted exactly once.
func TestSchedulerFractions(t *testing.T) {
	const n = 100_000
	s := &scheduler{pol: newPolicy(42, 0.05, 0.05), holdMax: 5 * time.Millisecond}
	released := make(map[uint32]int, n)
	var dropped []uint32
	outOfOrder := 0
	last := int64(-1)
	now := time.Unix(0, 0)
	for id := range uint32(n) {
		now = now.Add(10 * time.Microsecond)
		rel, dropIt := s.packet(id, now)
		if dropIt {
			if len(rel) != 0 {
				t.Fatalf("packet %d dropped and released %v", id, rel)
			}
			dropped = append(dropped, id)
		}
		// Every 1000 packets a pause lets held ones expire.
		if id%1000 == 999 {
			now = now.Add(time.Second)
			rel = append(rel, s.expire(now)...)
		}
		for _, r := range rel {
			released[r]++
			if int64(r) < last {
				outOfOrder++
			}
			last = max(last, int64(r))
		}
	}
	for _, r := range s.flush() {
		released[r]++
	}
	st := s.stats
	if st.Packets != n {
		t.Errorf("packets %d, want %d", st.Packets, n)
	}
	for name, got := range map[string]uint64{"dropped": st.Dropped, "reordered": st.Reordered} {
		if f := float64(got) / n; math.Abs(f-0.05) > 0.005 {
			t.Errorf("%s %d of %d (%.2f%%), want 5%% ± 0.5%%", name, got, n, f*100)
		}
	}
	if int(st.Dropped) != len(dropped) {
		t.Errorf("stats say %d dropped, the scheduler dropped %d", st.Dropped, len(dropped))
	}
	for _, d := range dropped {
		if released[d] != 0 {
			t.Errorf("packet %d dropped and released", d)
		}
	}
	for id := range uint32(n) {
		if c := released[id]; c > 1 {
			t.Fatalf("packet %d released %d times", id, c)
		}
	}
	if got, want := len(released), n-len(dropped); got != want {
		t.Errorf("%d packets released, want %d (all but the dropped)", got, want)
	}
	// A held packet comes out behind the one that released it.
	if outOfOrder < int(st.Reordered)/2 {
		t.Errorf("only %d packets out of order for %d held", outOfOrder, st.Reordered)
	}
	t.Logf("dropped %d, held %d, out of order %d of %d", st.Dropped, st.Reordered, outOfOrder, n)
}

// TestSchedulerHoldMax: a held packet with no packet after it is released
// once it has waited hold-max, not before.
func TestSchedulerHoldMax(t *testing.T) {
	s := &scheduler{pol: newPolicy(1, 0, 1), holdMax: 5 * time.Millisecond}
	t0 := time.Unix(0, 0)
	if rel, dropIt := s.packet(7, t0); dropIt || len(rel) != 0 {
		t.Fatalf("reorder 100%%: got release %v drop %v, want the packet held", rel, dropIt)
	}
	if got := s.expire(t0.Add(4 * time.Millisecond)); len(got) != 0 {
		t.Fatalf("released %v before hold-max", got)
	}
	if got := s.expire(t0.Add(5 * time.Millisecond)); len(got) != 1 || got[0] != 7 {
		t.Fatalf("at hold-max released %v, want [7]", got)
	}
	if got := s.flush(); len(got) != 0 {
		t.Fatalf("released again on flush: %v", got)
	}
}

// TestSchedulerReleaseAfterNext: an accepted packet releases the held ones
// right behind it.
func TestSchedulerReleaseAfterNext(t *testing.T) {
	s := &scheduler{pol: newPolicy(1, 0, 0), holdMax: time.Second}
	s.held = []heldPacket{{id: 1}, {id: 2}}
	rel, _ := s.packet(3, time.Unix(0, 0))
	if len(rel) != 3 || rel[0] != 3 || rel[1] != 1 || rel[2] != 2 {
		t.Fatalf("released %v, want [3 1 2]", rel)
	}
}

func TestParseFraction(t *testing.T) {
	for in, want := range map[string]float64{"5%": 0.05, "0.05": 0.05, "0": 0, "100%": 1} {
		if got, err := parseFraction(in); err != nil || math.Abs(got-want) > 1e-12 {
			t.Errorf("parseFraction(%q) = %v, %v; want %v", in, got, err, want)
		}
	}
	for _, in := range []string{"", "x", "101%", "-1%", "1.5"} {
		if _, err := parseFraction(in); err == nil {
			t.Errorf("parseFraction(%q) accepted", in)
		}
	}
}
