package engine

import (
	"testing"

	"github.com/rdmavisor/rdmavisor/internal/engine/format"
	"github.com/rdmavisor/rdmavisor/internal/vqpn"
)

// The bit-packed integers round-trip: a buffer's slot through its class and
// index, through a send's tag (format.Tag, which has room for the slot's
// bits) and a receive's wr_id, and through a ring entry.
func TestPackedTypes(t *testing.T) {
	id := vqpn.MakeID(0xabcdef, 7)
	for _, s := range []bufSlot{makeSlot(0, 0), makeSlot(3, 12345), makeSlot(15, 1<<slotIndexBits-1)} {
		if got := makeSlot(s.class(), s.index()); got != s {
			t.Fatalf("slot %#x: class %d index %d rebuild %#x", uint32(s), s.class(), s.index(), uint32(got))
		}
		_, tag := format.SplitWRID((format.TagOf(uint32(s)) | format.TagSent | format.TagGather).WRID(id))
		if bufSlot(tag.Slot()) != s {
			t.Fatalf("slot %#x through a tag: %#x", uint32(s), tag.Slot())
		}
		if bufSlot(format.RecvSlot(format.RecvWRID(uint32(s)))) != s {
			t.Fatalf("receive wr_id of %#x", uint32(s))
		}
		for _, n := range []uint32{0, 1, 16 << 10, ^uint32(0)} {
			if e := newEntry(s, n); e.slot() != s || e.len() != n {
				t.Fatalf("ring entry (%#x, %d): (%#x, %d)", uint32(s), n, uint32(e.slot()), e.len())
			}
		}
	}
	if e := newEntry(opMarker, 0); e.slot() != opMarker {
		t.Fatalf("opMarker entry: %#x", uint32(e.slot()))
	}
}

// A pool whose slots a send tag cannot hold is refused.
func TestPoolClassLimit(t *testing.T) {
	specs := make([]classSpec, format.TagSlotMask>>slotIndexBits+2)
	for i := range specs {
		specs[i] = classSpec{size: 64, n: 1}
	}
	if _, err := newBufPool(nil, specs); err == nil {
		t.Fatalf("%d classes accepted", len(specs))
	}
}
