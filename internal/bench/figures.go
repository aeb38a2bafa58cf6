package bench

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"math"
	"regexp"
	"slices"
	"strconv"
	"strings"

	"github.com/rdmavisor/rdmavisor/internal/plot"
)

// GoBench is one result line of `go test -bench` output.
type GoBench struct {
	// Name is the benchmark's name without the -GOMAXPROCS suffix:
	// BenchmarkE4/rtt/shm.
	Name       string
	Iterations int64
	// Metrics are the line's values by unit: "ns/op", "p50-µs/rtt".
	Metrics map[string]float64
}

var procsSuffix = regexp.MustCompile(`-[0-9]+$`)

// ParseGoBench reads the result lines of `go test -bench` output; every
// other line (goos:, PASS, ok, logs) is skipped. A result line that does
// not parse is an error.
func ParseGoBench(r io.Reader) ([]GoBench, error) {
	var out []GoBench
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for line := 1; sc.Scan(); line++ {
		f := strings.Fields(sc.Text())
		// A result line is a name, an iteration count and value-unit
		// pairs; "BenchmarkX" alone (a -v header) or with text is not.
		if len(f) < 2 || !strings.HasPrefix(f[0], "Benchmark") {
			continue
		}
		n, err := strconv.ParseInt(f[1], 10, 64)
		if err != nil {
			continue // "BenchmarkX ... --- FAIL" and the like: not a result
		}
		if len(f)%2 != 0 || n < 0 {
			return nil, fmt.Errorf("bench: go test output line %d: want a name, a count and value-unit pairs: %q", line, sc.Text())
		}
		b := GoBench{Name: procsSuffix.ReplaceAllString(f[0], ""), Iterations: n, Metrics: map[string]float64{}}
		for i := 2; i < len(f); i += 2 {
			v, err := strconv.ParseFloat(f[i], 64)
			if err != nil || math.IsNaN(v) || math.IsInf(v, 0) {
				return nil, fmt.Errorf("bench: go test output line %d: value %q of %s: not a number", line, f[i], f[i+1])
			}
			b.Metrics[f[i+1]] = v
		}
		out = append(out, b)
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("bench: go test output: %w", err)
	}
	return out, nil
}

// Figure is a chart to write to File.
type Figure struct {
	File  string
	Chart interface{ SVG(io.Writer) error }
}

// designColor keeps a design's color across the model's settings.
var designColor = map[string]string{designEngine: "#1f77b4", designNaive: "#d62728"}

// PaperKnee is the RDMAvisor paper's claim the E1 figure is drawn against:
// one QP per connection collapses past about 400 connections.
const PaperKnee = 400

// Figures draws the run's records and the E4 benchmark lines: E1 rate and
// CPU per message against connections (model off and on), E2 bytes per
// vconn, E5 rate by size, E4 by path. Records of consecutive runs are
// merged (MergeRuns); an E4 line repeated by runs is drawn at its median.
// A figure without data is left out.
func Figures(recs []Record, e4 []GoBench) []Figure {
	rs := results{MergeRuns(recs)}
	figs := e1Figures(rs)
	figs = append(figs, e2Figure(rs))
	figs = append(figs, e5Figures(rs)...)
	figs = append(figs, e4Figures(e4)...)
	return slices.DeleteFunc(figs, func(f Figure) bool {
		return errors.Is(f.Chart.SVG(io.Discard), plot.ErrNoData)
	})
}

// plotValue is r's value v, NaN (no point) where r was not measured.
func plotValue(r *Record, v func(*Record) *float64) float64 {
	if r == nil || r.Error != "" || v(r) == nil {
		return math.NaN()
	}
	return *v(r)
}

// e1Figures are E1's messages/s and CPU time per message by connections.
func e1Figures(rs results) []Figure {
	paper := []plot.Ref{{X: PaperKnee, Label: "paper: one QP per connection collapses past ~400"}}
	return []Figure{
		{"e1-msgs.svg", plot.Chart{
			Title: "E1: 64-byte messages/s vs connections", XLabel: "connections (log)", YLabel: "messages/s", LogX: true,
			Series: e1Series(rs, msgsPerSec), Refs: paper,
			Notes: []string{"RDMAvisor paper: naive RDMA collapses past ~400 connections (NIC QP-context cache), RDMAvisor stays flat to 1,000+.", "Dashed: the soft provider's NIC model on (docs/architecture.md, \"NIC model\"). Missing points were not run (see summary.md)."},
		}},
		{"e1-cpu.svg", plot.Chart{
			Title: "E1: CPU time per message vs connections", XLabel: "connections (log)", YLabel: "CPU ns per message (both ends)", LogX: true, LogY: true,
			Series: e1Series(rs, cpuPerMsg), Refs: paper,
			Notes: []string{"getrusage of the whole process per delivered message; the NIC model's time is slept, so it does not show here."},
		}},
	}
}

// e1Series are E1's lines of value v: one per design and NIC model
// setting, dashed with the model.
func e1Series(rs results, v func(*Record) *float64) []plot.Series {
	var ss []plot.Series
	ns := counts(rs.recs, "e1")
	for _, nic := range e1Models(rs.recs) {
		for _, d := range []string{designEngine, designNaive} {
			s := plot.Series{Name: d, Dashed: nic, Color: designColor[d]}
			if nic {
				s.Name += ", NIC model"
			}
			for _, n := range ns {
				r := rs.find("e1", func(r *Record) bool { return r.Design == d && r.NICModel == nic && r.VConns == n })
				s.X, s.Y = append(s.X, float64(n)), append(s.Y, plotValue(r, v))
			}
			ss = append(ss, s)
		}
	}
	return ss
}

// e2Figure is E2's memory per vconn by vconns, a line per design.
func e2Figure(rs results) Figure {
	var e2 []plot.Series
	for _, d := range []string{designEngine, designNaive} {
		s := plot.Series{Name: d, Color: designColor[d]}
		for _, n := range counts(rs.recs, "e2") {
			r := rs.find("e2", func(r *Record) bool { return r.Design == d && r.VConns == n })
			s.X, s.Y = append(s.X, float64(n)), append(s.Y, plotValue(r, bytesPerVConn))
		}
		e2 = append(e2, s)
	}
	return Figure{"e2-bytes.svg", plot.Chart{
		Title: "E2: memory per vconn end", XLabel: "vconns (log)", YLabel: "bytes per vconn (heap + registered, log)", LogX: true, LogY: true, Series: e2,
	}}
}

// e5Figures are E5's messages/s by message size, a line per transport, and
// by packet loss.
func e5Figures(rs results) []Figure {
	var e5 []plot.Series
	for _, tr := range []string{"rc", "uc", "ud", "auto"} {
		s := plot.Series{Name: tr, Dashed: tr == "auto"}
		for _, size := range e5Sizes(rs.recs) {
			r := rs.find("e5", func(r *Record) bool { return r.Transport == tr && r.MsgBytes == size })
			s.X, s.Y = append(s.X, float64(size)), append(s.Y, plotValue(r, msgsPerSec))
		}
		e5 = append(e5, s)
	}
	return []Figure{
		{"e5-size.svg", plot.Chart{
			Title: "E5: messages/s by transport and message size", XLabel: "message bytes (log)", YLabel: "messages/s (log)", LogX: true, LogY: true, Series: e5,
			Notes: []string{"uc carries at most 16 KiB, ud one 4 KiB MTU: larger sizes are not run."},
		}},
		{"e5-loss.svg", plot.Chart{
			Title: "E5: messages/s by packet loss, auto (dashed) and rc", XLabel: "packet loss (%)", YLabel: "messages/s (log)", LogY: true,
			Series: e5LossSeries(rs.recs),
			Notes:  []string{"the in-memory fabric dropping packets at random; rc is the best reliable fixed transport"},
		}},
	}
}

// e4Figures are E4's round trip and one-way rate by path, from the Go
// benchmark lines e4.
func e4Figures(e4 []GoBench) []Figure {
	paths := []string{"socket", "shm", "engine"}
	var p50, mean, rate []float64
	for _, p := range paths {
		p50 = append(p50, e4Median(e4, "BenchmarkE4/rtt/"+p, "p50-µs/rtt"))
		mean = append(mean, e4Median(e4, "BenchmarkE4/rtt/"+p, "µs/rtt"))
		rate = append(rate, e4Median(e4, "BenchmarkE4/stream/"+p, "msgs/s"))
	}
	return []Figure{
		{"e4-rtt.svg", plot.Bars{
			Title: "E4: round trip by path (64-byte messages)", YLabel: "µs", Groups: paths,
			Series: []plot.Series{{Name: "p50", Y: p50}, {Name: "mean", Y: mean}},
			Notes:  []string{"pods on the unix socket, on shared memory, and the engines called directly (BenchmarkE4)"},
		}},
		{"e4-rate.svg", plot.Bars{
			Title: "E4: one-way message rate by path (64-byte messages)", YLabel: "messages/s", Groups: paths,
			Series: []plot.Series{{Name: "msgs/s", Y: rate}},
		}},
	}
}

// e4Median is the median of benchmark name's values in unit, NaN if none.
func e4Median(e4 []GoBench, name, unit string) float64 {
	var xs []float64
	for _, b := range e4 {
		if v, ok := b.Metrics[unit]; ok && b.Name == name {
			xs = append(xs, v)
		}
	}
	if len(xs) == 0 {
		return math.NaN()
	}
	return Median(xs)
}

// e5LossSeries are the loss sweep's lines: rc and auto at each size, one
// color per size.
func e5LossSeries(recs []Record) []plot.Series {
	var sizes []int
	var losses []float64
	for _, r := range recs {
		if r.Suite != "e5loss" || r.Loss == nil {
			continue
		}
		if !slices.Contains(sizes, r.MsgBytes) {
			sizes = append(sizes, r.MsgBytes)
		}
		if !slices.Contains(losses, *r.Loss) {
			losses = append(losses, *r.Loss)
		}
	}
	slices.Sort(sizes)
	slices.Sort(losses)
	var ss []plot.Series
	for k, size := range sizes {
		for _, tr := range []string{"rc", "auto"} {
			s := plot.Series{Name: tr + " " + sizeName(size), Dashed: tr == "auto", Color: palette(k)}
			for _, loss := range losses {
				r := (results{recs}).find("e5loss", func(r *Record) bool {
					return r.Transport == tr && r.MsgBytes == size && r.Loss != nil && *r.Loss == loss
				})
				s.X, s.Y = append(s.X, loss*100), append(s.Y, plotValue(r, msgsPerSec))
			}
			ss = append(ss, s)
		}
	}
	return ss
}

// palette is the k-th of a few colors that tell sizes apart.
func palette(k int) string {
	return []string{"#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd"}[k%5]
}
