package engine

import "github.com/rdmavisor/rdmavisor/internal/vqpn"

// sendTag is what a send's wr_id carries below the vconn's ID (vqpn.WRID):
// the buffer's slot, and above it what the completion must do, so the
// completion need not read the buffer back.
type sendTag uint32

const (
	tagSent   sendTag = 1 << 31 // the last chunk of a data message: count it sent
	tagFin    sendTag = 1 << 30 // a FIN
	tagShared sendTag = 1 << 29 // a shared buffer (bufPool.share): unref, not put
	tagGather sendTag = 1 << 28 // a gathered bundle's header buffer: free its messages' too

	tagSlotMask = 1<<28 - 1 // the slot's bits: 16 classes of 2^24 buffers
)

// tagOf is the tag of a send of buffer s with nothing to do but free it.
func tagOf(s bufSlot) sendTag { return sendTag(s) & tagSlotMask }

func (t sendTag) slot() bufSlot { return bufSlot(t & tagSlotMask) }

func (t sendTag) has(f sendTag) bool { return t&f != 0 }

// wrID is the wr_id of vconn id's work request with this tag.
func (t sendTag) wrID(id vqpn.ID) uint64 { return vqpn.WRID(id, uint32(t)) }

func splitWRID(wrid uint64) (vqpn.ID, sendTag) {
	id, t := vqpn.SplitWRID(wrid)
	return id, sendTag(t)
}

// retag sets and clears flags of a send's wr_id.
func retag(wrid uint64, set, clear sendTag) uint64 {
	id, t := splitWRID(wrid)
	return (t&^clear | set).wrID(id)
}

// recvWRID is the wr_id of a receive into buffer s; recvSlot reads it back.
func recvWRID(s bufSlot) uint64 { return uint64(s) }

func recvSlot(wrid uint64) bufSlot { return bufSlot(uint32(wrid)) }
