package engine

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/rdmavisor/rdmavisor/internal/transport"
	"github.com/rdmavisor/rdmavisor/internal/verbs"
	"github.com/rdmavisor/rdmavisor/internal/verbs/soft/roce"
)

// A forged RDMA request at the exact PSN a shared RC QP's responder
// expects, with a key that is not valid, takes the QP to its error state
// (IBA class C responder error; the soft provider does as rxe and NICs
// do). The engine replaces the QP and carries its vconns over (repair.go)
// instead of failing them all.

// forgeBadKey sends, from the spoofing host as from b, an RDMA WRITE with
// a key that names nothing, at the PSN the responder of a's shared QP
// (the one va sends on) expects: nothing travels from b on that QP pair,
// so that is the PSN b's end started with. It returns the QP hit, once
// the request took it to ERR.
func (n *spoofNet) forgeBadKey(t *testing.T, va *VConn) verbs.QP {
	t.Helper()
	va.peer.mu.Lock()
	qp := va.sq.qp
	va.peer.mu.Unlock()
	payload := bytes.Repeat([]byte{0xee}, 64)
	h := roce.Header{Opcode: roce.RCWriteOnly, PKey: 0xffff, DestQPN: qp.QPN(), PSN: qp.Query().RQPSN, AckReq: true,
		VA: 0x10000, RKey: 0xdead00, DMALen: uint32(len(payload))}
	n.inject(t, n.a, &h, payload)
	waitFor(t, func() bool { return qp.State() == verbs.QPStateErr }, "the forged request to fail the QP")
	return qp
}

// completed waits until e's sends of n messages have completed: a QP is
// replaced only once a send completed on it (exchange returns when the
// message arrived, maybe before its acknowledgement).
func completed(t *testing.T, e *Engine, n uint64) {
	t.Helper()
	waitFor(t, func() bool { return e.Stats().MsgsSent >= n }, fmt.Sprintf("%d sends to complete", n))
}

// sendQPN is the QPN of the device QP under va's shared QP now.
func sendQPN(va *VConn) uint32 {
	va.peer.mu.Lock()
	defer va.peer.mu.Unlock()
	return va.sq.qp.QPN()
}

var streamSizes = []int{1, 100, 3000, DefaultChunkSize - 32, DefaultChunkSize + 500, 3*DefaultChunkSize - 200}

// streamMsg is message i of stream j: sizes from one byte to three
// chunks, every byte a function of (j, i, offset).
func streamMsg(j, i int) []byte { return msgOf(j, i, streamSizes[(i+j)%len(streamSizes)]) }

// longMsg is message i of stream j, two or three chunks long.
func longMsg(j, i int) []byte { return msgOf(j, i, streamSizes[4+i%2]) }

func msgOf(j, i, size int) []byte {
	b := make([]byte, size)
	for k := range b {
		b[k] = byte(j*31 + i*7 + k*13 + k>>8)
	}
	copy(b, fmt.Sprintf("%d:%d", j, i))
	return b
}

// TestForgedBadKeyReplacesQP: four vconns stream 300 messages each (one
// byte to three chunks) over the one shared RC QP between two nodes; a
// third of the way through, a spoofer's RDMA WRITE with an invalid key at
// the exact PSN the QP's responder expects takes that QP to ERR. The
// engine replaces it: vconns failed 0, every message arrives once, in
// order, byte for byte, the QP under the vconns is a new one (replaced
// once), and every vconn still works both ways afterwards. The vconns are
// RC, or Auto (messages of up to a chunk go as datagrams on its UC QP, the
// rest as chunks on the RC QP); beside them a UC and a UD vconn, which
// send only control on the RC QP, must not fail either.
func TestForgedBadKeyReplacesQP(t *testing.T) {
	for _, tr := range []transport.Kind{transport.RC, transport.Auto} {
		t.Run(tr.String(), func(t *testing.T) { forgedStream(t, tr) })
	}
}

func forgedStream(t *testing.T, tr transport.Kind) {
	const vconns, msgs = 4, 300
	n := newSpoofNet(t)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	as, bs := pairs(ctx, t, n, vconns, tr)
	// A UC and a UD vconn on the same QP, used before and after the hit.
	ua, ub := pairs(ctx, t, n, 1, transport.UC)
	da, db := pairs(ctx, t, n, 1, transport.UD)
	as, bs = append(as, ua[0], da[0]), append(bs, ub[0], db[0])
	for j := range as {
		if as[j].sq != as[0].sq {
			t.Fatal("the vconns do not share their QP")
		}
		if j >= vconns {
			exchange(ctx, t, as[j], bs[j], 1, func(int) []byte { return []byte("before") })
		}
	}
	third := make(chan struct{})
	var wg sync.WaitGroup
	errs := make(chan error, 2*vconns)
	var received atomic.Int64
	for j := range vconns {
		wg.Add(2)
		go func() {
			defer wg.Done()
			for i := range msgs {
				if err := as[j].Send(ctx, streamMsg(j, i)); err != nil {
					errs <- fmt.Errorf("vconn %d: send %d: %w", j, i, err)
					return
				}
				if j == 0 && i == msgs/3 {
					close(third)
				}
			}
		}()
		go func() {
			defer wg.Done()
			for i := range msgs {
				m, err := bs[j].Recv(ctx)
				if err != nil {
					errs <- fmt.Errorf("vconn %d: message %d of %d: %w", j, i, msgs, err)
					return
				}
				if want := streamMsg(j, i); !bytes.Equal(m.Data, want) {
					errs <- fmt.Errorf("vconn %d: message %d: %d bytes starting %q, want %d starting %q", j, i, len(m.Data), m.Data[:min(8, len(m.Data))], len(want), want[:min(8, len(want))])
					m.Release()
					return
				}
				m.Release()
				received.Add(1)
			}
		}()
	}
	<-third
	hit := n.forgeBadKey(t, as[0]).QPN()
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	failed := 0
	for j := range as {
		for _, vc := range []*VConn{as[j], bs[j]} {
			if vc.Err() != nil {
				failed++
				t.Errorf("%v vconn %v: %v", vc.tr, vc.ID(), vc.Err())
			}
		}
	}
	st := n.a.Stats()
	t.Logf("messages received: %d of %d; vconns failed: %d of %d; QPs replaced: %d; chunks resent and dropped at the receiver: %d",
		received.Load(), vconns*msgs, failed, 2*len(as), st.QPsReplaced, n.b.Stats().ResentDropped)
	if failed != 0 {
		t.Fatalf("vconns failed: %d, want 0", failed)
	}
	if got := received.Load(); got != vconns*msgs {
		t.Fatalf("messages received: %d, want %d", got, vconns*msgs)
	}
	if st.QPsReplaced != 1 {
		t.Fatalf("QPs replaced: %d, want 1 (the forged request did not fail the QP?)", st.QPsReplaced)
	}
	if now := sendQPN(as[0]); now == hit {
		t.Fatalf("the vconns still send on QP %#x, the one hit", hit)
	}
	for j := range as {
		exchange(ctx, t, as[j], bs[j], 2, func(i int) []byte { return fmt.Appendf(nil, "after %d.%d", j, i) })
		exchange(ctx, t, bs[j], as[j], 2, func(i int) []byte { return fmt.Appendf(nil, "back %d.%d", j, i) })
	}
}

// TestForgedBadKeyDuplicatesDropped: the acknowledgements of what three
// vconns send on RC are lost, so the sender holds every message as not
// yet delivered while the receiver has them all; then the forged request
// fails the QP. The replacement resends them all, and the receiver drops
// every one (chunks dropped: all those sent; messages delivered twice: 0).
// 200 messages more on each vconn afterwards, six credit windows, show the
// credits stayed consistent on both sides. RC vconns, and Auto vconns
// whose held messages are longer than a chunk (so all on RC) and whose
// later ones mix datagrams and RC.
func TestForgedBadKeyDuplicatesDropped(t *testing.T) {
	for _, tr := range []transport.Kind{transport.RC, transport.Auto} {
		t.Run(tr.String(), func(t *testing.T) { forgedDuplicates(t, tr) })
	}
}

func forgedDuplicates(t *testing.T, tr transport.Kind) {
	const vconns, held, after = 3, 4, 200
	n := newSpoofNet(t)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	as, bs := pairs(ctx, t, n, vconns, tr)
	msg := streamMsg
	if tr == transport.Auto {
		msg = func(j, i int) []byte {
			if i < held {
				return longMsg(j, i)
			}
			return streamMsg(j, i)
		}
	}
	for j := range vconns {
		// Long: a QP is replaced only once a send completed on it.
		exchange(ctx, t, as[j], bs[j], 1, func(int) []byte { return longMsg(j, 1000) })
	}
	// Their completions in, before the acknowledgements are lost.
	completed(t, n.a, vconns)
	n.wa.ackHole.Store(sendQPN(as[0]))
	chunks := 0
	for j := range vconns {
		for i := range held {
			m := msg(j, i)
			chunks += as[j].Chunks(len(m))
			if err := as[j].Send(ctx, m); err != nil {
				t.Fatal(err)
			}
		}
	}
	for j := range vconns {
		for i := range held {
			m, err := bs[j].Recv(ctx)
			if err != nil {
				t.Fatal(err)
			}
			if !bytes.Equal(m.Data, msg(j, i)) {
				t.Fatalf("vconn %d: message %d: %d bytes, want %d", j, i, len(m.Data), len(msg(j, i)))
			}
			m.Release()
		}
	}
	before := n.b.Stats().ResentDropped
	n.forgeBadKey(t, as[0])
	n.wa.ackHole.Store(0)
	for j := range vconns {
		for i := range after {
			if err := as[j].Send(ctx, msg(j, held+i)); err != nil {
				t.Fatal(err)
			}
			m, err := bs[j].Recv(ctx)
			if err != nil {
				t.Fatal(err)
			}
			if want := msg(j, held+i); !bytes.Equal(m.Data, want) {
				t.Fatalf("vconn %d: message %d after the replacement: %d bytes starting %q, want %d starting %q (a duplicate?)", j, held+i, len(m.Data), m.Data[:min(8, len(m.Data))], len(want), want[:min(8, len(want))])
			}
			m.Release()
		}
	}
	dropped := n.b.Stats().ResentDropped - before
	t.Logf("chunks held unacknowledged: %d; resent and dropped at the receiver: %d; QPs replaced: %d", chunks, dropped, n.a.Stats().QPsReplaced)
	if dropped != uint64(chunks) {
		t.Fatalf("chunks dropped as resent: %d, want the %d held", dropped, chunks)
	}
	for j := range vconns {
		if err := errors.Join(as[j].Err(), bs[j].Err()); err != nil {
			t.Fatalf("vconn %d: %v", j, err)
		}
	}
}

// refusingLink is a control plane whose peer never answers.
type refusingLink struct{}

var errUnreachable = errors.New("peer unreachable")

func (refusingLink) ConnectQP(context.Context, QPRequest) (QPReply, error) {
	return QPReply{}, errUnreachable
}

// TestForgedBadKeyPeerGone: when the replacement cannot be connected (the
// peer's control plane does not answer: it is gone), the vconns on the
// failed QP fail as before, with ErrQPFailed that says why, and no QP is
// counted replaced.
func TestForgedBadKeyPeerGone(t *testing.T) {
	const vconns = 3
	n := newSpoofNet(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	as := make([]*VConn, vconns)
	for j := range vconns {
		va, vb, err := Pair(ctx, n.a, n.b, VConnOptions{Transport: transport.RC}, VConnOptions{Transport: transport.RC})
		if err != nil {
			t.Fatal(err)
		}
		exchange(ctx, t, va, vb, 1, func(int) []byte { return []byte("hello") })
		as[j] = va
	}
	completed(t, n.a, vconns)
	if _, err := n.a.Peer(n.b.GID(), refusingLink{}); err != nil {
		t.Fatal(err)
	}
	n.forgeBadKey(t, as[0])
	// The QP's error shows at its next completion.
	if err := as[0].Send(ctx, []byte("after the forged request")); err != nil {
		t.Fatal(err)
	}
	for j, va := range as {
		waitFor(t, func() bool { return va.Err() != nil }, fmt.Sprintf("vconn %d to fail", j))
		if err := va.Err(); !errors.Is(err, ErrQPFailed) || !errors.Is(err, errUnreachable) {
			t.Fatalf("vconn %d: %v, want ErrQPFailed for want of a replacement", j, err)
		}
	}
	if got := n.a.Stats().QPsReplaced; got != 0 {
		t.Fatalf("QPs replaced: %d, want 0", got)
	}
}

// olderLink reaches an engine in this process as an older engine's
// control plane would: its replies do not say that it drops resends.
type olderLink struct{ LocalLink }

func (l olderLink) ConnectQP(ctx context.Context, req QPRequest) (QPReply, error) {
	rep, err := l.LocalLink.ConnectQP(ctx, req)
	rep.Resends = false
	return rep, err
}

// TestForgedBadKeyOlderPeer: toward a peer whose engine does not drop
// resent chunks (an older version), a failed QP is not replaced: its
// vconns fail with ErrQPFailed, as before, rather than have the peer
// deliver a message twice.
func TestForgedBadKeyOlderPeer(t *testing.T) {
	n := newSpoofNet(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	pa, pb := n.peersVia(t, olderLink{LocalLink{To: n.b}})
	va, err := n.a.NewVConn(ctx, pa, VConnOptions{Transport: transport.RC})
	if err != nil {
		t.Fatal(err)
	}
	vb, err := n.b.NewVConn(ctx, pb, VConnOptions{Transport: transport.RC})
	if err != nil {
		t.Fatal(err)
	}
	if err := errors.Join(vb.Connect(va.ID()), va.Connect(vb.ID())); err != nil {
		t.Fatal(err)
	}
	exchange(ctx, t, va, vb, 1, func(int) []byte { return []byte("hello") })
	completed(t, n.a, 1)
	n.forgeBadKey(t, va)
	if err := va.Send(ctx, []byte("after the forged request")); err != nil {
		t.Fatal(err)
	}
	waitFor(t, func() bool { return va.Err() != nil }, "the vconn to fail")
	if err := va.Err(); !errors.Is(err, ErrQPFailed) {
		t.Fatalf("the vconn: %v, want ErrQPFailed", err)
	}
	if got := n.a.Stats().QPsReplaced; got != 0 {
		t.Fatalf("QPs replaced: %d, want 0", got)
	}
}

// olderAutoLink reaches an engine in this process as the last version's
// control plane would: it numbers and drops resent RC vconns' chunks, but
// not Auto vconns'.
type olderAutoLink struct{ LocalLink }

func (l olderAutoLink) ConnectQP(ctx context.Context, req QPRequest) (QPReply, error) {
	req.ResendsAuto = false
	rep, err := l.LocalLink.ConnectQP(ctx, req)
	rep.ResendsAuto = false
	return rep, err
}

// TestForgedBadKeyOlderAutoPeer: toward a peer whose engine drops resent
// RC chunks but not Auto ones (the last version), the failed QP is
// replaced and its RC vconn carried, while its Auto vconn fails with
// ErrQPFailed, as before, rather than have the peer deliver a chunk twice.
func TestForgedBadKeyOlderAutoPeer(t *testing.T) {
	n := newSpoofNet(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	pa, pb := n.peersVia(t, olderAutoLink{LocalLink{To: n.b}})
	var as, bs [2]*VConn
	var err error
	for j, tr := range []transport.Kind{transport.RC, transport.Auto} {
		if as[j], err = n.a.NewVConn(ctx, pa, VConnOptions{Transport: tr}); err != nil {
			t.Fatal(err)
		}
		if bs[j], err = n.b.NewVConn(ctx, pb, VConnOptions{Transport: tr}); err != nil {
			t.Fatal(err)
		}
		if err := errors.Join(bs[j].Connect(as[j].ID()), as[j].Connect(bs[j].ID())); err != nil {
			t.Fatal(err)
		}
		exchange(ctx, t, as[j], bs[j], 1, func(int) []byte { return longMsg(j, 0) })
	}
	completed(t, n.a, 2)
	n.forgeBadKey(t, as[0])
	if err := as[1].Send(ctx, longMsg(1, 1)); err != nil {
		t.Fatal(err)
	}
	waitFor(t, func() bool { return as[1].Err() != nil }, "the Auto vconn to fail")
	if err := as[1].Err(); !errors.Is(err, ErrQPFailed) {
		t.Fatalf("the Auto vconn: %v, want ErrQPFailed", err)
	}
	exchange(ctx, t, as[0], bs[0], 2, func(i int) []byte { return longMsg(0, i+1) })
	if got := n.a.Stats().QPsReplaced; got != 1 {
		t.Fatalf("QPs replaced: %d, want 1", got)
	}
}

// TestForgedBadKeyBounded: a QP hit again and again is replaced
// maxReplacements times; the next hit within replaceWindow fails its
// vconns, rather than replacing it for ever.
func TestForgedBadKeyBounded(t *testing.T) {
	n := newSpoofNet(t)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	va, vb, err := Pair(ctx, n.a, n.b, VConnOptions{Transport: transport.RC}, VConnOptions{Transport: transport.RC})
	if err != nil {
		t.Fatal(err)
	}
	for k := range maxReplacements {
		// A message through first: a QP on which no send completed is
		// not replaced (its path, not the QP, failed).
		exchange(ctx, t, va, vb, 1, func(int) []byte { return fmt.Appendf(nil, "round %d", k) })
		completed(t, n.a, uint64(2*k+1))
		hit := n.forgeBadKey(t, va).QPN()
		exchange(ctx, t, va, vb, 1, func(int) []byte { return fmt.Appendf(nil, "after hit %d", k) })
		if sendQPN(va) == hit {
			t.Fatalf("hit %d: QP %#x not replaced", k, hit)
		}
	}
	if got := n.a.Stats().QPsReplaced; got != maxReplacements {
		t.Fatalf("QPs replaced: %d, want %d", got, maxReplacements)
	}
	exchange(ctx, t, va, vb, 1, func(int) []byte { return []byte("one more") })
	completed(t, n.a, 2*maxReplacements+1)
	n.forgeBadKey(t, va)
	if err := va.Send(ctx, []byte("after the last hit")); err != nil {
		t.Fatal(err)
	}
	waitFor(t, func() bool { return va.Err() != nil }, "the vconn to fail")
	if err := va.Err(); !errors.Is(err, ErrQPFailed) {
		t.Fatalf("after %d replacements: %v, want ErrQPFailed", maxReplacements, err)
	}
	if got := n.a.Stats().QPsReplaced; got != maxReplacements {
		t.Fatalf("QPs replaced: %d, want %d", got, maxReplacements)
	}
}

// peersVia makes the spoof net's engines peers, a's control plane toward
// b being link (b's toward a the plain one).
func (n *spoofNet) peersVia(t *testing.T, link PeerLink) (pa, pb *Peer) {
	t.Helper()
	pa, err := n.a.Peer(n.b.GID(), link)
	if err != nil {
		t.Fatal(err)
	}
	if pb, err = n.b.Peer(n.a.GID(), LocalLink{To: n.a}); err != nil {
		t.Fatal(err)
	}
	return pa, pb
}

// pairs connects k vconn pairs of transport tr between the spoof net's
// engines.
func pairs(ctx context.Context, t *testing.T, n *spoofNet, k int, tr transport.Kind) (as, bs []*VConn) {
	t.Helper()
	as, bs = make([]*VConn, k), make([]*VConn, k)
	for j := range k {
		var err error
		if as[j], bs[j], err = Pair(ctx, n.a, n.b, VConnOptions{Transport: tr}, VConnOptions{Transport: tr}); err != nil {
			t.Fatal(err)
		}
	}
	return as, bs
}
