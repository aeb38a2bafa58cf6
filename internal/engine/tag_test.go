package engine

import (
	"testing"

	"github.com/rdmavisor/rdmavisor/internal/vqpn"
)

// The bit-packed integers round-trip, and a tag's flags never reach into
// its slot.
func TestPackedTypes(t *testing.T) {
	id := vqpn.MakeID(0xabcdef, 7)
	for _, s := range []bufSlot{makeSlot(0, 0), makeSlot(3, 12345), makeSlot(15, 1<<slotIndexBits-1)} {
		if got := makeSlot(s.class(), s.index()); got != s {
			t.Fatalf("slot %#x: class %d index %d rebuild %#x", uint32(s), s.class(), s.index(), uint32(got))
		}
		for _, f := range []sendTag{0, tagSent, tagFin | tagShared, tagSent | tagFin | tagShared | tagGather} {
			tag := tagOf(s) | f
			gotID, got := splitWRID(tag.wrID(id))
			if gotID != id || got.slot() != s || got&^tagSlotMask != f {
				t.Fatalf("slot %#x flags %#x: wr_id gives %v, slot %#x, flags %#x", uint32(s), uint32(f), gotID, uint32(got.slot()), uint32(got&^tagSlotMask))
			}
			rt := retag(tag.wrID(id), tagShared, tagSent)
			if _, got := splitWRID(rt); got.slot() != s || got.has(tagSent) || !got.has(tagShared) || got.has(tagFin) != f.has(tagFin) {
				t.Fatalf("retag of %#x: %#x", uint32(tag), uint32(got))
			}
		}
		if recvSlot(recvWRID(s)) != s {
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
	specs := make([]classSpec, tagSlotMask>>slotIndexBits+2)
	for i := range specs {
		specs[i] = classSpec{size: 64, n: 1}
	}
	if _, err := newBufPool(nil, specs); err == nil {
		t.Fatalf("%d classes accepted", len(specs))
	}
}
