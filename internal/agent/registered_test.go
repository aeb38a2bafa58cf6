package agent

import (
	"errors"
	"strings"
	"testing"
)

// TestRegisteredFairShare: three allocations share limits.registeredBytes
// (90 bytes): each may hold at most the limit divided by the allocations
// holding registered memory, itself included. A lone one may take more
// than a later share, keeps it, and grows only once back under its share;
// one that holds nothing any more stops counting. Each refusal is
// errLimit naming limits.registeredBytes, and takes nothing.
func TestRegisteredFairShare(t *testing.T) {
	const limit = 90
	var p registeredPool
	a, b, c := &allocation{id: "a"}, &allocation{id: "b"}, &allocation{id: "c"}
	steps := []struct {
		al      *allocation
		size    int64 // claimed; negative: released
		refused string
	}{
		{al: a, size: 60}, // alone: its share is 90
		{al: b, size: 46, refused: "past its fair share of limits.registeredBytes, 45"}, // two holders, 45 each
		{al: b, size: 30}, // the pool's 90 full
		{al: c, size: 1, refused: "hold 90 of the 90 bytes of limits.registeredBytes"},
		{al: a, size: -30}, // a at 30
		{al: c, size: 31, refused: "past its fair share of limits.registeredBytes, 30"}, // three holders, 30 each
		{al: c, size: 30},
		{al: a, size: 1, refused: "past its fair share"}, // a at its 30, the pool full
		{al: b, size: -20}, // b at 10, 20 free
		{al: a, size: 1, refused: "(90 bytes among the 3 allocations"}, // 20 free, but b is below its share
		{al: b, size: -10}, // b holds none: two holders
		{al: a, size: 15},  // a at 45, its share of two
		{al: c, size: 16, refused: "allocation c would hold 46 bytes registered, past its fair share"},
		{al: c, size: 15},
	}
	for i, s := range steps {
		held, total := p.held[s.al], p.total
		if s.size < 0 {
			p.release(s.al, -s.size)
			continue
		}
		err := p.claim(s.al, "export", s.size, limit)
		switch {
		case s.refused == "" && err != nil:
			t.Fatalf("step %d: %s claims %d: %v", i, s.al.id, s.size, err)
		case s.refused != "" && (!errors.Is(err, errLimit) || !strings.Contains(err.Error(), s.refused)):
			t.Fatalf("step %d: %s claims %d: %v, want errLimit with %q", i, s.al.id, s.size, err, s.refused)
		case s.refused != "" && (p.held[s.al] != held || p.total != total):
			t.Fatalf("step %d: a refused claim took memory: %s holds %d, the pool %d", i, s.al.id, p.held[s.al], p.total)
		}
	}
	if p.total != 90 || p.held[a] != 45 || p.held[c] != 45 || len(p.held) != 2 {
		t.Errorf("pool %d, held %v, want a and c at 45", p.total, p.held)
	}
}
