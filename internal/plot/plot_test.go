package plot

import (
	"bytes"
	"encoding/xml"
	"errors"
	"io"
	"math"
	"strings"
	"testing"
)

// wellFormed decodes the whole document as XML.
func wellFormed(t *testing.T, b []byte) {
	t.Helper()
	d := xml.NewDecoder(bytes.NewReader(b))
	for {
		_, err := d.Token()
		if err == io.EOF {
			return
		}
		if err != nil {
			t.Fatalf("not XML: %v\n%s", err, b)
		}
	}
}

func TestChart(t *testing.T) {
	c := Chart{
		Title: "E1 <msgs/s>", XLabel: "connections", YLabel: "msgs/s", LogX: true,
		Series: []Series{
			{Name: "engine", X: []float64{1, 100, 10000}, Y: []float64{5e5, 9e5, 8e5}},
			{Name: "naive & model", X: []float64{1, 100, 1000, 10000}, Y: []float64{4e5, math.NaN(), 1e5, 2e4}, Dashed: true},
		},
		Refs:  []Ref{{X: 400, Label: "paper: knee at ~400"}},
		Notes: []string{"a note"},
	}
	var b bytes.Buffer
	if err := c.SVG(&b); err != nil {
		t.Fatal(err)
	}
	wellFormed(t, b.Bytes())
	s := b.String()
	if n := strings.Count(s, "<path "); n != 2 {
		t.Errorf("%d paths, want 2", n)
	}
	// The unmeasured point breaks naive's line into two pieces.
	if n := strings.Count(s, "M"); n < 3 {
		t.Errorf("%d moves, want 3 (one for engine, two for naive)", n)
	}
	if n := strings.Count(s, "<circle "); n != 6 {
		t.Errorf("%d points, want 6", n)
	}
	for _, want := range []string{"E1 &lt;msgs/s&gt;", "naive &amp; model", "stroke-dasharray=\"6 4\"", "10k", "paper: knee at ~400"} {
		if !strings.Contains(s, want) {
			t.Errorf("SVG lacks %q", want)
		}
	}
}

func TestNoData(t *testing.T) {
	var b bytes.Buffer
	c := Chart{Title: "empty", LogY: true, Series: []Series{{X: []float64{1}, Y: []float64{0}}}}
	if err := c.SVG(&b); !errors.Is(err, ErrNoData) {
		t.Errorf("chart of a zero on a log axis: %v, want ErrNoData", err)
	}
	if err := (Bars{Title: "empty"}).SVG(&b); !errors.Is(err, ErrNoData) {
		t.Errorf("bars without groups: %v, want ErrNoData", err)
	}
}

func TestBars(t *testing.T) {
	bs := Bars{Title: "E4", YLabel: "µs", Groups: []string{"socket", "shm", "engine"},
		Series: []Series{{Name: "p50", Y: []float64{128, 120, 43.5}}, {Name: "mean", Y: []float64{212, math.NaN(), 64}}}}
	var b bytes.Buffer
	if err := bs.SVG(&b); err != nil {
		t.Fatal(err)
	}
	wellFormed(t, b.Bytes())
	// 5 bars, plus the background and the frame.
	if n := strings.Count(b.String(), "<rect "); n != 7 {
		t.Errorf("%d rects, want 7", n)
	}
}

func TestLabel(t *testing.T) {
	for v, want := range map[float64]string{1: "1", 1500: "1.5k", 2e6: "2M", 0.25: "0.25", 100000: "100k"} {
		if got := Label(v); got != want {
			t.Errorf("Label(%v) = %q, want %q", v, got, want)
		}
	}
}

func TestBarsLog(t *testing.T) {
	bs := Bars{Title: "E6", YLabel: "µs", LogY: true, Groups: []string{"engine", "shm", "socket", "libvconn", "preload", "python", "tcp", "tcp-c"},
		Series: []Series{{Name: "p50", Y: []float64{30, 60, 70, 90, 100, 250, 15, 0}}, {Name: "p99", Y: []float64{90, 200, 300, 400, 500, 2000, 40, 50}},
			{Name: "p50 busy", Y: []float64{40, 80, 90, 120, 130, 400, 20, 20}}, {Name: "p99 busy", Y: []float64{900, 2e3, 3e3, 4e3, 5e3, 2e4, 400, 500}}}}
	var b bytes.Buffer
	if err := bs.SVG(&b); err != nil {
		t.Fatal(err)
	}
	wellFormed(t, b.Bytes())
	s := b.String()
	// 31 bars (a zero has no place on a log axis), the background and the frame.
	if n := strings.Count(s, "<rect "); n != 33 {
		t.Errorf("%d rects, want 33", n)
	}
	// Ticks at the powers of ten from 10 to 100k; narrow bars' values written upwards.
	for _, want := range []string{">10<", ">100k<", ">20k<", "rotate(-90"} {
		if !strings.Contains(s, want) {
			t.Errorf("SVG lacks %q", want)
		}
	}
}
