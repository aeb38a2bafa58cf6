package engine

import (
	"bytes"
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/rdmavisor/rdmavisor/internal/engine/format"
	"github.com/rdmavisor/rdmavisor/internal/transport"
	"github.com/rdmavisor/rdmavisor/internal/verbs"
	softwire "github.com/rdmavisor/rdmavisor/internal/verbs/soft/wire"
	"github.com/rdmavisor/rdmavisor/internal/vqpn"
)

// TestIdleReadersDoNotPinSRQ: vconns whose readers never read, with more
// credit windows between them than their SRQ has buffers (as many
// vconns of one tenant may have), do not take the SRQ from another
// vconn: past half the SRQ, queued messages are copied out of their
// receive buffers (recv.go, pin). Another pair echoes N round trips
// meanwhile; the held count stays at half the SRQ (plus one per poller,
// for a moment); then the idle readers read everything, intact and in
// order, and the held counts go back to zero. RC fills the RC QPs' SRQ
// with one buffer per message; Auto the datagram SRQ, its messages
// bundled (several to a buffer and a credit) as its senders run out of
// credits.
//
// Without pin, the RC idle vconns' 512 messages would not fit the 256
// buffers: the rest, and the echo, would wait for receive buffers
// forever (RNR retries; Auto's datagrams would be dropped and resent in
// vain until the vconns fail). The context's deadline is a guard against
// that hang, not a timing check.
func TestIdleReadersDoNotPinSRQ(t *testing.T) {
	const pollers = 2
	for _, tc := range []struct {
		tr      transport.Kind
		idle    int // idle vconn pairs
		perIdle int // messages each idle sender sends
		per     int // messages a receive buffer holds at most
		size    func(k, j int) int
		held    func(Stats) int
		bufs    func(Config) int
	}{{
		// 16 windows of 32 credits: 512 buffers' worth, on an SRQ of 256.
		tr: transport.RC, idle: 16, perIdle: 64, per: 1,
		size: func(k, j int) int { return 1 + (k*131+j*37)%3000 },
		held: func(s Stats) int { return s.RecvBuffersHeld },
		bufs: func(c Config) int { return c.RecvBuffers },
	}, {
		// 4 windows of 32 credits, up to 16 messages each: 128 buffers'
		// worth, on a datagram SRQ of 64.
		tr: transport.Auto, idle: 4, perIdle: 600, per: maxBundle,
		size: func(k, j int) int { return 1 + (k*131+j*37)%200 },
		held: func(s Stats) int { return s.DgramBuffersHeld },
		bufs: func(c Config) int { return c.DgramBuffers },
	}} {
		t.Run(tc.tr.String(), func(t *testing.T) {
			cfg := Config{RecvBuffers: 256, DgramBuffers: 64, SendBuffers: 1024, Pollers: pollers}
			a, b := testEngines(t, softwire.Faults{}, cfg)
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
			var senders sync.WaitGroup
			stop, sampled := make(chan struct{}), make(chan struct{})
			defer func() {
				cancel()
				senders.Wait()
				close(stop)
				<-sampled
			}()
			opts := VConnOptions{Transport: tc.tr}
			ea, eb, err := Pair(ctx, a, b, opts, opts)
			if err != nil {
				t.Fatal(err)
			}
			tx := make([]*VConn, tc.idle)
			rx := make([]*VConn, tc.idle)
			for k := range tc.idle {
				if tx[k], rx[k], err = Pair(ctx, a, b, opts, opts); err != nil {
					t.Fatal(err)
				}
			}
			limit := tc.bufs(cfg) / 2
			bound := limit + pollers

			// The held counts, sampled throughout.
			var maxHeld [2]atomic.Int64
			go func() {
				defer close(sampled)
				for {
					for i, e := range []*Engine{a, b} {
						if h := int64(tc.held(e.Stats())); h > maxHeld[i].Load() {
							maxHeld[i].Store(h)
						}
					}
					select {
					case <-stop:
						return
					case <-time.After(time.Millisecond):
					}
				}
			}()

			msg := func(k, j int) []byte { return bytes.Repeat([]byte{byte(k*31 + j)}, tc.size(k, j)) }
			for k := range tc.idle {
				senders.Add(1)
				go func() {
					defer senders.Done()
					for j := range tc.perIdle {
						if err := tx[k].SendImm(ctx, msg(k, j), uint32(j)); err != nil {
							t.Errorf("idle vconn %d, message %d: %v", k, j, err)
							return
						}
					}
				}()
			}
			// Every idle receiver takes its whole credit window, and
			// holds it: its reader does not read. (Auto's datagrams that
			// took credits out of order, after one dropped for want of a
			// receive buffer, are queued once the gap is resent.)
			waitCtx(ctx, t, "the idle vconns' windows", func() bool {
				for _, vc := range rx {
					if vc.taken.Load() != vc.window.Advertised() || earlyLen(vc) != 0 {
						return false
					}
				}
				return true
			})
			queued := make([]int, tc.idle)
			window := make([]uint32, tc.idle)
			total := 0
			for k, vc := range rx {
				queued[k] = rxLen(vc)
				window[k] = vc.taken.Load()
				total += queued[k]
			}
			t.Logf("%v: %d idle vconns hold %d messages (%d credits); the SRQ has %d buffers", tc.tr, tc.idle, total, tc.idle*b.cfg.Credits, tc.bufs(cfg))

			// Meanwhile another pair echoes.
			const rounds = 200
			echoed := make(chan error, 1)
			go func() {
				for {
					m, err := eb.Recv(ctx)
					if err != nil {
						echoed <- err
						return
					}
					err = eb.SendImm(ctx, m.Data, m.Imm)
					m.Release()
					if err != nil {
						echoed <- err
						return
					}
				}
			}()
			for i := range rounds {
				want := msg(1000, i)
				if err := ea.SendImm(ctx, want, uint32(i)); err != nil {
					t.Fatalf("echo %d: %v", i, err)
				}
				m, err := ea.Recv(ctx)
				if err != nil {
					t.Fatalf("echo %d: %v (the idle vconns hold the receive buffers?)", i, err)
				}
				if m.Imm != uint32(i) || !bytes.Equal(m.Data, want) {
					t.Fatalf("echo %d came back as imm %d, %d bytes", i, m.Imm, len(m.Data))
				}
				m.Release()
			}
			for k, vc := range rx {
				// No credit changed hands. The count may have grown: a
				// poller that took the window's last credit (a bundle's,
				// or a datagram's) just before the count above queues
				// its messages just after.
				n := rxLen(vc)
				if taken, adv := vc.taken.Load(), vc.window.Advertised(); n < queued[k] || taken != window[k] || adv != window[k] {
					t.Fatalf("idle vconn %d: %d messages queued, %d credits taken, %d advertised; before the echo %d queued, %d credits", k, n, taken, adv, queued[k], window[k])
				}
				total += n - queued[k]
			}
			st := b.Stats()
			t.Logf("%v: %d round trips echoed; the receiver holds %d buffers (at most %d seen), copied %d messages; the sender resent %d datagrams", tc.tr, rounds, tc.held(st), maxHeld[1].Load(), st.RecvCopied, a.Stats().Retransmits)
			if h := tc.held(st); h != limit {
				t.Errorf("%d buffers held with the idle vconns full, want %d (half the SRQ)", h, limit)
			}
			if want := max(1, total-limit*tc.per); st.RecvCopied < uint64(want) {
				t.Errorf("%d messages copied; want at least %d (%d queued, at most %d in %d buffers)", st.RecvCopied, want, total, limit*tc.per, limit)
			}

			// The idle readers read: everything arrives, intact, in
			// order, the messages that waited at the senders too.
			for k, vc := range rx {
				for j := range tc.perIdle {
					m, err := vc.Recv(ctx)
					if err != nil {
						t.Fatalf("idle vconn %d, message %d: %v", k, j, err)
					}
					if m.Imm != uint32(j) || !bytes.Equal(m.Data, msg(k, j)) {
						t.Fatalf("idle vconn %d, message %d arrived as imm %d, %d bytes", k, j, m.Imm, len(m.Data))
					}
					m.Release()
				}
			}
			senders.Wait()
			for _, e := range []*Engine{a, b} {
				waitCtx(ctx, t, "no buffers held", func() bool { return tc.held(e.Stats()) == 0 })
			}
			// Every credit the peer's messages took came back once,
			// copied or not (a copied bundle message leaves its
			// bundle's credit to the buffer unless it is the last).
			for k, vc := range rx {
				if taken, returned := vc.taken.Load(), vc.window.Consumed(); taken != returned {
					t.Errorf("idle vconn %d: %d credits taken, %d returned", k, taken, returned)
				}
			}
			if tc.tr == transport.Auto && a.Stats().Bundled == 0 {
				t.Error("the Auto senders bundled nothing")
			}

			for _, vc := range append(append([]*VConn{ea, eb}, tx...), rx...) {
				_ = vc.Close()
			}
			if err := <-echoed; err == nil {
				t.Error("the echo ended without an error")
			}
			waitCtx(ctx, t, "vconns released", func() bool { return a.Stats().VConns == 0 && b.Stats().VConns == 0 })
			for i, e := range []*Engine{a, b} {
				if h := tc.held(e.Stats()); h != 0 {
					t.Errorf("engine %d: %d buffers held after every vconn closed", i, h)
				}
				if h := maxHeld[i].Load(); h > int64(bound) {
					t.Errorf("engine %d: %d buffers held at most; want at most %d (half the SRQ, %d, and one per poller)", i, h, bound, limit)
				}
			}
		})
	}
}

// TestQueuedRecvAllocatesNothing: below half the SRQ, a message queued
// for the reader (no Handler) keeps its receive buffer: the queued path
// copies and allocates nothing.
func TestQueuedRecvAllocatesNothing(t *testing.T) {
	if raceEnabled {
		t.Skip("the race detector allocates on its own")
	}
	for _, tr := range []transport.Kind{transport.RC, transport.Auto} {
		t.Run(tr.String(), func(t *testing.T) {
			a, b := testEngines(t, softwire.Faults{}, Config{SpinPolls: 1 << 30})
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			va, vb, err := Pair(ctx, a, b, VConnOptions{Transport: tr}, VConnOptions{Transport: tr})
			if err != nil {
				t.Fatal(err)
			}
			msg := make([]byte, 64)
			round := func() {
				for range 8 {
					if err := va.Send(ctx, msg); err != nil {
						t.Fatal(err)
					}
				}
				for range 8 {
					m, err := vb.Recv(ctx)
					if err != nil {
						t.Fatal(err)
					}
					m.Release()
				}
			}
			for range 2000 {
				round() // warm up pools, slices and the receive queue
			}
			if n := testing.AllocsPerRun(2000, round); n != 0 {
				t.Fatalf("%.2f allocations per round of 8 messages; want 0", n)
			}
			if st := b.Stats(); st.RecvCopied != 0 || st.RecvBuffersHeld != 0 || st.DgramBuffersHeld != 0 {
				t.Errorf("copied %d messages, %d and %d buffers held; want none", st.RecvCopied, st.RecvBuffersHeld, st.DgramBuffersHeld)
			}
		})
	}
}

// TestCloseDropsLateMessages: messages that arrive after the reader
// closed its vconn (the peer sent them on credits it held) are dropped,
// not queued where nothing reads them: their buffers go back to the SRQ
// and the held count to zero.
func TestCloseDropsLateMessages(t *testing.T) {
	a, b := testEngines(t, softwire.Faults{}, Config{})
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	va, vb, err := Pair(ctx, a, b, VConnOptions{}, VConnOptions{})
	if err != nil {
		t.Fatal(err)
	}
	sent := make(chan int, 1)
	go func() {
		n := 0
		for va.Send(ctx, make([]byte, 100)) == nil {
			n++
		}
		sent <- n
	}()
	for range 1000 {
		m, err := vb.Recv(ctx)
		if err != nil {
			t.Fatal(err)
		}
		m.Release()
	}
	_ = vb.Close() // the sender still has credits, and messages in flight
	_ = va.Close()
	waitCtx(ctx, t, "vconns released", func() bool { return a.Stats().VConns == 0 && b.Stats().VConns == 0 })
	t.Logf("%d messages sent, 1000 read", <-sent)
	if h := b.Stats().RecvBuffersHeld; h != 0 {
		t.Errorf("%d buffers held after the vconn closed", h)
	}
}

// rxLen is how many messages vc has queued for its reader.
func rxLen(vc *VConn) int {
	return vc.rcv.queued()
}

// earlyLen is how many messages Auto vconn vc holds out of order.
func earlyLen(vc *VConn) int {
	r := vc.auto.ptr.Load()
	if r == nil {
		return 0
	}
	return r.rx.Early()
}

// waitCtx waits until cond holds; ctx's deadline guards against a hang.
func waitCtx(ctx context.Context, t *testing.T, what string, cond func() bool) {
	t.Helper()
	for !cond() {
		select {
		case <-ctx.Done():
			t.Fatalf("waiting for %s: %v", what, ctx.Err())
		case <-time.After(time.Millisecond):
		}
	}
}

// TestEarlyArrivalsDoNotPinSRQ: a peer that leaves a gap in an Auto
// vconn's sequence makes the datagrams after it wait for the gap, each in
// a receive buffer of the datagram SRQ. They count as queued messages do:
// past half the SRQ they are copied out, and once the gap fills every one
// is delivered, in order, and the count returns to 0.
func TestEarlyArrivalsDoNotPinSRQ(t *testing.T) {
	fb := softwire.NewFabric(softwire.Faults{})
	t.Cleanup(func() { _ = fb.Close() })
	a, _ := testEnginesOn(t, fb, Config{DgramBuffers: 32, Credits: 32})
	h := newHostile(t, fb, "10.9.0.70")
	hp, err := a.Peer(h.gid, hostileLink{h})
	if err != nil {
		t.Fatal(err)
	}
	h.ingress(a, 1, 0)
	uc := h.ingressOf(a, verbs.QPTypeUC, 1, 0)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	vc, err := a.NewVConn(ctx, hp, VConnOptions{Transport: transport.Auto})
	if err != nil {
		t.Fatal(err)
	}
	if err := vc.Connect(vqpn.MakeID(5, 1)); err != nil {
		t.Fatal(err)
	}
	const n = 30 // within the credit window; nearly the whole SRQ
	msg := func(seq uint32) []byte { return []byte(fmt.Sprintf("datagram %02d", seq)) }
	send := func(seq uint32) {
		d := format.DataHeader(uint32(len(msg(seq))), seq, 0, false)
		d.Flags |= format.FlagFirst | format.FlagLast
		h.send(uc, a, vc.ID(), d, msg(seq))
	}
	for seq := uint32(1); seq < n; seq++ { // seq 0, the gap, comes last
		send(seq)
	}
	half := a.cfg.DgramBuffers / 2
	waitFor(t, func() bool { return a.Stats().RecvCopied >= uint64(n-1-half) }, "early arrivals copied out")
	if held := a.Stats().DgramBuffersHeld; held > half {
		t.Fatalf("%d datagram buffers held by early arrivals; want at most %d", held, half)
	}
	send(0)
	for seq := uint32(0); seq < n; seq++ {
		m, err := vc.Recv(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(m.Data, msg(seq)) {
			t.Fatalf("message %d: %q, want %q", seq, m.Data, msg(seq))
		}
		m.Release()
	}
	if held := a.Stats().DgramBuffersHeld; held != 0 {
		t.Fatalf("%d datagram buffers still held after every message was released", held)
	}
}

// TestFullQueueDropsOnlyDatagrams: a vconn whose reader let MaxCredits
// messages queue up drops the next UD datagram (it took no credit, and
// a datagram may be lost), but never an Auto message without a credit
// of its own: a bundle's message copied out early (pin) is one, and it
// was sequenced and acknowledged already, so dropping it would lose it
// for good. (CI caught that: TestIdleReadersDoNotPinSRQ/auto read
// message 260 where 256 belonged.)
func TestFullQueueDropsOnlyDatagrams(t *testing.T) {
	a, b := testEngines(t, softwire.Faults{}, Config{})
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for _, tc := range []struct {
		tr   transport.Kind
		kept bool
	}{{transport.UD, false}, {transport.Auto, true}} {
		t.Run(tc.tr.String(), func(t *testing.T) {
			_, vc, err := Pair(ctx, a, b, VConnOptions{Transport: tc.tr}, VConnOptions{Transport: tc.tr})
			if err != nil {
				t.Fatal(err)
			}
			// A poller of its own, so the test does not race the engine's.
			p := &poller{e: b}
			for i := range b.cfg.MaxCredits + 1 {
				vc.deliver(p, Message{vc: vc, Data: []byte{byte(i)}, Imm: uint32(i), slot: noSlot})
			}
			want := b.cfg.MaxCredits
			if tc.kept {
				want++
			}
			if n := rxLen(vc); n != want {
				t.Fatalf("%d messages queued, want %d", n, want)
			}
			if got, dropped := p.st.rejected[RejectOverflow].Load(), uint64(b.cfg.MaxCredits+1-want); got != dropped {
				t.Errorf("%d rejected for overflow, want %d", got, dropped)
			}
			for i := range want {
				m, err := vc.Recv(ctx)
				if err != nil || m.Imm != uint32(i) {
					t.Fatalf("message %d: imm %d, %v", i, m.Imm, err)
				}
				m.Release()
			}
		})
	}
}
