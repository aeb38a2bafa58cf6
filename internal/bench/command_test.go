package bench

import (
	"slices"
	"testing"
)

func TestParseCounts(t *testing.T) {
	ns, err := ParseCounts("100, 1000,10000")
	if err != nil || !slices.Equal(ns, []int{100, 1000, 10000}) {
		t.Errorf("ParseCounts = %v, %v; want [100 1000 10000]", ns, err)
	}
	for _, bad := range []string{"", "0", "10,x", "-1"} {
		if _, err := ParseCounts(bad); err == nil {
			t.Errorf("ParseCounts(%q) accepted", bad)
		}
	}
}
