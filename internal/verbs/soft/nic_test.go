package soft

import (
	"errors"
	"fmt"
	"net/netip"
	"testing"
	"testing/synctest"
	"time"

	"github.com/rdmavisor/rdmavisor/internal/verbs"
	"github.com/rdmavisor/rdmavisor/internal/verbs/soft/wire"
	"github.com/rdmavisor/rdmavisor/internal/verbs/verbstest"
)

// TestConformanceFabricNIC runs the verbs conformance suite with the NIC
// model on: it may slow and drop, never change what verbs mean.
func TestConformanceFabricNIC(t *testing.T) {
	verbstest.Run(t, func(t testing.TB, n int, o verbstest.Options) ([]verbs.Device, bool) {
		fb := wire.NewFabric(faultsOf(o))
		t.Cleanup(func() { _ = fb.Close() })
		devs := make([]verbs.Device, n)
		for i := range devs {
			w, err := fb.Attach(verbs.GIDFromAddr(netip.AddrFrom4([4]byte{10, 3, 0, byte(1 + i)})))
			if err != nil {
				t.Fatal(err)
			}
			m := DefaultNICModel()
			d, err := Open(Config{Name: fmt.Sprintf("nic%d", i), Wire: w, NIC: &m})
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() {
				if err := d.Close(); err != nil && !errors.Is(err, verbs.ErrClosed) {
					t.Errorf("close device: %v", err)
				}
			})
			devs[i] = d
		}
		return devs, true
	})
}

func TestQPCacheLRU(t *testing.T) {
	c := newQPCache(2)
	steps := []struct {
		qpn uint32
		hit bool
	}{{1, false}, {2, false}, {1, true}, {3, false}, {2, false}, {1, false}, {1, true}, {2, true}, {3, false}, {1, false}}
	for i, s := range steps {
		if got := c.touch(s.qpn); got != s.hit {
			t.Fatalf("step %d: touch(%d) hit=%v, want %v", i, s.qpn, got, s.hit)
		}
	}
	if len(c.idx) != 2 {
		t.Fatalf("cache holds %d entries, want 2", len(c.idx))
	}
}

// TestNICModelCharges checks that a cache smaller than the QPs in use
// misses on every packet of a round-robin, and a large one only on the
// first of each QP, and what the packets cost on the model's virtual
// clock: each its framed bytes at the line rate, plus the miss penalty on
// a miss, paid in (synctest's) wall-clock time once it is a quantum
// ahead; and that an idle spell credits at most maxCredit.
func TestNICModelCharges(t *testing.T) {
	const (
		packets = 40
		bytes   = 64
		penalty = 10 * time.Microsecond
		// At 1 Gb/s, a nanosecond a bit: 64 bytes and the framing.
		perPacket = (bytes + frameOverhead) * 8 * time.Nanosecond
	)
	for _, tc := range []struct {
		entries    int
		wantMisses uint64
	}{{entries: 2, wantMisses: packets}, {entries: 4, wantMisses: 4}} {
		t.Run(fmt.Sprintf("%d entries", tc.entries), func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				var s Stats
				n := newNIC(NICModel{QPCacheEntries: tc.entries, MissPenalty: penalty, LineRate: 1e9, RxRingDepth: 1}, &s)
				began := time.Now()
				for i := range packets {
					n.charge(uint32(i%4), bytes)
				}
				if got := s.qpCacheMisses.Load(); got != tc.wantMisses {
					t.Errorf("%d misses, want %d", got, tc.wantMisses)
				}
				want := packets*perPacket + time.Duration(tc.wantMisses)*penalty
				if n.vclock != want {
					t.Errorf("virtual clock at %v after %d packets, want %v", n.vclock, packets, want)
				}
				// Time stands still in the bubble but for the model's
				// sleeps: what it slept is what the clock was ahead,
				// short of at most a quantum.
				slept := time.Since(began)
				if want < sleepQuantum && slept != 0 || want >= sleepQuantum && (slept > want || want-slept >= sleepQuantum) {
					t.Errorf("slept %v for a virtual clock at %v, want within %v under it", slept, want, sleepQuantum)
				}

				// Idle for 10 ms: the clock falls behind by at most
				// maxCredit, so a burst after it is charged nearly at once.
				time.Sleep(10 * time.Millisecond)
				idle := time.Since(n.start)
				n.charge(0, bytes) // a miss unless the cache holds all 4 QPs
				want = idle - maxCredit + perPacket
				if tc.entries < 4 {
					want += penalty
				}
				if n.vclock != want {
					t.Errorf("after 10 ms idle, virtual clock at %v, want %v (maxCredit behind, plus one packet)", n.vclock, want)
				}
			})
		})
	}
}

func TestNICModelInvalid(t *testing.T) {
	fb := wire.NewFabric(wire.Faults{})
	defer fb.Close()
	w, err := fb.Attach(verbs.GIDFromAddr(netip.AddrFrom4([4]byte{10, 3, 1, 1})))
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	for _, m := range []NICModel{{QPCacheEntries: -1}, {LineRate: 10}, {RxRingDepth: 1 << 20}, {MissPenalty: -time.Second}} {
		if d, err := Open(Config{Wire: w, NIC: &m}); !errors.Is(err, verbs.ErrInvalid) {
			if d != nil {
				_ = d.Close()
			}
			t.Errorf("Open with %+v: %v, want ErrInvalid", m, err)
		}
	}
}

// TestNICModelRingDrops sends back to back into a one-packet ring drained
// at a slow modelled line: the overflow is dropped and counted, and RC
// retransmits it, so every send completes.
func TestNICModelRingDrops(t *testing.T) {
	fb := wire.NewFabric(wire.Faults{})
	defer fb.Close()
	m := NICModel{RxRingDepth: 1, LineRate: 1e7} // 10 Mb/s: about 3 ms per 4 KiB packet
	p := newRCPairNIC(t, fb, verbs.MTU4096, &m)
	const msgs = 8
	for i := 0; i < msgs; i++ {
		if _, err := p.qb.PostRecv([]verbs.RecvWR{{WRID: uint64(i), SG: sge(p.mrb, uint64(i)*4096, 4096), NumSGE: 1}}); err != nil {
			t.Fatal(err)
		}
	}
	for i := 0; i < msgs; i++ {
		wr := verbs.SendWR{WRID: uint64(i), Opcode: verbs.WRSend, Flags: verbs.SendSignaled, SG: sge(p.mra, uint64(i)*4096, 4096), NumSGE: 1}
		if _, err := p.qa.PostSend([]verbs.SendWR{wr}); err != nil {
			t.Fatal(err)
		}
	}
	wc := make([]verbs.WC, 1)
	for i := 0; i < msgs; i++ {
		pollOne(t, p.cqa, wc)
	}
	if got := p.db.Stats().RxRingDrops; got == 0 {
		t.Errorf("no ring drops with a one-packet ring and %d back-to-back packets", msgs)
	}
}
