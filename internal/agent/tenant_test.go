package agent

import (
	"errors"
	"io"
	"testing"

	"github.com/rdmavisor/rdmavisor/internal/engine"
	"github.com/rdmavisor/rdmavisor/internal/frame"
)

// chanTX is a source that sends what its channel gives, until it closes,
// counting in st; every send error is recorded.
type chanTX struct {
	in    chan []byte
	st    *tenantStats
	errs  chan error
	ended chan error
}

func newChanTX(st *tenantStats) *chanTX {
	return &chanTX{in: make(chan []byte), st: st, errs: make(chan error, 16), ended: make(chan error, 1)}
}

func (s *chanTX) next() (outgoing, error) {
	b, ok := <-s.in
	if !ok {
		return outgoing{}, io.EOF
	}
	return outgoing{data: b}, nil
}

func (s *chanTX) sent(err error) bool {
	if err != nil {
		s.errs <- err
	}
	return true
}

func (s *chanTX) end(err error)        { s.ended <- err }
func (s *chanTX) tenant() *tenantStats { return s.st }
func (s *chanTX) rate() *rateLimiter   { return nil }

// sendCounts are st's messages and bytes sent and sends dropped.
func sendCounts(st *tenantStats) [3]uint64 {
	return [3]uint64{st.sentMsgs.Load(), st.sentBytes.Load(), st.sendsDropped.Load()}
}

// recvCounts are st's messages and bytes received and receipts dropped.
func recvCounts(st *tenantStats) [3]uint64 {
	return [3]uint64{st.recvMsgs.Load(), st.recvBytes.Load(), st.recvsDropped.Load()}
}

// TestForwardCounts: the send loop counts each message sent, with its
// bytes, in its source's allocation, and a send the engine fails as
// dropped, not sent.
func TestForwardCounts(t *testing.T) {
	ctx, h, peer := deliveryPair(t, engine.Config{})
	st := &h.s.al.stats
	src := newChanTX(st)
	go forward(ctx, h.vc, src)
	for i := range 10 {
		src.in <- make([]byte, i+1)
		m, err := peer.Recv(ctx)
		if err != nil {
			t.Fatal(err)
		}
		m.Release()
	}
	src.in <- make([]byte, h.vc.MaxMessage()+1)
	if err := <-src.errs; !errors.Is(err, engine.ErrTooLarge) {
		t.Fatalf("an oversized send: %v, want ErrTooLarge", err)
	}
	close(src.in)
	if err := <-src.ended; !errors.Is(err, io.EOF) {
		t.Fatalf("forward ended with %v, want the source's EOF", err)
	}
	if got, want := sendCounts(st), [3]uint64{10, 55, 1}; got != want {
		t.Fatalf("sent messages, bytes, dropped = %v, want %v", got, want)
	}
	if got := recvCounts(st); got != [3]uint64{} {
		t.Fatalf("received messages, bytes, dropped = %v after sending only", got)
	}
}

// TestRefusalOf: the four codes of refusals count under their reasons,
// no other code counts (TestPodMetrics sees replies counted).
func TestRefusalOf(t *testing.T) {
	for c := frame.Code(1); c < 32; c++ {
		r, ok := refusalOf(c)
		want := map[frame.Code]string{frame.CodeQuota: "quota", frame.CodeLimit: "limit",
			frame.CodeRefused: "refused", frame.CodeAddrInUse: "address_in_use"}[c]
		if got := map[bool]string{true: r.String()}[ok]; got != want {
			t.Errorf("code %v counts as %q, want %q", c, got, want)
		}
	}
}
