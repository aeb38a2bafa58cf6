package reliable

import (
	"testing"
	"time"
)

// run sends windows of DefaultPathPolicy.Window datagrams, resent of them resent each,
// a millisecond apart, and returns the time after them.
func run(p *Path, now time.Time, windows int, resent uint32) time.Time {
	for range windows {
		for i := range DefaultPathPolicy.Window {
			if i < resent {
				p.Lost()
			}
			now = now.Add(time.Millisecond / time.Duration(DefaultPathPolicy.Window))
			p.Sent(now)
		}
	}
	return now
}

func TestPathPolicy(t *testing.T) {
	for _, tc := range []struct {
		name    string
		resent  []uint32 // per phase, DefaultPathPolicy.Window datagrams a window
		windows int      // per phase
		onRC    []bool
	}{
		{"no loss stays on UC", []uint32{0}, 20, []bool{false}},
		{"loss under HighLoss stays on UC", []uint32{DefaultPathPolicy.Window / 4}, 20, []bool{false}},
		{"heavy loss moves to RC", []uint32{DefaultPathPolicy.Window / 2}, 20, []bool{true}},
		{"and back once it ends", []uint32{DefaultPathPolicy.Window / 2, 0}, 20, []bool{true, false}},
		{"loss between the thresholds keeps RC", []uint32{DefaultPathPolicy.Window / 2, DefaultPathPolicy.Window / 5}, 20, []bool{true, true}},
		{"loss between the thresholds keeps UC", []uint32{0, DefaultPathPolicy.Window / 5}, 20, []bool{false, false}},
		{"a short burst does not switch", []uint32{0, DefaultPathPolicy.Window}, 1, []bool{false, false}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var p Path
			p.RTT(10 * time.Microsecond)
			now := epoch
			for i, r := range tc.resent {
				now = run(&p, now, tc.windows, r)
				if p.OnRC() != tc.onRC[i] {
					t.Fatalf("phase %d: on RC %v, want %v (%+v)", i, p.OnRC(), tc.onRC[i], p.State())
				}
			}
		})
	}
}

// Hysteresis: loss that alternates across both thresholds every window
// switches the path at most once per DefaultPathPolicy.HoldWindows windows.
func TestPathNoFlapping(t *testing.T) {
	var p Path
	now := epoch
	const windows = 200
	for i := range windows {
		r := uint32(0)
		if i%2 == 0 {
			r = DefaultPathPolicy.Window
		}
		now = run(&p, now, 1, r)
	}
	if s := p.State().Switches; s > uint64(windows/DefaultPathPolicy.HoldWindows) {
		t.Fatalf("%d switches in %d windows", s, windows)
	}
}

// A path must hold its choice HoldRTTs round trips too: on a slow path,
// windows that close quickly do not switch it back.
func TestPathHoldsRoundTrips(t *testing.T) {
	var p Path
	p.RTT(time.Second)
	now := run(&p, epoch, 10, DefaultPathPolicy.Window)
	// The first switch waits HoldRTTs round trips from the start.
	if p.OnRC() {
		t.Fatal("switched before HoldRTTs round trips")
	}
	now = now.Add(time.Duration(DefaultPathPolicy.HoldRTTs) * time.Second)
	now = run(&p, now, 1, DefaultPathPolicy.Window)
	if !p.OnRC() {
		t.Fatalf("not on RC after %v of heavy loss: %+v", now.Sub(epoch), p.State())
	}
}

func TestPathProbes(t *testing.T) {
	var p Path
	for range 100 {
		if !p.Datagram() {
			t.Fatal("a small message left UC on a path without loss")
		}
	}
	p.RTT(time.Microsecond)
	run(&p, epoch, 2*DefaultPathPolicy.HoldWindows, DefaultPathPolicy.Window)
	if !p.OnRC() {
		t.Fatalf("not on RC: %+v", p.State())
	}
	n := 0
	for range 10 * DefaultPathPolicy.ProbeEvery {
		if p.Datagram() {
			n++
		}
	}
	if n != 10 {
		t.Fatalf("%d probes in %d messages on RC, want 10", n, 10*DefaultPathPolicy.ProbeEvery)
	}
}

func TestPathRTT(t *testing.T) {
	var p Path
	p.RTT(0) // no sample
	p.RTT(8 * time.Millisecond)
	p.RTT(16 * time.Millisecond)
	if got := p.State().SRTT; got != 9*time.Millisecond {
		t.Fatalf("srtt %v, want 9ms", got)
	}
}

// FuzzPath: any sequence of sends, resends, samples and messages keeps the
// estimate in bounds and switches at most once per DefaultPathPolicy.HoldWindows windows.
func FuzzPath(f *testing.F) {
	f.Add([]byte{0, 1, 2, 3, 4})
	f.Add([]byte{1, 1, 1, 1, 0, 0, 0, 0, 0, 0, 0, 0, 2, 3})
	f.Fuzz(func(t *testing.T, ops []byte) {
		var p Path
		now := epoch
		windows := 0
		for _, op := range ops {
			now = now.Add(time.Duration(op) * time.Microsecond)
			switch op % 4 {
			case 0: // a window's worth of first sends
				for range DefaultPathPolicy.Window {
					p.Sent(now)
				}
				windows++
			case 1: // resends (there may be more than sends)
				for range op / 4 {
					p.Lost()
				}
			case 2:
				p.RTT(time.Duration(op) * time.Microsecond)
			case 3:
				p.Datagram()
			}
			s := p.State()
			if s.Loss < 0 || s.SRTT < 0 {
				t.Fatalf("estimate out of bounds: %+v", s)
			}
			if s.Switches > uint64(windows/DefaultPathPolicy.HoldWindows) {
				t.Fatalf("%d switches in %d windows", s.Switches, windows)
			}
		}
	})
}
