package bench

import (
	"bytes"
	"strings"
	"testing"
)

const e4Sample = `goos: linux
pkg: github.com/rdmavisor/rdmavisor/pkg/vconn
BenchmarkE4/rtt/socket-2         	   15582	    212221 ns/op	       127.9 p50-µs/rtt	       212.2 µs/rtt	    1269 B/op	      20 allocs/op
BenchmarkE4/stream/shm-2      	  893091	      2879 ns/op	    347393 msgs/s
BenchmarkE4Paired-2   	       7	 148264746 ns/op	         2.270 shm/engine-p50
PASS
ok  	github.com/rdmavisor/rdmavisor/pkg/vconn	12.3s
`

func TestParseGoBench(t *testing.T) {
	bs, err := ParseGoBench(strings.NewReader(e4Sample))
	if err != nil {
		t.Fatal(err)
	}
	if len(bs) != 3 {
		t.Fatalf("%d lines, want 3: %+v", len(bs), bs)
	}
	if b := bs[0]; b.Name != "BenchmarkE4/rtt/socket" || b.Iterations != 15582 || b.Metrics["p50-µs/rtt"] != 127.9 || b.Metrics["allocs/op"] != 20 {
		t.Errorf("first line: %+v", b)
	}
	if bs[2].Metrics["shm/engine-p50"] != 2.27 {
		t.Errorf("paired line: %+v", bs[2])
	}
	for _, bad := range []string{"BenchmarkX-2 10 5 ns/op extra\n", "BenchmarkX-2 10 five ns/op\n", "BenchmarkX-2 10 NaN ns/op\n"} {
		if _, err := ParseGoBench(strings.NewReader(bad)); err == nil {
			t.Errorf("%q: no error", bad)
		}
	}
}

func FuzzParseGoBench(f *testing.F) {
	f.Add(e4Sample)
	f.Add("BenchmarkX-2 10 5 ns/op\n")
	f.Add("BenchmarkX-2 10 5 ns/op 7\n")
	f.Add("BenchmarkX\n--- FAIL: BenchmarkX\n")
	f.Fuzz(func(t *testing.T, in string) {
		bs, err := ParseGoBench(strings.NewReader(in))
		if err != nil {
			return
		}
		for _, b := range bs {
			if !strings.HasPrefix(b.Name, "Benchmark") || b.Iterations < 0 {
				t.Fatalf("accepted %+v", b)
			}
		}
	})
}

// TestFigures draws every figure from a run with each suite: well-formed
// SVG with the paper's knee on the E1 figures; a run with E1 only has no
// E2, E4 or E5 figure.
func TestFigures(t *testing.T) {
	recs, err := ReadRecords(strings.NewReader(sampleRun))
	if err != nil {
		t.Fatal(err)
	}
	e4, err := ParseGoBench(strings.NewReader(e4Sample))
	if err != nil {
		t.Fatal(err)
	}
	figs := Figures(recs, e4)
	var names []string
	for _, f := range figs {
		names = append(names, f.File)
		var b bytes.Buffer
		if err := f.Chart.SVG(&b); err != nil {
			t.Fatalf("%s: %v", f.File, err)
		}
		if strings.HasPrefix(f.File, "e1-") && !strings.Contains(b.String(), "collapses past ~400") {
			t.Errorf("%s lacks the paper's knee", f.File)
		}
	}
	if got, want := strings.Join(names, " "), "e1-msgs.svg e1-cpu.svg e2-bytes.svg e5-size.svg e4-rtt.svg e4-rate.svg"; got != want {
		t.Errorf("figures %q, want %q", got, want)
	}
	e1Only, err := ReadRecords(strings.NewReader(strings.SplitN(sampleRun, "\n\n", 2)[0]))
	if err != nil {
		t.Fatal(err)
	}
	names = names[:0]
	for _, f := range Figures(e1Only, nil) {
		names = append(names, f.File)
	}
	if got, want := strings.Join(names, " "), "e1-msgs.svg e1-cpu.svg"; got != want {
		t.Errorf("E1 only: figures %q, want %q", got, want)
	}
}
