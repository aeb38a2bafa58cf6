package engine

import (
	"encoding/binary"

	"github.com/rdmavisor/rdmavisor/internal/engine/format"
	"github.com/rdmavisor/rdmavisor/internal/engine/reliable"
	"github.com/rdmavisor/rdmavisor/internal/transport"
	"github.com/rdmavisor/rdmavisor/internal/verbs"
	"github.com/rdmavisor/rdmavisor/internal/vqpn"
)

// Bundles: when an Auto vconn has several whole datagram-sized messages
// queued, the poller packs as many as fit a chunk into one datagram, as
// SCTP bundles chunks and TCP coalesces writes: one work request, one
// completion, a packet or a few, one receive buffer, where each message
// alone costs all of those. Only what is already queued is bundled;
// nothing waits for company, so a lone message goes as it came.
//
// Bundling is Auto's, as choosing the transport by size is: the engine
// decides how an Auto vconn's messages travel. The fixed transports post
// what they are given, a work request per message (per chunk), so that
// what an application asks for is what the device sees.
//
// A bundle is a format.Bundle header (length: the bytes after it; seq: its
// first message's; imm: how many messages) followed by the messages, each
// with its own format.Data header, as the sender queued them: copied after the
// header, or, for longer messages, gathered from their own buffers by the
// work request (gatherMin). It is acknowledged and resent whole, and its
// receive buffer is shared by the messages (bufPool.share) and reposted
// when the last is released. It takes one receive credit, not one per
// message: a credit stands for a receive buffer, as eRPC's stand for
// packets, so a reader behind by a window of credits holds a window of
// buffers whatever they carry, and a sender that runs out of credits
// queues, and so bundles, more messages per credit.

// maxBundle is the most messages one bundle carries: a ring's worth, which
// is what the format allows (the constant expressions below fail to
// compile if the two part).
const maxBundle = ringSize

const _, _ = uint(maxBundle - format.MaxBundle), uint(format.MaxBundle - maxBundle)

// gatherMin is the length (header included) from which queued messages
// are bundled by gathering rather than copied: the bundle's work request
// lists their buffers after its header (up to verbs.MaxSGE-1 of them), and
// the device reads them as it sends, as a NIC does by DMA. Shorter ones
// are copied, a ring's worth at most: copying a kilobyte or two costs less
// than the work requests it saves, and a bundle of them would need more
// scatter/gather entries than a QP has. Measured on the soft provider, one
// vconn, auto over uc: 1 KiB messages copied 15 to a bundle ran 1.11-1.18x,
// gathered 3 to a bundle 0.88-1.11x (the low end when the host was slow);
// 2 KiB ones copied 0.75x, gathered 0.91x.
const gatherMin = 2048

// bundle packs the datagram-sized messages at the head of Auto vconn vc's
// ring, as many as fit a chunk, into one datagram on its UC QP (which takes
// one credit); it reports how many it took, 0 when fewer than two fit or
// no buffer is free.
func (p *poller) bundle(vc *VConn, remote vqpn.ID) int {
	e := p.e
	if vc.dq.path.OnRC() {
		return 0 // a probe goes alone (reliable.Path)
	}
	head, _ := vc.ring.at(&vc.ents, 0)
	gather := head.len() >= gatherMin
	limit := maxBundle
	if gather {
		limit = min(limit, verbs.MaxSGE-1)
	}
	room := e.cfg.ChunkSize - format.HeaderLen
	k, total := 0, 0
	for k < limit {
		ent, ok := vc.ring.at(&vc.ents, k)
		if !ok {
			break
		}
		slot, n := ent.slot(), ent.len()
		if slot == opMarker || total+int(n) > room {
			break
		}
		b := format.Raw(e.pool.bytes(slot))
		if b.Type() != format.Data || !b.Whole() || !vc.autoDgram(n) {
			break
		}
		total += int(n)
		k++
	}
	if k < 2 {
		return 0
	}
	size := format.HeaderLen + total
	if gather {
		size = format.HeaderLen + gatherLen*k
	}
	out, ok := e.pool.get(e.pool.class(size))
	if !ok {
		return 0
	}
	b := e.pool.bytes(out)
	off := format.HeaderLen
	var seq uint32
	for i := 0; i < k; i++ {
		ent, _ := vc.ring.peek(&vc.ents)
		slot, n := ent.slot(), ent.len()
		if i == 0 {
			seq = format.Raw(e.pool.bytes(slot)).Seq()
		}
		if gather {
			putGathered(b, i, slot, n)
		} else {
			off += copy(b[off:], e.pool.bytes(slot)[:n])
			e.pool.put(slot)
		}
		vc.ring.pop()
		p.took(vc)
	}
	h := format.BundleHeader(seq, uint32(k), uint32(total))
	h.Put(b)
	vc.stampCredit(b)
	e.stats.msgsSent.Add(uint64(k - 1)) // its completion counts one
	p.countSent(transport.Auto, k, total-k*format.HeaderLen)
	e.stats.bundled.Add(uint64(k))
	if gather {
		e.stats.gathered.Add(uint64(k))
	}
	p.sendReliable(vc, remote, reliable.Datagram{Seq: seq, Last: seq + uint32(k-1), Buf: uint32(out), Len: uint32(size), Gather: gather})
	return k
}

// bundleWR is the work request of a datagram: a bundle, or one message.
func (p *poller) bundleWR(vc *VConn, remote vqpn.ID, u *reliable.Datagram) verbs.SendWR {
	slot := bufSlot(u.Buf)
	if !u.Gather {
		return p.sendWR(vc, remote, slot, u.Len)
	}
	e := p.e
	b := e.pool.bytes(slot)
	k := int(format.Raw(b).Count())
	wr := verbs.SendWR{
		WRID:    (format.TagOf(u.Buf) | format.TagSent | format.TagGather).WRID(vc.id),
		Opcode:  verbs.WRSendWithImm,
		Flags:   verbs.SendSignaled,
		ImmData: vqpn.Imm(remote),
		NumSGE:  uint8(k + 1),
	}
	wr.SG[0] = e.pool.sge(slot, format.HeaderLen)
	for i := range k {
		wr.SG[i+1] = e.pool.sge(gathered(b, i))
	}
	return wr
}

// A gathered bundle's header buffer lists, after its header, the slot and
// length of each of its messages' buffers, gatherLen bytes each.
const gatherLen = 8

func putGathered(b []byte, i int, s bufSlot, n uint32) {
	off := format.HeaderLen + gatherLen*i
	binary.BigEndian.PutUint32(b[off:], uint32(s))
	binary.BigEndian.PutUint32(b[off+4:], n)
}

func gathered(b []byte, i int) (bufSlot, uint32) {
	off := format.HeaderLen + gatherLen*i
	return bufSlot(binary.BigEndian.Uint32(b[off:])), binary.BigEndian.Uint32(b[off+4:])
}

// onBundle delivers the messages of a bundle. The bundle is checked whole
// first: a malformed one fails the vconn and delivers nothing.
func (p *poller) onBundle(vc *VConn, h *format.Header, slot bufSlot, payload []byte) {
	if vc.tr != transport.Auto || slot.class() != p.e.dgramClass || format.CheckBundle(h, payload) != nil {
		p.malformed(vc, slot)
		return
	}
	// The bundle took one credit, as it takes one receive buffer: it comes
	// back with the buffer, after the last of its messages is released.
	credits := uint32(0)
	if vc.reliability().rx.FirstCopy(h.Seq, vc.earlyWindow()) {
		if !vc.takeCredit() {
			p.overrun(vc)
			p.rx.reposts = append(p.rx.reposts, slot)
			return
		}
		credits = 1
	}
	p.e.pool.share(slot, int32(h.Count()))
	for it := format.Bundled(payload); it.Next(); {
		imm, hasImm := it.Header.AppImm()
		vc.deliverSeq(p, it.Header.Seq, Message{vc: vc, Data: it.Data, Imm: imm, HasImm: hasImm, slot: slot, shared: true, credits: credits}, true)
	}
}
