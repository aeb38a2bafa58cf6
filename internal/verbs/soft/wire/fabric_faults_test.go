package wire

import (
	"math"
	"slices"
	"testing"
	"testing/synctest"
	"time"
)

// The fabric's injected faults: loss, duplication, reordering, delay.

// collect runs a sender a and a receiver b on a fresh fabric with faults
// and returns the sequence numbers b received, in order. Call it inside a
// synctest bubble: time stands still while the test sends.
func collect(t *testing.T, f Faults, n, batch int) (seqs []uint32, sa, sb Stats) {
	fb := NewFabric(f)
	ws := attach(t, fb, gidA, gidB)
	a, b := ws[0], ws[1]

	done := make(chan struct{})
	go func() {
		defer close(done)
		rx := slots(64, 64)
		for {
			k, err := b.Recv(rx)
			if err != nil {
				return
			}
			for i := range rx[:k] {
				seqs = append(seqs, seqOf(&rx[i]))
			}
		}
	}()
	pkts := mkPkts(batch, 64, gidB, 0)
	for i := 0; i < n; i += batch {
		k := min(batch, n-i)
		for j := range k {
			fill(&pkts[j], uint32(i+j))
		}
		if _, err := a.Send(pkts[:k]); err != nil {
			t.Fatal(err)
		}
		synctest.Wait() // the receiver drains: no queue overflow
	}
	time.Sleep(2*ReorderHold + f.Delay + f.Jitter) // the last held and delayed packets
	synctest.Wait()
	sa, sb = a.Stats(), b.Stats()
	fb.Close()
	<-done
	return seqs, sa, sb
}

func TestFabricFaultsDeterministic(t *testing.T) {
	f := Faults{Seed: 42, Loss: 0.1, Duplicate: 0.1, Reorder: 0.2}
	var runs [3][]uint32
	synctest.Test(t, func(t *testing.T) { runs[0], _, _ = collect(t, f, 5000, 16) })
	synctest.Test(t, func(t *testing.T) { runs[1], _, _ = collect(t, f, 5000, 16) })
	f.Seed = 43
	synctest.Test(t, func(t *testing.T) { runs[2], _, _ = collect(t, f, 5000, 16) })
	if !slices.Equal(runs[0], runs[1]) {
		t.Errorf("same seed, different deliveries: %d vs %d packets", len(runs[0]), len(runs[1]))
	}
	if slices.Equal(runs[0], runs[2]) {
		t.Error("different seeds, same deliveries")
	}
	// The decisions depend on the packets, not on how they are batched.
	var single []uint32
	synctest.Test(t, func(t *testing.T) {
		single, _, _ = collect(t, Faults{Seed: 42, Loss: 0.1, Duplicate: 0.1, Reorder: 0.2}, 5000, 1)
	})
	if !slices.Equal(runs[0], single) {
		t.Error("batch size changed the faults")
	}
}

// within checks that k events in n trials fit probability p (5 sigma).
func within(t *testing.T, what string, k, n int, p float64) {
	t.Helper()
	got := float64(k) / float64(n)
	sigma := math.Sqrt(p * (1 - p) / float64(n))
	if math.Abs(got-p) > 5*sigma {
		t.Errorf("%s rate %.4f (%d of %d), want %.4f ± %.4f", what, got, k, n, p, 5*sigma)
	} else {
		t.Logf("%s rate %.4f (%d of %d), want %.4f", what, got, k, n, p)
	}
}

func TestFabricFaultRates(t *testing.T) {
	const n = 100_000
	for _, f := range []Faults{
		{Seed: 7, Loss: 0.05, Duplicate: 0.03, Reorder: 0.1},
		{Seed: 8, Loss: 0.2, Reorder: 0.02},
		{Seed: 9, Duplicate: 0.5, Reorder: 0.5},
	} {
		synctest.Test(t, func(t *testing.T) {
			t.Logf("%+v", f)
			seqs, sa, sb := collect(t, f, n, 64)
			seen := make([]int, n)
			var overtaken int // arrived after a packet sent later
			maxSeq := -1
			for _, s := range seqs {
				seen[s]++
				if int(s) < maxSeq {
					overtaken++
				}
				maxSeq = max(maxSeq, int(s))
			}
			var unique, dups int
			for _, c := range seen {
				if c > 0 {
					unique++
					dups += c - 1
				}
				if c > 2 {
					t.Fatalf("a packet arrived %d times", c)
				}
			}
			copies := unique + dups
			within(t, "loss", n-unique, n, f.Loss)
			within(t, "duplicate", dups, unique, f.Duplicate)
			within(t, "reorder", int(sa.Reordered), copies, f.Reorder)

			if sa.DropLoss != uint64(n-unique) || sa.Duplicated != uint64(dups) {
				t.Errorf("sender stats %+v, want %d lost, %d duplicated", sa, n-unique, dups)
			}
			// Every held packet arrives after a later one, except when what
			// overtook it was its own duplicate, or when it was among the
			// last, released by the hold deadline with nothing after it.
			if d := int(sa.Reordered) - overtaken; d < 0 || d > 2+dups {
				t.Errorf("Stats.Reordered = %d, receiver saw %d overtaken", sa.Reordered, overtaken)
			}
			if f.Duplicate == 0 && int(sa.Reordered)-overtaken > 2 {
				t.Errorf("Stats.Reordered = %d, receiver saw %d overtaken", sa.Reordered, overtaken)
			}
			if sa.TxPackets != uint64(copies) || sb.RxPackets != uint64(copies) {
				t.Errorf("tx %d, rx %d, delivered %d", sa.TxPackets, sb.RxPackets, copies)
			}
		})
	}
}

func TestFabricReorderHold(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		fb := NewFabric(Faults{Reorder: 1}) // everything is held
		defer fb.Close()
		ws := attach(t, fb, gidA, gidB)
		a, b := ws[0], ws[1]
		start := time.Now()
		a.Send(mkPkts(3, 64, gidB, 0))
		got := recvN(t, b, 3, slots(4, 64))
		if d := time.Since(start); d != ReorderHold {
			t.Errorf("held packets released after %v, want %v", d, ReorderHold)
		}
		for i := range got {
			if seqOf(&got[i]) != uint32(i) {
				t.Errorf("released out of order: %d at %d", seqOf(&got[i]), i)
			}
		}
	})
}

func TestFabricDelay(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		const delay, jitter = 10 * time.Millisecond, 2 * time.Millisecond
		fb := NewFabric(Faults{Seed: 1, Delay: delay, Jitter: jitter})
		defer fb.Close()
		ws := attach(t, fb, gidA, gidB)
		a, b := ws[0], ws[1]
		start := time.Now()
		a.Send(mkPkts(200, 64, gidB, 0))
		if n := a.Stats().TxPackets; n != 0 {
			t.Fatalf("%d packets delivered at once", n)
		}
		rx := slots(64, 64)
		var last time.Duration
		var inversions int
		prev := -1
		for got := 0; got < 200; {
			k, err := b.Recv(rx)
			if err != nil {
				t.Fatal(err)
			}
			d := time.Since(start)
			if d < delay-jitter || d > delay+jitter || d < last {
				t.Fatalf("delivered after %v, want %v ± %v, in due order", d, delay, jitter)
			}
			last = d
			for i := range rx[:k] {
				if s := int(seqOf(&rx[i])); s < prev {
					inversions++
				} else {
					prev = s
				}
			}
			got += k
		}
		if inversions == 0 {
			t.Error("jitter reordered nothing")
		}
		if s := a.Stats(); s.Delayed != 200 || s.TxPackets != 200 {
			t.Errorf("stats %+v", s)
		}
	})
}

// TestFabricDelayRealTime runs the timer goroutine on the real clock.
func TestFabricDelayRealTime(t *testing.T) {
	const delay = 20 * time.Millisecond
	fb := NewFabric(Faults{Delay: delay})
	defer fb.Close()
	ws := attach(t, fb, gidA, gidB)
	a, b := ws[0], ws[1]
	start := time.Now()
	a.Send(mkPkts(10, 64, gidB, 0))
	recvN(t, b, 10, slots(10, 64))
	if d := time.Since(start); d < delay {
		t.Errorf("delivered after %v, want ≥ %v", d, delay)
	}
}

func TestFabricSetFaults(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		fb := NewFabric(Faults{})
		defer fb.Close()
		ws := attach(t, fb, gidA, gidB)
		a, b := ws[0], ws[1]
		fb.SetFaults(Faults{Loss: 1})
		a.Send(mkPkts(10, 64, gidB, 0))
		if s := a.Stats(); s.DropLoss != 10 {
			t.Errorf("DropLoss = %d, want 10", s.DropLoss)
		}
		fb.SetFaults(Faults{Delay: time.Second})
		a.Send(mkPkts(1, 64, gidB, 10))
		fb.SetFaults(Faults{}) // the delayed packet keeps its fate
		a.Send(mkPkts(1, 64, gidB, 11))
		got := recvN(t, b, 2, slots(2, 64))
		if seqOf(&got[0]) != 11 || seqOf(&got[1]) != 10 {
			t.Errorf("got %d, %d; want 11 then the delayed 10", seqOf(&got[0]), seqOf(&got[1]))
		}
		// With the faults off, the timer goroutine exits by itself.
		synctest.Wait()
		fb.sched.mu.Lock()
		running := fb.sched.running
		fb.sched.mu.Unlock()
		if running {
			t.Error("timer goroutine still running with no timed faults")
		}
	})
}

// TestFabricCloseHeld checks what happens to packets in flight at Close.
func TestFabricCloseHeld(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		fb := NewFabric(Faults{Reorder: 1})
		ws := attach(t, fb, gidA, gidB)
		a, b := ws[0], ws[1]
		a.Send(mkPkts(2, 64, gidB, 0))
		a.Close() // held packets were sent: they arrive
		recvN(t, b, 2, slots(2, 64))

		fb.SetFaults(Faults{Delay: time.Hour})
		c := attach(t, fb, gidC)[0]
		c.Send(mkPkts(3, 64, gidB, 0))
		fb.Close() // the timer's packets are dropped
		if s := c.Stats(); s.DropClosed != 3 {
			t.Errorf("DropClosed = %d, want 3", s.DropClosed)
		}
	})
}
