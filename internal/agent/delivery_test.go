package agent

import (
	"context"
	"errors"
	"io"
	"net/netip"
	"sync/atomic"
	"testing"
	"time"

	"github.com/go-logr/logr"

	"github.com/rdmavisor/rdmavisor/internal/config"
	"github.com/rdmavisor/rdmavisor/internal/engine"
	"github.com/rdmavisor/rdmavisor/internal/frame"
	"github.com/rdmavisor/rdmavisor/internal/verbs"
	"github.com/rdmavisor/rdmavisor/internal/verbs/soft"
	softwire "github.com/rdmavisor/rdmavisor/internal/verbs/soft/wire"
)

// countRX is a carrier that counts what deliver hands it, and keeps the
// first byte of the last message and how the delivery ended.
type countRX struct {
	max   int
	n     atomic.Int64
	last  atomic.Uint32
	ended chan error
}

func (c *countRX) ready() bool { return true }

func (c *countRX) put(m engine.Message) bool {
	if len(m.Data) > 0 {
		c.last.Store(uint32(m.Data[0]))
	}
	c.n.Add(1)
	return true
}

func (c *countRX) end(err error)        { c.ended <- err }
func (c *countRX) limit() (int, string) { return c.max, "the test's carrier" }

// deliveryPair returns a vconn handle, on an allocation of its own, whose
// engine vconn is paired with the vconn it returns: two engines of cfg
// on soft devices on an in-memory fabric.
func deliveryPair(t *testing.T, cfg engine.Config) (context.Context, *vconnHandle, *engine.VConn) {
	t.Helper()
	fb := softwire.NewFabric(softwire.Faults{})
	t.Cleanup(func() { _ = fb.Close() })
	open := func(ip string) *engine.Engine {
		w, err := fb.Attach(verbs.GIDFromAddr(netip.MustParseAddr(ip)))
		if err != nil {
			t.Fatal(err)
		}
		dev, err := soft.Open(soft.Config{Name: ip, Wire: w})
		if err != nil {
			t.Fatal(err)
		}
		cfg := cfg
		cfg.Device, cfg.Log = dev, logr.Discard()
		e, err := engine.New(cfg)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = e.Close(); _ = dev.Close() })
		return e
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	t.Cleanup(cancel)
	va, vb, err := engine.Pair(ctx, open("10.9.1.1"), open("10.9.1.2"), engine.VConnOptions{}, engine.VConnOptions{})
	if err != nil {
		t.Fatal(err)
	}
	ac := &config.AgentConfig{}
	ac.Limits.QueuedBytes = 1 << 20
	al := &allocation{a: &Agent{cfg: ac}}
	return ctx, &vconnHandle{s: &session{al: al}, vc: vb, ctx: ctx}, va
}

// TestDeliverEnds: deliver hands over the messages in order, counting
// them in the allocation, and ends with the peer's EOF; a message over
// the carrier's limit, counted as dropped, ends it with an error of the
// too-large class, and aborts the vconn.
func TestDeliverEnds(t *testing.T) {
	t.Run("eof", func(t *testing.T) {
		ctx, h, peer := deliveryPair(t, engine.Config{})
		c := &countRX{max: 64, ended: make(chan error, 1)}
		go h.deliver(c)
		for i := range 10 {
			if err := peer.Send(ctx, []byte{byte(i)}); err != nil {
				t.Fatal(err)
			}
		}
		if err := peer.Close(); err != nil {
			t.Fatal(err)
		}
		if err := <-c.ended; !errors.Is(err, io.EOF) {
			t.Fatalf("ended with %v, want EOF", err)
		}
		if n, last := c.n.Load(), c.last.Load(); n != 10 || last != 9 {
			t.Fatalf("%d messages, the last %d; want 10, the last 9", n, last)
		}
		if got, want := recvCounts(&h.s.al.stats), [3]uint64{10, 10, 0}; got != want {
			t.Fatalf("the allocation counts %v messages, bytes, drops received; want %v", got, want)
		}
	})
	t.Run("too large", func(t *testing.T) {
		ctx, h, peer := deliveryPair(t, engine.Config{})
		c := &countRX{max: 64, ended: make(chan error, 1)}
		go h.deliver(c)
		if err := peer.Send(ctx, make([]byte, 65)); err != nil {
			t.Fatal(err)
		}
		err := <-c.ended
		const want = "received a message of 65 bytes: the test's carrier carries at most 64"
		if codeOf(err) != frame.CodeTooLarge || err.Error() != want {
			t.Fatalf("ended with %q (%v), want %q (%v)", err, codeOf(err), want, frame.CodeTooLarge)
		}
		if _, err := h.vc.Recv(ctx); err == nil || errors.Is(err, io.EOF) {
			t.Fatalf("the vconn after a message too large: Recv %v, want its abort", err)
		}
		if got, want := recvCounts(&h.s.al.stats), [3]uint64{0, 0, 1}; got != want {
			t.Fatalf("the allocation counts %v messages, bytes, drops received; want %v", got, want)
		}
	})
}
