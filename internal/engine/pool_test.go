package engine

import (
	"testing"

	"github.com/rdmavisor/rdmavisor/internal/verbs/soft/wire"
)

// TestPoolShared: a shared buffer goes back to the pool after its last
// owner lets go, not before, and one release too many panics rather than
// hand the buffer to two users.
func TestPoolShared(t *testing.T) {
	a, _ := testEngines(t, wire.Faults{}, Config{})
	p := a.pool
	free := func() int { return int(p.classes[0].n) - p.inUse()[0] }
	before := free()
	slot, ok := p.get(0)
	if !ok {
		t.Fatal("no buffer")
	}
	unref := func() {
		if p.unshare(slot) {
			p.put(slot)
		}
	}
	p.share(slot, 2)
	p.ref(slot) // a retransmission
	for i := 0; i < 2; i++ {
		unref()
		if free() != before-1 {
			t.Fatalf("after %d of 3 owners let go the buffer is free", i+1)
		}
	}
	unref()
	if free() != before {
		t.Fatal("the buffer did not come back after its last owner let go")
	}
	defer func() {
		if recover() == nil {
			t.Error("a fourth release of a buffer shared three ways did not panic")
		}
	}()
	unref()
}
