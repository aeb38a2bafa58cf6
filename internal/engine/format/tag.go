package format

import "github.com/rdmavisor/rdmavisor/internal/vqpn"

// Tag is what a send's wr_id carries below the vconn's ID (vqpn.WRID):
// the buffer's slot, and above it what the completion must do, so the
// completion need not read the buffer back. It never leaves the node, but
// it is a format all the same: the poller that posts and the one that
// completes must read it alike.
type Tag uint32

const (
	TagSent   Tag = 1 << 31 // the last chunk of a data message: count it sent
	TagFin    Tag = 1 << 30 // a FIN
	TagShared Tag = 1 << 29 // a shared buffer (engine bufPool.share): unref, not put
	TagGather Tag = 1 << 28 // a gathered bundle's header buffer: free its messages' too

	// TagSlotMask is the slot's bits: 16 classes of 2^24 buffers.
	TagSlotMask = 1<<28 - 1
)

// TagOf is the tag of a send of buffer slot with nothing to do but free it.
func TagOf(slot uint32) Tag { return Tag(slot) & TagSlotMask }

func (t Tag) Slot() uint32 { return uint32(t & TagSlotMask) }

func (t Tag) Has(f Tag) bool { return t&f != 0 }

// WRID is the wr_id of vconn id's work request with this tag.
func (t Tag) WRID(id vqpn.ID) uint64 { return vqpn.WRID(id, uint32(t)) }

// SplitWRID reads a send's wr_id back.
func SplitWRID(wrid uint64) (vqpn.ID, Tag) {
	id, t := vqpn.SplitWRID(wrid)
	return id, Tag(t)
}

// Retag sets and clears flags of a send's wr_id.
func Retag(wrid uint64, set, clear Tag) uint64 {
	id, t := SplitWRID(wrid)
	return (t&^clear | set).WRID(id)
}

// RecvWRID is the wr_id of a receive into buffer slot; RecvSlot reads it
// back.
func RecvWRID(slot uint32) uint64 { return uint64(slot) }

func RecvSlot(wrid uint64) uint32 { return uint32(wrid) }
