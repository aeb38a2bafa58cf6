package agent

import "testing"

// TestAcceptCap: one caller may hold all but a quarter of a listening
// allocation's quota, and all but 16 of a large one (a service's one
// client of 1,000 vconns, as the rxe demo's, is not capped at 798).
func TestAcceptCap(t *testing.T) {
	for quota, want := range map[int]int{2: 2, 4: 3, 16: 12, 64: 48, 100: 84, 1064: 1048} {
		if got := (&allocation{quota: quota}).acceptCap(); got != want {
			t.Errorf("quota %d: one caller may hold %d, want %d", quota, got, want)
		}
	}
}
