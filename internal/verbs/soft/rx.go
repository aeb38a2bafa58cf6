package soft

import (
	"github.com/rdmavisor/rdmavisor/internal/verbs"
	"github.com/rdmavisor/rdmavisor/internal/verbs/soft/roce"
)

// rxState belongs to a device's receive loop.
type rxState struct {
	dev   *Device
	tx    *txq // responder output (ACKs, NAKs, read responses), sent per batch
	reqTx *txq // requester output triggered by ACKs, sent before the QP unlocks
	hdr   roce.Header
	owed  *qp  // QPs owing a coalesced ACK, linked through qp.ackNext
	nic   *nic // the NIC model, if the device has one
}

// handle processes one packet. Anything malformed or unexpected is dropped
// and counted; nothing a peer sends can panic the device or corrupt a QP.
// sport is the UDP port it came from (0: the network's port).
func (rx *rxState) handle(b []byte, src verbs.GID, sport uint16) {
	d := rx.dev
	d.stats.rxPackets.Add(1)
	h := &rx.hdr
	payload, err := roce.Decode(b, h, d.source(src, sport), d.self)
	if err != nil {
		d.stats.rxMalformed.Add(1)
		return
	}
	if rx.nic != nil {
		rx.nic.charge(h.DestQPN, len(b))
	}
	q := d.lookupQP(h.DestQPN)
	if q == nil {
		d.stats.rxUnknownQP.Add(1)
		return
	}
	q.mu.Lock()
	defer q.mu.Unlock()
	if q.closed {
		d.stats.rxUnknownQP.Add(1)
		return
	}
	switch q.typ {
	case verbs.QPTypeUD:
		if h.Opcode.Transport() != verbs.QPTypeUD {
			d.stats.rxWrongSource.Add(1)
			return
		}
		if q.state != verbs.QPStateRTR && q.state != verbs.QPStateRTS {
			d.stats.rxWrongState.Add(1)
			return
		}
		q.respondUD(h, payload, src, len(b))
	case verbs.QPTypeUC:
		if h.Opcode.Transport() != verbs.QPTypeUC || src != q.attr.AH.DGID {
			d.stats.rxWrongSource.Add(1)
			return
		}
		if q.state != verbs.QPStateRTR && q.state != verbs.QPStateRTS {
			d.stats.rxWrongState.Add(1)
			return
		}
		q.respondUC(h, payload)
	case verbs.QPTypeRC:
		if h.Opcode.Transport() != verbs.QPTypeRC || src != q.attr.AH.DGID {
			d.stats.rxWrongSource.Add(1)
			return
		}
		response := h.Opcode.IsResponse()
		switch {
		case response && q.state == verbs.QPStateRTS:
			if h.Opcode.IsAck() {
				q.onAck(rx.reqTx, h)
			} else {
				q.onReadResponse(rx.reqTx, h, payload)
			}
			rx.reqTx.flush()
		case !response && (q.state == verbs.QPStateRTR || q.state == verbs.QPStateRTS):
			q.respondRC(rx, h, payload)
		default:
			d.stats.rxWrongState.Add(1)
		}
	}
}

// owe records that q must send a coalesced ACK at the end of the batch.
func (rx *rxState) owe(q *qp) {
	if q.ackOwed {
		return
	}
	q.ackOwed = true
	q.ackNext = rx.owed
	rx.owed = q
}

// endBatch sends one ACK per QP that asked for one in this batch, for the
// newest PSN it executed, then everything the batch produced.
func (rx *rxState) endBatch() {
	for q := rx.owed; q != nil; {
		next := q.ackNext
		q.ackNext, q.ackOwed = nil, false
		q.mu.Lock()
		if !q.closed && (q.state == verbs.QPStateRTR || q.state == verbs.QPStateRTS) {
			q.sendAck(rx.tx, roce.AckSyndrome(roce.CreditsInvalid), psnAdd(q.resp.epsn, psnMask))
		}
		q.mu.Unlock()
		q = next
	}
	rx.owed = nil
	rx.tx.flush()
}
