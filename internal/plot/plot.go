// Package plot draws the benchmark figures as SVG with the standard library
// only: line charts on linear or logarithmic axes and bar charts, small
// enough to read and to diff.
package plot

import (
	"errors"
	"fmt"
	"html"
	"io"
	"math"
	"strconv"
	"strings"
)

// Series is one line of a Chart. A NaN Y is a point not measured: the line
// breaks there.
type Series struct {
	Name   string
	X, Y   []float64
	Dashed bool
	// Color is an SVG color (default: the palette's, by position).
	Color string
}

// color is s's color, the palette's k-th by default.
func (s Series) color(k int) string {
	if s.Color != "" {
		return s.Color
	}
	return palette[k%len(palette)]
}

// Ref is a vertical reference line at X, labelled.
type Ref struct {
	X     float64
	Label string
}

// Chart is a line chart.
type Chart struct {
	Title, XLabel, YLabel string
	LogX, LogY            bool
	Series                []Series
	Refs                  []Ref
	// Notes are lines of text under the title.
	Notes []string
}

// Bars is a bar chart: one group per label, one bar per series in each.
type Bars struct {
	Title, YLabel string
	Groups        []string
	Series        []Series // Y[i] is the bar of Groups[i]; X unused
	Notes         []string

	// LogY draws the Y axis on a logarithmic scale, the bars rising from
	// its bottom.
	LogY bool
}

const (
	width, height            = 760, 460
	left, right, top, bottom = 90, 200, 60, 60
)

var palette = []string{"#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f"}

// ErrNoData is returned for a chart without a finite point to draw.
var ErrNoData = errors.New("plot: nothing to draw")

// scale maps data to pixels on one axis.
type scale struct {
	lo, hi   float64 // data range (log10 of it when log)
	log      bool
	p0, p1   float64 // pixel range
	tickVals []float64
}

func (s scale) px(v float64) float64 {
	if s.log {
		v = math.Log10(v)
	}
	return s.p0 + (v-s.lo)/(s.hi-s.lo)*(s.p1-s.p0)
}

func newScale(lo, hi float64, log, zero bool, p0, p1 float64) scale {
	s := scale{log: log, p0: p0, p1: p1}
	if log {
		s.lo, s.hi = math.Floor(math.Log10(lo)), math.Ceil(math.Log10(hi))
		if s.hi == s.lo {
			s.hi++
		}
		for e := s.lo; e <= s.hi; e++ {
			s.tickVals = append(s.tickVals, math.Pow(10, e))
		}
		return s
	}
	if zero {
		lo = min(lo, 0)
	}
	if hi == lo {
		hi = lo + 1
	}
	step := niceStep((hi - lo) / 5)
	s.lo, s.hi = math.Floor(lo/step)*step, math.Ceil(hi*1.05/step)*step
	for v := s.lo; v <= s.hi+step/2; v += step {
		s.tickVals = append(s.tickVals, v)
	}
	return s
}

func niceStep(raw float64) float64 {
	p := math.Pow(10, math.Floor(math.Log10(raw)))
	for _, m := range []float64{1, 2, 2.5, 5, 10} {
		if m*p >= raw {
			return m * p
		}
	}
	return 10 * p
}

// Label writes v briefly: 1.5M, 20k, 0.25.
func Label(v float64) string {
	a := math.Abs(v)
	switch {
	case a >= 1e9:
		return trim(v/1e9) + "G"
	case a >= 1e6:
		return trim(v/1e6) + "M"
	case a >= 1e3:
		return trim(v/1e3) + "k"
	}
	return trim(v)
}

func trim(v float64) string { return strconv.FormatFloat(v, 'g', 3, 64) }

// svg accumulates a document.
type svg struct{ b strings.Builder }

func (s *svg) f(format string, args ...any) { fmt.Fprintf(&s.b, format, args...) }

func (s *svg) text(x, y float64, anchor, extra, t string) {
	s.f("<text x=\"%.1f\" y=\"%.1f\" text-anchor=\"%s\"%s>%s</text>\n", x, y, anchor, extra, html.EscapeString(t))
}

func (s *svg) head(title string, notes []string) {
	s.f("<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"%d\" height=\"%d\" viewBox=\"0 0 %d %d\" font-family=\"sans-serif\" font-size=\"12\">\n", width, height, width, height)
	s.f("<rect width=\"100%%\" height=\"100%%\" fill=\"white\"/>\n")
	s.text(width/2, 20, "middle", " font-size=\"15\" font-weight=\"bold\"", title)
	for i, n := range notes {
		s.text(width/2, 36+float64(i)*13, "middle", " fill=\"#555\" font-size=\"11\"", n)
	}
}

func (s *svg) axes(xs, ys scale, xlabel, ylabel string, xticks []float64, xtick func(float64) string) {
	x0, x1, y0, y1 := float64(left), float64(width-right), float64(height-bottom), float64(top)
	for _, v := range ys.tickVals {
		y := ys.px(v)
		s.f("<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" stroke=\"#ddd\"/>\n", x0, y, x1, y)
		s.text(x0-6, y+4, "end", "", Label(v))
	}
	for _, v := range xticks {
		x := xs.px(v)
		s.f("<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" stroke=\"#eee\"/>\n", x, y0, x, y1)
		s.text(x, y0+16, "middle", "", xtick(v))
	}
	s.f("<rect x=\"%.1f\" y=\"%.1f\" width=\"%.1f\" height=\"%.1f\" fill=\"none\" stroke=\"#333\"/>\n", x0, y1, x1-x0, y0-y1)
	s.text((x0+x1)/2, float64(height-18), "middle", "", xlabel)
	s.f("<text transform=\"translate(18 %.1f) rotate(-90)\" text-anchor=\"middle\">%s</text>\n", (y0+y1)/2, html.EscapeString(ylabel))
}

func (s *svg) legend(names, colors []string, dashed []bool) {
	x := float64(width - right + 16)
	for i, n := range names {
		y := float64(top+10) + float64(i)*18
		dash := ""
		if dashed != nil && dashed[i] {
			dash = " stroke-dasharray=\"6 4\""
		}
		s.f("<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" stroke=\"%s\" stroke-width=\"2.5\"%s/>\n", x, y, x+24, y, html.EscapeString(colors[i]), dash)
		s.text(x+30, y+4, "start", "", n)
	}
}

// SVG writes the chart.
func (c Chart) SVG(w io.Writer) error {
	xlo, xhi, ylo, yhi := math.Inf(1), math.Inf(-1), math.Inf(1), math.Inf(-1)
	for _, sr := range c.Series {
		for i := range min(len(sr.X), len(sr.Y)) {
			x, y := sr.X[i], sr.Y[i]
			if !usable(x, c.LogX) || !usable(y, c.LogY) {
				continue
			}
			xlo, xhi, ylo, yhi = min(xlo, x), max(xhi, x), min(ylo, y), max(yhi, y)
		}
	}
	if math.IsInf(xlo, 0) {
		return fmt.Errorf("%w: %s", ErrNoData, c.Title)
	}
	xs := newScale(xlo, xhi, c.LogX, false, left, width-right)
	if !c.LogX {
		xs = scale{lo: xlo, hi: max(xhi, xlo+1), p0: left, p1: width - right, tickVals: newScale(xlo, xhi, false, false, 0, 1).tickVals}
		xs.hi = xs.tickVals[len(xs.tickVals)-1]
		xs.lo = xs.tickVals[0]
	}
	ys := newScale(ylo, yhi, c.LogY, true, height-bottom, top)
	var s svg
	s.head(c.Title, c.Notes)
	s.axes(xs, ys, c.XLabel, c.YLabel, xs.tickVals, Label)
	for _, r := range c.Refs {
		if !usable(r.X, c.LogX) {
			continue
		}
		x := xs.px(r.X)
		s.f("<line x1=\"%.1f\" y1=\"%d\" x2=\"%.1f\" y2=\"%d\" stroke=\"#888\" stroke-dasharray=\"2 3\"/>\n", x, top, x, height-bottom)
		// Labels right of the middle run leftwards, clear of the legend.
		if x > (left+width-right)/2 {
			s.text(x-4, top+14, "end", " fill=\"#555\" font-size=\"11\"", r.Label)
		} else {
			s.text(x+4, top+14, "start", " fill=\"#555\" font-size=\"11\"", r.Label)
		}
	}
	names := make([]string, len(c.Series))
	colors := make([]string, len(c.Series))
	dashed := make([]bool, len(c.Series))
	for k, sr := range c.Series {
		color := html.EscapeString(sr.color(k))
		names[k], colors[k], dashed[k] = sr.Name, color, sr.Dashed
		dash := ""
		if sr.Dashed {
			dash = " stroke-dasharray=\"6 4\""
		}
		var path strings.Builder
		pen := false
		for i := range min(len(sr.X), len(sr.Y)) {
			x, y := sr.X[i], sr.Y[i]
			if !usable(x, c.LogX) || !usable(y, c.LogY) {
				pen = false
				continue
			}
			cmd := "L"
			if !pen {
				cmd = "M"
			}
			fmt.Fprintf(&path, "%s%.1f %.1f ", cmd, xs.px(x), ys.px(y))
			pen = true
			s.f("<circle cx=\"%.1f\" cy=\"%.1f\" r=\"3\" fill=\"%s\"/>\n", xs.px(x), ys.px(y), color)
		}
		if path.Len() > 0 {
			s.f("<path d=\"%s\" fill=\"none\" stroke=\"%s\" stroke-width=\"2\"%s/>\n", strings.TrimSpace(path.String()), color, dash)
		}
	}
	s.legend(names, colors, dashed)
	s.f("</svg>\n")
	_, err := io.WriteString(w, s.b.String())
	return err
}

// SVG writes the bar chart.
func (b Bars) SVG(w io.Writer) error {
	ylo, yhi := math.Inf(1), math.Inf(-1)
	for _, sr := range b.Series {
		for _, y := range sr.Y {
			if usable(y, b.LogY) {
				ylo, yhi = min(ylo, y), max(yhi, y)
			}
		}
	}
	if math.IsInf(yhi, 0) || len(b.Groups) == 0 {
		return fmt.Errorf("%w: %s", ErrNoData, b.Title)
	}
	if !b.LogY {
		ylo = 0
	}
	ys := newScale(ylo, yhi, b.LogY, true, height-bottom, top)
	var s svg
	s.head(b.Title, b.Notes)
	groupW := float64(width-left-right) / float64(len(b.Groups))
	xs := scale{lo: 0, hi: float64(len(b.Groups)), p0: left, p1: width - right}
	var ticks []float64
	for i := range b.Groups {
		ticks = append(ticks, float64(i)+0.5)
	}
	s.axes(xs, ys, "", b.YLabel, ticks, func(v float64) string { return b.Groups[int(v)] })
	n := max(1, len(b.Series))
	barW := groupW * 0.7 / float64(n)
	names := make([]string, len(b.Series))
	colors := make([]string, len(b.Series))
	for k, sr := range b.Series {
		names[k], colors[k] = sr.Name, sr.color(k)
		for i := range min(len(sr.Y), len(b.Groups)) {
			y := sr.Y[i]
			if !usable(y, b.LogY) {
				continue
			}
			x := float64(left) + groupW*float64(i) + groupW*0.15 + barW*float64(k)
			top := ys.px(y)
			s.f("<rect x=\"%.1f\" y=\"%.1f\" width=\"%.1f\" height=\"%.1f\" fill=\"%s\"/>\n", x, top, barW, float64(height-bottom)-top, html.EscapeString(colors[k]))
			if barW < 20 { // too narrow for its value written across: upwards
				s.text(x+barW/2+3.5, top-3, "start", fmt.Sprintf(" font-size=\"10\" transform=\"rotate(-90 %.1f %.1f)\"", x+barW/2+3.5, top-3), Label(y))
				continue
			}
			s.text(x+barW/2, top-4, "middle", " font-size=\"11\"", Label(y))
		}
	}
	s.legend(names, colors, nil)
	s.f("</svg>\n")
	_, err := io.WriteString(w, s.b.String())
	return err
}

// usable says whether v can be drawn on an axis.
func usable(v float64, log bool) bool {
	return !math.IsNaN(v) && !math.IsInf(v, 0) && (!log || v > 0)
}
