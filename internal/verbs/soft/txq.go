package soft

import (
	"github.com/rdmavisor/rdmavisor/internal/verbs/soft/wire"
)

// txq batches outgoing packets so one wire.Send (one sendmmsg) carries many.
// A txq is used by one goroutine at a time: a requester holding its QP's
// lock, or the receive loop.
type txq struct {
	w     wire.Wire
	pkts  []wire.Packet
	n     int
	stats *Stats
}

func newTxq(w wire.Wire, pktLen, batch int, stats *Stats) *txq {
	t := &txq{w: w, pkts: make([]wire.Packet, batch), stats: stats}
	for i := range t.pkts {
		t.pkts[i].Buf = make([]byte, pktLen)
	}
	return t
}

// next returns the buffer of the next packet, flushing first when the batch
// is full. The caller fills it and calls commit.
func (t *txq) next() *wire.Packet {
	if t.n == len(t.pkts) {
		t.flush()
	}
	return &t.pkts[t.n]
}

func (t *txq) commit() { t.n++ }

func (t *txq) flush() {
	if t.n == 0 {
		return
	}
	sent, err := t.w.Send(t.pkts[:t.n])
	t.stats.txPackets.Add(uint64(sent))
	if err != nil {
		// The packets are lost, as on a broken link; RC recovers by
		// retransmission, UC and UD never promised delivery.
		t.stats.txErrors.Add(1)
	}
	t.n = 0
}
