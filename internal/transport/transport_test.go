package transport

import (
	"slices"
	"testing"
)

func TestKinds(t *testing.T) {
	for _, tc := range []struct {
		k        Kind
		name     string
		reliable bool
	}{
		{Unknown, "", true}, // not reported or not chosen: the default, rc
		{RC, "rc", true},
		{UC, "uc", false},
		{UD, "ud", false},
		{Auto, "auto", true},
		{Kind(Count), "Transport(5)", false},
		{Kind(255), "Transport(255)", false},
	} {
		if got := tc.k.String(); got != tc.name {
			t.Errorf("Kind(%d).String() = %q, want %q", uint8(tc.k), got, tc.name)
		}
		if got := tc.k.Reliable(); got != tc.reliable {
			t.Errorf("%q: Reliable %v, want %v", tc.name, got, tc.reliable)
		}
		k, err := Parse(tc.name)
		if valid := tc.k >= RC && tc.k <= Auto; valid != (err == nil) || valid && k != tc.k {
			t.Errorf("Parse(%q) = %v, %v", tc.name, k, err)
		}
	}
	if got := Names(); !slices.Equal(got, []string{"rc", "uc", "ud", "auto"}) {
		t.Errorf("Names() = %q", got)
	}
	Names()[0] = "x" // a copy: the names stay as they are
	if RC.String() != "rc" {
		t.Error("Names returned the package's own array")
	}
}

func TestParseRefuses(t *testing.T) {
	for _, s := range []string{"", "RC", " rc", "rc ", "tcp", "Transport(1)", "unknown"} {
		if k, err := Parse(s); err == nil {
			t.Errorf("Parse(%q) = %v, want an error", s, k)
		}
	}
}

// FuzzParse: Parse accepts exactly the names String gives the four kinds
// one may ask for, and what it accepts spells itself back.
func FuzzParse(f *testing.F) {
	for _, s := range []string{"rc", "uc", "ud", "auto", "", "RC", "tcp", "auto\x00"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		k, err := Parse(s)
		if err != nil {
			if slices.Contains(Names(), s) {
				t.Fatalf("Parse(%q) refused a name: %v", s, err)
			}
			return
		}
		if k < RC || k > Auto || k.String() != s {
			t.Fatalf("Parse(%q) = %d (%q)", s, uint8(k), k)
		}
	})
}
