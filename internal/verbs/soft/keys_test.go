package soft

import (
	"testing"
)

// TestKeyTable: an index freed and reused gets a tag other than its last,
// so the stale key reaches nothing; many regions live at once; the table
// is updated in place (one slot per registration, no copy of the table).
func TestKeyTable(t *testing.T) {
	var kt mrKeys
	ms := make([]*mr, 20000)
	for i := range ms {
		ms[i] = &mr{}
		if err := kt.add(ms[i]); err != nil {
			t.Fatal(err)
		}
	}
	seen := map[uint32]bool{}
	for _, m := range ms {
		if m.key>>8 == 0 || seen[m.key] || kt.lookup(m.key) != m {
			t.Fatalf("key %#x: zero index, duplicate, or not found", m.key)
		}
		seen[m.key] = true
	}
	// Reuse one index many times: the tag changes every time.
	m := ms[7]
	idx := m.key >> 8
	for range 1000 {
		old := m.key
		kt.remove(m)
		if kt.lookup(old) != nil {
			t.Fatalf("key %#x still reaches a region after removal", old)
		}
		// Drain the free list down to this index (the others are 7's
		// neighbours from earlier rounds: none).
		m = &mr{}
		if err := kt.add(m); err != nil {
			t.Fatal(err)
		}
		if m.key>>8 != idx || m.key == old {
			t.Fatalf("reused index %d with key %#x after %#x", m.key>>8, m.key, old)
		}
		if kt.lookup(old) != nil || kt.lookup(m.key) != m {
			t.Fatal("stale key found, or the new one not")
		}
	}
	if kt.lookup(0) != nil || kt.lookup(0xffffffff) != nil {
		t.Fatal("a key never given reaches a region")
	}
}

func BenchmarkRegMRWithManyRegions(b *testing.B) {
	var kt mrKeys
	for range 100000 {
		if err := kt.add(&mr{}); err != nil {
			b.Fatal(err)
		}
	}
	m := &mr{}
	b.ResetTimer()
	for range b.N {
		if err := kt.add(m); err != nil {
			b.Fatal(err)
		}
		kt.remove(m)
	}
}
