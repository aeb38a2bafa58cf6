package credit

import (
	"sync"
	"testing"
)

func TestLimitGrant(t *testing.T) {
	const max = 64
	for _, tc := range []struct {
		name        string
		from, grant uint32
		want        uint32
		moved, ok   bool
	}{
		{"forward", 32, 40, 40, true, true},
		{"stale", 40, 32, 40, false, true},
		{"same", 40, 40, 40, false, true},
		{"a full window ahead", 40, 40 + max, 40 + max, true, true},
		{"past the window: cut", 40, 41 + max, 40 + max, true, false},
		{"far past: cut", 40, 40 + 1<<30, 40 + max, true, false},
		{"across the wrap", ^uint32(0) - 3, 10, 10, true, true},
		{"past the window across the wrap", ^uint32(0) - 3, max, max - 4, true, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var l Limit
			l.Init(tc.from)
			moved, ok := l.Grant(tc.grant, max)
			if l.Load() != tc.want || moved != tc.moved || ok != tc.ok {
				t.Fatalf("Grant(%d) from %d: limit %d, moved %v, ok %v; want %d, %v, %v", tc.grant, tc.from, l.Load(), moved, ok, tc.want, tc.moved, tc.ok)
			}
		})
	}
}

// TestWindow walks one receive window through its life: grants stamped,
// buffers released, the window doubling while the sender uses all of it,
// up to max and as far as the budget goes, and its growth given back.
func TestWindow(t *testing.T) {
	const credits, max = 4, 16
	for _, tc := range []struct {
		name   string
		budget int64
		open   bool
		// release releases what was granted, step by step (each step
		// after a stamp), and wantSize is the window after each.
		steps    []uint32
		wantSize []uint32
		wantDue  []bool
		left     int64
	}{
		{"grows to max", 100, true,
			[]uint32{4, 8, 16, 16}, []uint32{8, 16, 16, 16}, []bool{true, true, true, true}, 100 - 4 - 8},
		{"half a window is due, not less", 100, true,
			[]uint32{1, 2}, []uint32{4, 4}, []bool{false, true}, 100},
		{"budget too small to double", 3, true,
			[]uint32{4, 4}, []uint32{4, 4}, []bool{true, true}, 3},
		{"budget for one doubling", 4, true,
			[]uint32{4, 8, 8}, []uint32{8, 8, 8}, []bool{true, true, true}, 0},
		{"closed: no growth, no grant", 100, false,
			[]uint32{4, 4}, []uint32{4, 4}, []bool{false, false}, 100},
		{"nothing released", 100, true,
			[]uint32{0}, []uint32{4}, []bool{false}, 100},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var w Window
			var b Budget
			w.Init(credits)
			b.Init(tc.budget)
			for i, n := range tc.steps {
				g := w.Stamp()
				if g != w.Consumed()+w.Size() || w.Advertised() != g {
					t.Fatalf("step %d: stamped %d, advertised %d, consumed %d + size %d", i, g, w.Advertised(), w.Consumed(), w.Size())
				}
				due := w.Release(n, max, &b, tc.open)
				if w.Size() != tc.wantSize[i] || due != tc.wantDue[i] {
					t.Fatalf("step %d, released %d: size %d, due %v; want %d, %v", i, n, w.Size(), due, tc.wantSize[i], tc.wantDue[i])
				}
			}
			if b.Left() != tc.left {
				t.Fatalf("budget left %d, want %d", b.Left(), tc.left)
			}
			w.Shrink(credits, &b)
			if w.Size() != credits || b.Left() != tc.budget {
				t.Fatalf("after Shrink: size %d, budget %d; want %d, %d", w.Size(), b.Left(), credits, tc.budget)
			}
		})
	}
}

func TestTaken(t *testing.T) {
	var w Window
	var tk Taken
	w.Init(2)
	if !tk.Take(&w) || !tk.Take(&w) {
		t.Fatal("the first window's two credits refused")
	}
	if tk.Take(&w) {
		t.Fatal("a third message on two credits accepted")
	}
	w.Release(3, 2, &Budget{}, true)
	w.Stamp() // grants consumed 3 + window 2 = 5
	if !tk.Take(&w) || !tk.Take(&w) || tk.Take(&w) {
		t.Fatalf("after a grant of 5: taken %d", tk.Load())
	}
}

// Releases racing on one window never lend more than the budget held, and
// every credit lent comes back with Shrink.
func TestWindowConcurrent(t *testing.T) {
	var w Window
	var b Budget
	w.Init(2)
	b.Init(30)
	var wg sync.WaitGroup
	for range 4 {
		wg.Go(func() {
			for range 1000 {
				w.Stamp()
				w.Release(1, 1<<20, &b, true)
			}
		})
	}
	wg.Wait()
	if lent := 30 - b.Left(); b.Left() < 0 || lent != int64(w.Size())-2 {
		t.Fatalf("window %d with budget %d left of 30", w.Size(), b.Left())
	}
	w.Shrink(2, &b)
	if b.Left() != 30 {
		t.Fatalf("budget %d after Shrink, want 30", b.Left())
	}
}

// FuzzWindow drives a sender's Limit and a receiver's Window, Taken and
// Budget as two engines do, with the peer sending only on credit and the
// reader releasing in any pattern: the peer never overruns, the window
// stays a power-of-two multiple of the starting one within max, the budget
// lends exactly the growth, and every grant the sender receives is one the
// receiver could make.
func FuzzWindow(f *testing.F) {
	f.Add(uint8(4), uint8(64), int16(100), []byte{0, 1, 2, 0, 1, 2, 2, 1, 0})
	f.Add(uint8(2), uint8(2), int16(0), []byte{0, 0, 1, 1, 2})
	f.Add(uint8(8), uint8(200), int16(7), []byte{1, 1, 1, 0, 2, 0, 2, 3, 3})
	f.Fuzz(func(t *testing.T, credits, max uint8, budget int16, ops []byte) {
		if credits < 2 || max < credits || budget < 0 {
			return
		}
		var (
			lim    Limit
			w      Window
			tk     Taken
			b      Budget
			sent   uint32 // credited messages the peer sent
			held   uint32 // messages the reader holds
			grants []uint32
		)
		lim.Init(uint32(credits))
		w.Init(uint32(credits))
		b.Init(int64(budget))
		for _, op := range ops {
			switch op % 4 {
			case 0: // the peer sends what its limit allows
				for sent != lim.Load() {
					if !tk.Take(&w) {
						t.Fatalf("message %d overran: limit %d, advertised %d", sent, lim.Load(), w.Advertised())
					}
					sent++
					held++
				}
			case 1: // the reader releases one
				if held > 0 {
					held--
					w.Release(1, uint32(max), &b, true)
				}
			case 2: // a grant goes out (stamped on anything posted)
				grants = append(grants, w.Stamp())
			case 3: // the oldest grant in flight arrives
				if len(grants) > 0 {
					if _, ok := lim.Grant(grants[0], uint32(max)); !ok {
						t.Fatalf("grant %d refused from limit %d", grants[0], lim.Load())
					}
					grants = grants[1:]
				}
			}
			s := w.Size()
			if s < uint32(credits) || s > max32(uint32(max), uint32(credits)) || s%uint32(credits) != 0 || (s/uint32(credits))&(s/uint32(credits)-1) != 0 {
				t.Fatalf("window %d from %d, max %d", s, credits, max)
			}
			if lent := int64(budget) - b.Left(); b.Left() < 0 || lent != int64(s)-int64(credits) {
				t.Fatalf("budget lent %d for a window of %d over %d", lent, s, credits)
			}
		}
		w.Shrink(uint32(credits), &b)
		if b.Left() != int64(budget) {
			t.Fatalf("budget %d after Shrink, want %d", b.Left(), budget)
		}
	})
}

func max32(a, b uint32) uint32 { return max(a, b) }
