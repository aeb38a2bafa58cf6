package reliable

import (
	"slices"
	"sync"
	"testing"
)

// recv runs one message through a Receiver as the engine does: duplicates
// and what lies past the window dropped, early ones held, the next
// accepted and handed over with what it releases. It reports whether a gap
// report is due.
func recv(r *Receiver[uint32], seq uint32, window int, out *[]uint32) (dropped, report bool) {
	r.Lock()
	defer r.Unlock()
	d := r.Offset(seq)
	if !r.Accepts(d, window) {
		return true, false
	}
	if d > 0 {
		return false, r.Hold(d, seq)
	}
	_, report = r.Accept(seq)
	r.Handover(func(m uint32) { *out = append(*out, m) })
	return false, report
}

func TestReceiver(t *testing.T) {
	for _, tc := range []struct {
		name    string
		start   uint32
		arrive  []uint32
		window  int
		out     []uint32
		dropped []bool
		reports []bool
		gapEnd  uint32
	}{
		{"in order", 0, []uint32{0, 1, 2}, 4, []uint32{0, 1, 2},
			[]bool{false, false, false}, []bool{false, false, false}, 0},
		{"one early, then the gap fills", 0, []uint32{1, 0}, 4, []uint32{0, 1},
			[]bool{false, false}, []bool{true, false}, 1},
		{"a gap reported once", 0, []uint32{2, 3, 1, 0}, 4, []uint32{0, 1, 2, 3},
			[]bool{false, false, false, false}, []bool{true, false, false, false}, 2},
		{"duplicates dropped", 0, []uint32{0, 0, 2, 2, 1}, 4, []uint32{0, 1, 2},
			[]bool{false, true, false, true, false}, []bool{false, false, true, false, false}, 2},
		{"past the window dropped", 0, []uint32{5, 4}, 4, nil,
			[]bool{true, false}, []bool{false, true}, 4},
		{"a second gap behind the first", 0, []uint32{1, 3, 0, 2}, 4, []uint32{0, 1, 2, 3},
			[]bool{false, false, false, false}, []bool{true, false, true, false}, 3},
		{"across the wrap", ^uint32(0), []uint32{0, ^uint32(0), 1}, 4, []uint32{^uint32(0), 0, 1},
			[]bool{false, false, false}, []bool{true, false, false}, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var r Receiver[uint32]
			r.next.Store(tc.start)
			var out []uint32
			for i, seq := range tc.arrive {
				dropped, report := recv(&r, seq, tc.window, &out)
				if dropped != tc.dropped[i] || report != tc.reports[i] {
					t.Fatalf("message %d (seq %d): dropped %v, report %v; want %v, %v", i, seq, dropped, report, tc.dropped[i], tc.reports[i])
				}
			}
			if !slices.Equal(out, tc.out) {
				t.Fatalf("delivered %v, want %v", out, tc.out)
			}
			if got := r.GapEnd(); got != tc.gapEnd {
				t.Fatalf("gap end %d, want %d", got, tc.gapEnd)
			}
		})
	}
}

// Acknowledgements: Ack stamps the next expected and remembers it sent;
// FirstCopy tells a first copy from a resend.
func TestReceiverAck(t *testing.T) {
	var r Receiver[uint32]
	var out []uint32
	recv(&r, 0, 4, &out)
	recv(&r, 2, 4, &out)
	if r.Next() != 1 || r.AckSent() != 0 {
		t.Fatalf("next %d, ack sent %d", r.Next(), r.AckSent())
	}
	if a := r.Ack(); a != 1 || r.AckSent() != 1 {
		t.Fatalf("Ack %d, sent %d; want 1", a, r.AckSent())
	}
	for seq, first := range map[uint32]bool{0: false, 1: true, 2: false, 3: true, 9: false} {
		if got := r.FirstCopy(seq, 4); got != first {
			t.Errorf("FirstCopy(%d) = %v, want %v", seq, got, first)
		}
	}
	if r.Early() != 1 {
		t.Fatalf("%d held early, want 1", r.Early())
	}
	var dropped []uint32
	r.DropEarly(func(m uint32) { dropped = append(dropped, m) })
	if !slices.Equal(dropped, []uint32{2}) || r.Early() != 0 {
		t.Fatalf("DropEarly handed %v, %d left", dropped, r.Early())
	}
}

// Handover keeps the order across goroutines: one delivers while others
// accept, and what they accept is delivered by the one delivering, in
// order.
func TestReceiverConcurrent(t *testing.T) {
	var r Receiver[uint32]
	var mu sync.Mutex
	var out []uint32
	deliver := func(m uint32) {
		mu.Lock()
		out = append(out, m)
		mu.Unlock()
	}
	const n = 4000
	var wg sync.WaitGroup
	for g := range 4 {
		wg.Go(func() {
			for seq := uint32(g); seq < n; seq += 4 {
				for {
					r.Lock()
					if d := r.Offset(seq); d == 0 {
						r.Accept(seq)
						r.Handover(deliver)
						r.Unlock()
						break
					} else if d > 0 && r.Accepts(d, n) {
						r.Hold(d, seq)
						r.Unlock()
						break
					}
					r.Unlock()
				}
			}
		})
	}
	wg.Wait()
	if len(out) != n {
		t.Fatalf("%d of %d delivered", len(out), n)
	}
	for i, m := range out {
		if m != uint32(i) {
			t.Fatalf("message %d delivered at %d", m, i)
		}
	}
}

// FuzzReceiver: whatever arrives, in any order, duplicated, and whatever is
// dropped for the window is resent: every message is delivered once, in
// sequence order, and a gap is reported once each time the next expected
// changes while later messages wait.
func FuzzReceiver(f *testing.F) {
	f.Add(uint32(0), uint8(4), []byte{1, 0, 2, 2, 5, 3, 4})
	f.Add(^uint32(0)-2, uint8(2), []byte{3, 2, 1, 0, 0, 7, 6, 5, 4})
	f.Fuzz(func(t *testing.T, start uint32, window uint8, order []byte) {
		if window == 0 {
			return
		}
		var r Receiver[uint32]
		r.next.Store(start)
		var out []uint32
		top := uint32(0)
		reported := map[uint32]bool{}
		for _, b := range order {
			seq := start + uint32(b%32)
			top = max(top, uint32(b%32)+1)
			_, report := recv(&r, seq, int(window), &out)
			if report {
				if reported[r.Next()] {
					t.Fatalf("gap at %d reported twice", r.Next())
				}
				reported[r.Next()] = true
				if end := r.GapEnd(); int32(end-r.Next()) <= 0 {
					t.Fatalf("gap at %d ends at %d", r.Next(), end)
				}
			}
		}
		// The sender resends what was not delivered, in order.
		for i := uint32(0); i < top; i++ {
			recv(&r, start+i, int(window), &out)
		}
		if uint32(len(out)) != top {
			t.Fatalf("%d of %d delivered", len(out), top)
		}
		for i, m := range out {
			if m != start+uint32(i) {
				t.Fatalf("delivered %d at %d", m-start, i)
			}
		}
		if r.Early() != 0 {
			t.Fatalf("%d still held", r.Early())
		}
	})
}

// TestReceiverFin: a FIN past a gap (messages held early) says they were
// lost; one that comes while another goroutine hands messages over (they
// arrived before it, on another poller) waits for the handover, and
// FinDue says so once, to the goroutine whose Handover ends; one with
// nothing pending ends the stream at once.
func TestReceiverFin(t *testing.T) {
	var r Receiver[uint32]
	var out []uint32
	recv(&r, 0, 8, &out)
	recv(&r, 2, 8, &out) // 1 missing
	r.Lock()
	lost, later := r.Fin()
	r.Unlock()
	if !lost || later {
		t.Fatalf("FIN past a gap: lost %v, later %v; want lost", lost, later)
	}

	r = Receiver[uint32]{}
	out = nil
	r.Lock()
	r.Accept(0)
	r.Accept(1)
	var fin []bool // FinDue as each message is handed over, and after
	r.Handover(func(m uint32) {
		out = append(out, m)
		r.Lock() // the FIN, on another poller, mid-handover
		if m == 0 {
			if lost, later := r.Fin(); lost || !later {
				t.Errorf("FIN during a handover: lost %v, later %v; want later", lost, later)
			}
		}
		fin = append(fin, r.FinDue())
		r.Unlock()
	})
	fin = append(fin, r.FinDue(), r.FinDue())
	r.Unlock()
	if !slices.Equal(out, []uint32{0, 1}) || !slices.Equal(fin, []bool{false, false, true, false}) {
		t.Fatalf("handed over %v, FinDue %v; want [0 1], due once after the handover", out, fin)
	}

	r = Receiver[uint32]{}
	recv(&r, 0, 8, &out)
	r.Lock()
	lost, later = r.Fin()
	due := r.FinDue()
	r.Unlock()
	if lost || later || due {
		t.Fatalf("FIN with nothing pending: lost %v, later %v, due %v; want none", lost, later, due)
	}
}
