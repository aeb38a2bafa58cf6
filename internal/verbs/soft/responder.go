package soft

import (
	"encoding/binary"

	"github.com/rdmavisor/rdmavisor/internal/verbs"
	"github.com/rdmavisor/rdmavisor/internal/verbs/soft/roce"
)

// responder is the receive side of a QP.
type responder struct {
	epsn    uint32 // expected PSN
	msn     uint32 // messages completed, reported in AETH
	nakSent bool   // a NAK for epsn is out; don't send another until it moves

	// The message being received.
	inSend  bool
	inWrite bool
	hasRecv bool // recv holds a receive WR taken for the current (or a dropped UC) message
	recv    verbs.RecvWR
	recvOff uint32
	wmr     *mr
	wva     uint64
	wleft   uint32
	wlen    uint32
	ucDrop  bool // UC: drop packets until the next FIRST or ONLY

	reads readResources // RC: the READs it may answer again
}

// respondRC executes an RC request packet. Called from the receive loop with
// q.mu held.
func (q *qp) respondRC(rx *rxState, h *roce.Header, payload []byte) {
	r := &q.resp
	d := psnDiff(h.PSN, r.epsn)
	op := h.Opcode
	if d > 0 {
		q.dev.stats.rxOutOfSequence.Add(1)
		if !r.nakSent {
			r.nakSent = true
			q.sendAck(rx.tx, roce.NakSyndrome(roce.NakPSNSequence), r.epsn)
		}
		return
	}
	if d < 0 {
		q.respondDuplicate(rx, h)
		return
	}

	// In sequence: the opcode must continue the message in progress, or
	// start one (a read request is a message of its own).
	if !r.continues(op) {
		q.responderError(rx, roce.NakInvalidRequest, h.PSN, verbs.WCWRFlushErr)
		return
	}
	last := op.EndsMessage()
	if !last && uint32(len(payload)) != q.mtu {
		// Only the last packet of a message may be short.
		q.responderError(rx, roce.NakInvalidRequest, h.PSN, verbs.WCWRFlushErr)
		return
	}

	var ok bool
	switch {
	case op.IsSend():
		ok = q.receiveSend(rx, h, payload, last)
	case op.IsWrite():
		ok = q.receiveWrite(rx, h, payload, last)
	case op.IsReadRequest():
		ok = q.executeRead(rx, h)
	}
	if !ok {
		return
	}
	if last && !op.IsReadRequest() {
		r.msn = psnAdd(r.msn, 1)
	}
	r.epsn = psnAdd(r.epsn, 1)
	r.nakSent = false
	if h.AckReq && !op.IsReadRequest() {
		rx.owe(q)
	}
}

// respondDuplicate answers a request behind the expected PSN.
func (q *qp) respondDuplicate(rx *rxState, h *roce.Header) {
	q.dev.stats.rxDuplicate.Add(1)
	if h.Opcode.IsReadRequest() {
		// A read may be asked again when its response was lost: one the
		// responder executed is executed again (IBA 9.9.2.1), from the
		// PSN asked; anything else is dropped, as is one whose region
		// is gone, as rxe drops them.
		if !q.resp.reads.replay(h.PSN, h.RKey, h.VA, h.DMALen) {
			q.dev.stats.rxDupReadDropped.Add(1)
			return
		}
		if m, va, ok := q.checkRemote(h.RKey, h.VA, h.DMALen, verbs.AccessRemoteRead); ok {
			q.sendReadResponses(rx.tx, m, va, h.DMALen, h.PSN)
		}
		return
	}
	// A duplicate SEND or WRITE is acknowledged again whether it asks or
	// not (IBA C9-105; rxe ACKs every one): the requester may have lost
	// our ACK and retransmitted packets that do not ask.
	rx.owe(q)
}

// receiveSend places a SEND packet in the receive WR it takes or holds;
// false if the request ended there (an RNR NAK or an error).
func (q *qp) receiveSend(rx *rxState, h *roce.Header, payload []byte, last bool) bool {
	r := &q.resp
	if !r.hasRecv {
		if !q.takeRecv(&r.recv) {
			q.rnrNak(rx, h.PSN)
			return false
		}
		r.hasRecv = true
		r.recvOff = 0
	}
	if !scatter(q, r.recv.SG[:min(int(r.recv.NumSGE), verbs.MaxSGE)], r.recvOff, payload) {
		status := verbs.WCLocLenErr
		if uint64(r.recvOff)+uint64(len(payload)) <= r.recv.Len() {
			status = verbs.WCLocProtErr
		}
		q.responderError(rx, roce.NakInvalidRequest, h.PSN, status)
		return false
	}
	r.recvOff += uint32(len(payload))
	r.inSend = !last
	if last {
		q.completeRecv(h.Opcode.HasImm(), h, verbs.WCRecv, r.recvOff)
	}
	return true
}

// receiveWrite writes an RDMA WRITE packet; false if the request ended
// there.
func (q *qp) receiveWrite(rx *rxState, h *roce.Header, payload []byte, last bool) bool {
	r := &q.resp
	op := h.Opcode
	// The first packet's RETH is checked before a receive is taken for
	// the immediate, and takes effect only once one is held.
	var m *mr
	var va uint64
	if op.HasRETH() {
		var ok bool
		if m, va, ok = q.checkRemote(h.RKey, h.VA, h.DMALen, verbs.AccessRemoteWrite); !ok {
			q.responderError(rx, roce.NakRemoteAccess, h.PSN, verbs.WCWRFlushErr)
			return false
		}
	}
	if op.HasImm() && !r.hasRecv && !q.peekRecv(rx, h.PSN) {
		return false
	}
	if op.HasRETH() {
		r.wmr, r.wva, r.wleft, r.wlen = m, va, h.DMALen, h.DMALen
	}
	if !q.writePayload(rx, h, payload, last) {
		return false
	}
	r.inWrite = !last
	if op.HasImm() {
		q.completeRecv(true, h, verbs.WCRecvRDMAWithImm, r.wlen)
	}
	return true
}

// executeRead answers a new READ request and keeps it to answer again;
// false if it failed.
func (q *qp) executeRead(rx *rxState, h *roce.Header) bool {
	r := &q.resp
	if len(r.reads.res) == 0 {
		// max_dest_rd_atomic 0: the QP takes no reads (rxe:
		// RESPST_ERR_TOO_MANY_RDMA_ATM_REQ, an invalid request).
		q.responderError(rx, roce.NakInvalidRequest, h.PSN, verbs.WCWRFlushErr)
		return false
	}
	m, va, ok := q.checkRemote(h.RKey, h.VA, h.DMALen, verbs.AccessRemoteRead)
	if !ok {
		q.responderError(rx, roce.NakRemoteAccess, h.PSN, verbs.WCWRFlushErr)
		return false
	}
	// The read is a message: its responses carry the MSN that counts it,
	// as rxe's do.
	r.msn = psnAdd(r.msn, 1)
	if !q.sendReadResponses(rx.tx, m, va, h.DMALen, h.PSN) {
		q.responderError(rx, roce.NakRemoteAccess, h.PSN, verbs.WCWRFlushErr)
		return false
	}
	n := q.npackets(h.DMALen)
	r.reads.record(h.PSN, n, h.RKey, h.VA, h.DMALen)
	r.epsn = psnAdd(r.epsn, n-1)
	return true
}

// continues reports whether op may come next at the responder: the next
// packet of the SEND or WRITE in progress, or, between messages, the start
// of one (a READ request is a whole message).
func (r *responder) continues(op roce.Opcode) bool {
	switch {
	case r.inSend:
		return op.IsSend() && !op.StartsMessage()
	case r.inWrite:
		return op.IsWrite() && !op.StartsMessage()
	}
	return op.StartsMessage()
}

// peekRecv makes sure a receive WR is held for a write with immediate,
// before any of it executes; without one the packet is RNR NAKed.
func (q *qp) peekRecv(rx *rxState, psn uint32) bool {
	if q.takeRecv(&q.resp.recv) {
		q.resp.hasRecv = true
		return true
	}
	q.rnrNak(rx, psn)
	return false
}

// writePayload places a write packet's payload at the write's next address.
func (q *qp) writePayload(rx *rxState, h *roce.Header, payload []byte, last bool) bool {
	r := &q.resp
	n := uint32(len(payload))
	if n > r.wleft || last && n != r.wleft {
		// More or less data than the RETH announced.
		q.responderError(rx, roce.NakInvalidRequest, h.PSN, verbs.WCWRFlushErr)
		return false
	}
	if n == 0 {
		return true
	}
	// The region may have been deregistered since the write's first packet.
	if q.dev.lookupKey(r.wmr.key) != r.wmr || !r.wmr.copyIn(r.wva, payload) {
		q.responderError(rx, roce.NakRemoteAccess, h.PSN, verbs.WCWRFlushErr)
		return false
	}
	r.wva += uint64(n)
	r.wleft -= n
	return true
}

// checkRemote validates an rkey for len bytes at va with the given access:
// the region exists, belongs to this QP's PD, allows the access, contains
// the range, and the QP itself allows remote access of that kind. A
// window's key is checked against its binding (checkWindow). It returns
// the region and the virtual address in it the request starts at.
func (q *qp) checkRemote(rkey uint32, va uint64, n uint32, access verbs.Access) (*mr, uint64, bool) {
	if n == 0 {
		return nil, va, true // IBA C9-88: a zero-length RDMA request is not validated
	}
	if q.attr.AccessFlags&access == 0 {
		return nil, 0, false
	}
	if isMWKey(rkey) {
		return q.checkWindow(rkey, va, n, access)
	}
	m := q.dev.lookupKey(rkey)
	if m == nil || m.pd != q.pd || m.access&access == 0 {
		return nil, 0, false
	}
	if _, ok := m.span(va, uint64(n)); !ok {
		return nil, 0, false
	}
	return m, va, true
}

// completeRecv completes the held receive WR.
func (q *qp) completeRecv(withImm bool, h *roce.Header, op verbs.WCOpcode, byteLen uint32) {
	r := &q.resp
	// WCWithGRH as the kernel's rxe sets it on RC and UC receives too: a
	// RoCEv2 packet's IP header is its GRH. Only UD writes it into the
	// buffer; an engine that took the flag to mean that lost every RC
	// message on rxe.
	wc := verbs.WC{WRID: r.recv.WRID, Status: verbs.WCSuccess, Opcode: op, ByteLen: byteLen, QPN: q.qpn, SrcQP: q.attr.DestQPN, Flags: verbs.WCWithGRH}
	if withImm {
		wc.Flags |= verbs.WCWithImm
		wc.ImmData = h.Imm
	}
	r.hasRecv = false
	q.recvCQ.push(&wc, h.SE)
}

func (q *qp) rnrNak(rx *rxState, psn uint32) {
	q.dev.stats.rnrNaksSent.Add(1)
	q.resp.nakSent = true // later packets of the message are not NAKed again
	q.sendAck(rx.tx, roce.RNRNakSyndrome(q.attr.MinRNRTimer), psn)
}

// responderError handles a request the responder cannot execute: it NAKs,
// completes the held receive with status, and the QP goes to ERR (IBA
// class B/C/D responder errors; hardware raises a QP access or request
// error event). Outstanding sends of this QP are flushed as well.
func (q *qp) responderError(rx *rxState, nakCode roce.NakCode, psn uint32, recvStatus verbs.WCStatus) {
	q.sendAck(rx.tx, roce.NakSyndrome(nakCode), psn)
	if q.resp.hasRecv {
		wc := verbs.WC{WRID: q.resp.recv.WRID, Status: recvStatus, Opcode: verbs.WCRecv, QPN: q.qpn}
		q.resp.hasRecv = false
		q.recvCQ.push(&wc, false)
	}
	q.toErr(verbs.WCWRFlushErr)
}

// sendAck queues an ACK or NAK with the given AETH syndrome.
func (q *qp) sendAck(tx *txq, syndrome uint8, psn uint32) {
	h := roce.Header{
		Opcode:   roce.RCAck,
		PKey:     0xffff,
		DestQPN:  q.attr.DestQPN,
		PSN:      psn,
		Syndrome: syndrome,
		MSN:      q.resp.msn,
	}
	switch kind, _ := roce.ParseSyndrome(syndrome); kind {
	case roce.KindAck:
		q.dev.stats.acksSent.Add(1)
	case roce.KindNak:
		q.dev.stats.naksSent.Add(1)
	}
	p := tx.next()
	n, err := roce.Encode(p.Buf, &h, nil, q.dev.self, q.dev.endpoint(q.attr.AH.DGID))
	if err != nil {
		return
	}
	p.N, p.Addr = n, q.attr.AH.DGID
	tx.commit()
}

// sendReadResponses answers a read of n bytes at va with PSNs from psn;
// false if the region closed since its key was checked.
func (q *qp) sendReadResponses(tx *txq, m *mr, va uint64, n uint32, psn uint32) bool {
	// The responses copy out of the region: it may not be unmapped
	// meanwhile.
	if m != nil {
		if !m.acquire() {
			return false
		}
		defer m.release()
	}
	mtu := q.mtu
	count := q.npackets(n)
	for i := uint32(0); i < count; i++ {
		off := i * mtu
		plen := min(mtu, n-off)
		var op roce.Opcode
		switch {
		case count == 1:
			op = roce.RCReadResponseOnly
		case i == 0:
			op = roce.RCReadResponseFirst
		case i == count-1:
			op = roce.RCReadResponseLast
		default:
			op = roce.RCReadResponseMiddle
		}
		h := roce.Header{
			Opcode:   op,
			PKey:     0xffff,
			DestQPN:  q.attr.DestQPN,
			PSN:      psnAdd(psn, i),
			Syndrome: roce.AckSyndrome(roce.CreditsInvalid),
			MSN:      q.resp.msn,
		}
		var src []byte
		if plen > 0 {
			var ok bool
			if src, ok = m.span(va+uint64(off), uint64(plen)); !ok {
				return false
			}
		}
		p := tx.next()
		k, err := roce.Encode(p.Buf, &h, src, q.dev.self, q.dev.endpoint(q.attr.AH.DGID))
		if err != nil {
			return false
		}
		p.N, p.Addr = k, q.attr.AH.DGID
		tx.commit()
	}
	return true
}

// respondUC executes a UC request packet: no ACKs, and a gap or a missing
// receive drops the whole message, never part of it.
func (q *qp) respondUC(h *roce.Header, payload []byte) {
	r := &q.resp
	op := h.Opcode
	starts := op.StartsMessage()
	if h.PSN != r.epsn || r.ucDrop {
		if !starts {
			if h.PSN != r.epsn {
				q.dev.stats.rxOutOfSequence.Add(1)
			}
			r.ucDrop = true
			r.inSend, r.inWrite = false, false
			r.epsn = psnAdd(h.PSN, 1)
			return
		}
		// A new message: what was in progress is abandoned; a held receive
		// is kept for this one.
		r.inSend, r.inWrite, r.ucDrop = false, false, false
	}
	r.epsn = psnAdd(h.PSN, 1)
	last := op.EndsMessage()
	if !r.continues(op) || (!last && uint32(len(payload)) != q.mtu) {
		q.dev.stats.rxWrongSource.Add(1)
		r.ucDrop, r.inSend, r.inWrite = true, false, false
		return
	}
	if op.IsSend() {
		q.receiveUCSend(h, payload, starts, last)
	} else {
		q.receiveUCWrite(h, payload, starts, last)
	}
}

// receiveUCSend places a UC SEND packet in the receive WR it takes or
// holds.
func (q *qp) receiveUCSend(h *roce.Header, payload []byte, starts, last bool) {
	r := &q.resp
	if starts {
		if !r.hasRecv && !q.takeRecv(&r.recv) {
			q.dev.stats.rxNoRecvDrop.Add(1)
			r.ucDrop = true
			return
		}
		r.hasRecv = true
		r.recvOff = 0
	}
	if !scatter(q, r.recv.SG[:min(int(r.recv.NumSGE), verbs.MaxSGE)], r.recvOff, payload) {
		// Local length or protection error: the receive completes in
		// error and the QP goes to ERR.
		wc := verbs.WC{WRID: r.recv.WRID, Status: verbs.WCLocLenErr, Opcode: verbs.WCRecv, QPN: q.qpn}
		r.hasRecv = false
		q.recvCQ.push(&wc, false)
		q.toErr(verbs.WCWRFlushErr)
		return
	}
	r.recvOff += uint32(len(payload))
	r.inSend = !last
	if last {
		q.completeRecv(h.Opcode.HasImm(), h, verbs.WCRecv, r.recvOff)
	}
}

// receiveUCWrite writes a UC RDMA WRITE packet; a bad key, a missing
// receive for the immediate or a wrong length drops the message.
func (q *qp) receiveUCWrite(h *roce.Header, payload []byte, starts, last bool) {
	r := &q.resp
	if starts {
		m, va, ok := q.checkRemote(h.RKey, h.VA, h.DMALen, verbs.AccessRemoteWrite)
		if !ok {
			// UC has no NAK: the message is dropped.
			q.dev.stats.rxWrongSource.Add(1)
			r.ucDrop = true
			return
		}
		r.wmr, r.wva, r.wleft, r.wlen = m, va, h.DMALen, h.DMALen
	}
	imm := h.Opcode.HasImm()
	if imm && !r.hasRecv {
		if !q.takeRecv(&r.recv) {
			q.dev.stats.rxNoRecvDrop.Add(1)
			r.ucDrop, r.inWrite = true, false
			return
		}
		r.hasRecv = true
	}
	n := uint32(len(payload))
	if n > r.wleft || last && n != r.wleft {
		r.ucDrop, r.inWrite = true, false
		return
	}
	if n > 0 {
		if q.dev.lookupKey(r.wmr.key) != r.wmr || !r.wmr.copyIn(r.wva, payload) {
			r.ucDrop, r.inWrite = true, false
			return
		}
	}
	r.wva += uint64(n)
	r.wleft -= n
	r.inWrite = !last
	if imm {
		q.completeRecv(true, h, verbs.WCRecvRDMAWithImm, r.wlen)
	}
}

// respondUD delivers a UD datagram: 40 bytes of GRH, then the payload.
// pktLen is the UDP payload's length (BTH to ICRC).
func (q *qp) respondUD(h *roce.Header, payload []byte, src verbs.GID, pktLen int) {
	if h.QKey != q.attr.QKey {
		q.dev.stats.rxQKeyMismatch.Add(1)
		return
	}
	var wr verbs.RecvWR
	if !q.takeRecv(&wr) {
		q.dev.stats.rxNoRecvDrop.Add(1)
		return
	}
	total := uint32(verbs.GRHSize + len(payload))
	wc := verbs.WC{WRID: wr.WRID, Opcode: verbs.WCRecv, QPN: q.qpn, SrcQP: h.SrcQPN, Flags: verbs.WCWithGRH, ByteLen: total}
	if h.Opcode.HasImm() {
		wc.Flags |= verbs.WCWithImm
		wc.ImmData = h.Imm
	}
	var grh [verbs.GRHSize]byte
	putNetworkHeader(&grh, src, q.dev.gid, pktLen)
	sgl := wr.SG[:min(int(wr.NumSGE), verbs.MaxSGE)]
	if uint64(total) > wr.Len() {
		wc.Status = verbs.WCLocLenErr
	} else if !scatter(q, sgl, 0, grh[:]) || !scatter(q, sgl, verbs.GRHSize, payload) {
		wc.Status = verbs.WCLocProtErr
	}
	q.recvCQ.push(&wc, h.SE)
}

// putNetworkHeader writes the GRH space of a UD receive as rxe does
// (build_rdma_network_hdr): the IP header the datagram came in, which is an
// IPv6 header over all 40 bytes, or 20 zero bytes and then the IPv4 header
// (union rdma_network_hdr). The socket does not show the received header,
// so its TOS, TTL and id are what our peers send: 0, 64 and 0 with DF.
func putNetworkHeader(grh *[verbs.GRHSize]byte, src, dst verbs.GID, pktLen int) {
	*grh = [verbs.GRHSize]byte{}
	if s4, d4 := src.Addr(), dst.Addr(); s4.Is4() && d4.Is4() {
		ip := grh[20:40]
		ip[0] = 0x45
		binary.BigEndian.PutUint16(ip[2:], uint16(20+8+pktLen))
		binary.BigEndian.PutUint16(ip[6:], 0x4000) // DF
		ip[8], ip[9] = 64, 17                      // TTL, UDP
		a, b := s4.As4(), d4.As4()
		copy(ip[12:16], a[:])
		copy(ip[16:20], b[:])
		var sum uint32
		for i := 0; i < 20; i += 2 {
			sum += uint32(binary.BigEndian.Uint16(ip[i:]))
		}
		sum = sum&0xffff + sum>>16
		sum += sum >> 16
		binary.BigEndian.PutUint16(ip[10:], ^uint16(sum))
		return
	}
	grh[0] = 0x60 // IP version 6
	binary.BigEndian.PutUint16(grh[4:], uint16(8+pktLen))
	grh[6] = 17 // next header: UDP
	grh[7] = 64
	copy(grh[8:24], src[:])
	copy(grh[24:40], dst[:])
}
