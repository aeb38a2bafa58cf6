package verbstest

import "testing"

func TestFillCheck(t *testing.T) {
	for _, n := range []int{0, 1, 7, 8, 9, 4096, 4099} {
		b := Pattern(n, 42)
		if err := Check(b, 42); err != nil {
			t.Errorf("n=%d: Check of its own pattern: %v", n, err)
		}
		if n == 0 {
			continue
		}
		if err := Check(b, 43); err == nil {
			t.Errorf("n=%d: pattern of seed 42 passes as seed 43", n)
		}
		b[n-1] ^= 1
		if err := Check(b, 42); err == nil {
			t.Errorf("n=%d: a flipped last bit passes", n)
		}
		if err := Check(make([]byte, n), 42); err == nil && n >= 8 {
			t.Errorf("n=%d: zeroed memory passes", n)
		}
	}
	if a, b := Pattern(100, 1), Pattern(100, 2); string(a[8:]) == string(b[8:]) {
		t.Errorf("seeds 1 and 2 give the same pattern")
	}
}

func TestConnectOptionsDefaults(t *testing.T) {
	for _, c := range []struct{ v, def, want int }{{0, 7, 7}, {-1, 7, 0}, {3, 7, 3}} {
		if got := orDefault(c.v, c.def); int(got) != c.want {
			t.Errorf("orDefault(%d, %d) = %d, want %d", c.v, c.def, got, c.want)
		}
	}
	if p := psnFor(0, 5); p > 0xFFFFFF {
		t.Errorf("derived PSN %#x wider than 24 bits", p)
	}
	if p := psnFor(0x1FFFFFF, 5); p != 0xFFFFFF {
		t.Errorf("psnFor masks to 24 bits: got %#x", p)
	}
}

func TestFaultSizesMixed(t *testing.T) {
	multi := 0
	for seq := range 10000 {
		if faultSize(seq) > 1024 {
			multi++
		}
	}
	if multi < 2000 || multi > 8000 {
		t.Errorf("%d of 10000 fault messages are multi-packet at MTU 1024", multi)
	}
}
