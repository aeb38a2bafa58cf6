package verbstest

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"testing"
)

// Fill writes the data pattern of seed into b: a pseudo-random stream that
// depends only on seed and the offset from b[0], so two seeds (or a shifted
// copy) never compare equal by accident and zeroed memory never matches.
func Fill(b []byte, seed uint64) {
	s := seed
	i := 0
	for ; i+8 <= len(b); i += 8 {
		binary.LittleEndian.PutUint64(b[i:], splitmix(&s))
	}
	if i < len(b) {
		v := splitmix(&s)
		for ; i < len(b); i++ {
			b[i] = byte(v)
			v >>= 8
		}
	}
}

// Pattern returns n bytes of the pattern of seed in a new slice.
func Pattern(n int, seed uint64) []byte {
	b := make([]byte, n)
	Fill(b, seed)
	return b
}

// Check reports whether b holds exactly the pattern Fill(b, seed) writes; the
// error names the first differing byte and how many differ.
func Check(b []byte, seed uint64) error {
	return diff(b, Pattern(len(b), seed))
}

func diff(got, want []byte) error {
	if bytes.Equal(got, want) {
		return nil
	}
	if len(got) != len(want) {
		return fmt.Errorf("length %d, want %d", len(got), len(want))
	}
	first, n := -1, 0
	for i := range got {
		if got[i] != want[i] {
			if first < 0 {
				first = i
			}
			n++
		}
	}
	return fmt.Errorf("byte %d of %d is %#02x, want %#02x (%d bytes differ)", first, len(got), got[first], want[first], n)
}

// expectBytes fails the test unless got equals want.
func expectBytes(t testing.TB, what string, got, want []byte) bool {
	t.Helper()
	if err := diff(got, want); err != nil {
		t.Errorf("%s: %v", what, err)
		return false
	}
	return true
}

// splitmix is SplitMix64.
func splitmix(s *uint64) uint64 {
	*s += 0x9E3779B97F4A7C15
	z := *s
	z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9
	z = (z ^ (z >> 27)) * 0x94D049BB133111EB
	return z ^ (z >> 31)
}
