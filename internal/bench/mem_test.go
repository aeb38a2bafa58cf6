package bench

import (
	"testing"

	"github.com/rdmavisor/rdmavisor/internal/verbs"
)

var sink [][]byte

// TestMappedCountsMRMemoryOnly checks the measure E2 relies on: mmap'd MR
// memory shows in Mapped, Go heap growth does not.
func TestMappedCountsMRMemoryOnly(t *testing.T) {
	base, err := sampleMemory()
	if err != nil {
		t.Fatal(err)
	}
	for range 64 {
		sink = append(sink, make([]byte, 1<<20))
	}
	heap, err := sampleMemory()
	if err != nil {
		t.Fatal(err)
	}
	d := heap.sub(base)
	t.Logf("after 64 MiB of heap: %+v", d)
	if d.Heap < 60<<20 || !raceEnabled && (d.Mapped > 1<<20 || d.Mapped < -1<<20) {
		t.Errorf("64 MiB of heap: growth %+v, want Heap ≈ 64 MiB and Mapped ≈ 0", d)
	}
	var mrs [][]byte
	for range 64 {
		b, err := verbs.AllocMemory(1 << 20)
		if err != nil {
			t.Fatal(err)
		}
		mrs = append(mrs, b)
	}
	mapped, err := sampleMemory()
	if err != nil {
		t.Fatal(err)
	}
	d = mapped.sub(heap)
	t.Logf("after 64 MiB of mmap: %+v", d)
	if d.Mapped < 63<<20 || d.Mapped > 65<<20 {
		t.Errorf("64 MiB mapped: growth %+v, want Mapped ≈ 64 MiB", d)
	}
	for _, b := range mrs {
		_ = verbs.FreeMemory(b)
	}
	sink = nil
}
