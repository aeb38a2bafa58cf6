package format

import (
	"testing"

	"github.com/rdmavisor/rdmavisor/internal/vqpn"
)

// A tag round-trips through wr_id with the vconn's ID, and its flags never
// reach into its slot.
func TestTag(t *testing.T) {
	id := vqpn.MakeID(0xabcdef, 7)
	for _, s := range []uint32{0, 3<<24 | 12345, TagSlotMask} {
		for _, f := range []Tag{0, TagSent, TagFin | TagShared, TagSent | TagFin | TagShared | TagGather} {
			tag := TagOf(s) | f
			gotID, got := SplitWRID(tag.WRID(id))
			if gotID != id || got.Slot() != s || got&^TagSlotMask != f {
				t.Fatalf("slot %#x flags %#x: wr_id gives %v, slot %#x, flags %#x", s, uint32(f), gotID, got.Slot(), uint32(got&^TagSlotMask))
			}
			rt := Retag(tag.WRID(id), TagShared, TagSent)
			if rid, got := SplitWRID(rt); rid != id || got.Slot() != s || got.Has(TagSent) || !got.Has(TagShared) || got.Has(TagFin) != f.Has(TagFin) || got.Has(TagGather) != f.Has(TagGather) {
				t.Fatalf("retag of %#x: %#x", uint32(tag), uint32(got))
			}
		}
		if RecvSlot(RecvWRID(s)) != s {
			t.Fatalf("receive wr_id of %#x", s)
		}
	}
	// A slot wider than the mask loses its top bits rather than set flags.
	if tag := TagOf(^uint32(0)); tag.Has(TagSent | TagFin | TagShared | TagGather) {
		t.Fatalf("TagOf(^0) = %#x: a slot set flags", uint32(tag))
	}
}

// FuzzTag: any slot and flags survive the trip through a wr_id.
func FuzzTag(f *testing.F) {
	f.Add(uint32(0), uint32(0), uint32(1))
	f.Add(uint32(TagSlotMask), uint32(TagSent|TagGather), uint32(0xffffff))
	f.Fuzz(func(t *testing.T, slot, flags, vq uint32) {
		id := vqpn.MakeID(vqpn.VQPN(vq&0xffffff), vqpn.Gen(vq>>24))
		f := Tag(flags) &^ TagSlotMask
		gotID, got := SplitWRID((TagOf(slot) | f).WRID(id))
		if gotID != id || got.Slot() != slot&TagSlotMask || got&^TagSlotMask != f {
			t.Fatalf("slot %#x flags %#x id %v: got %v, %#x", slot, uint32(f), id, gotID, uint32(got))
		}
	})
}
