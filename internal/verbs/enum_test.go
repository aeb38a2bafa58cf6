package verbs

import "testing"

// TestPortState: ibv_port_state's names and values, and which states carry
// traffic.
func TestPortState(t *testing.T) {
	for _, tc := range []struct {
		s      PortState
		name   string
		active bool
	}{
		{0, "NOP", false}, {1, "DOWN", false}, {2, "INIT", false}, {3, "ARMED", false},
		{4, "ACTIVE", true}, {5, "ACTIVE_DEFER", true}, {6, "PortState(6)", false},
	} {
		if tc.s.String() != tc.name || tc.s.Active() != tc.active {
			t.Errorf("PortState %d: %q, active %v; want %q, %v", uint8(tc.s), tc.s, tc.s.Active(), tc.name, tc.active)
		}
	}
}
