// Package bench measures the engine against the naive baseline (package
// naive) on the software provider, in one process and one run, and turns
// the results into the ratios the performance goals are stated in
// (DESIGN.md §6).
//
// Each suite prints one Record per measurement, as a JSON object per line:
//
//	e1  throughput vs connections: engine and naive, 1 … 100,000 vconns
//	e2  memory per vconn: engine and naive
//	e3  posting: K producers on one shared QP, through a mutex or the engine
//	e5  transport: rc, uc, ud and auto by message size
//
// A measurement that cannot run (over the memory budget, out of file
// descriptors, a transport the engine refuses) is a Record with Error set,
// never a crash. Summarize reads the lines back and writes the ratios.
//
// Every measurement builds its own pair of soft devices, joined by the
// in-memory fabric or UDP on loopback, and tears them down after, so runs
// do not share state.
package bench

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/go-logr/logr"
)

// Suites are the suite names, in the order "all" runs them.
var Suites = []string{"e1", "e2", "e3", "e5"}

// Record is one output line: the union of every suite's fields. Optional
// measurements are pointers, so a line with Error carries none of them.
type Record struct {
	Suite     string `json:"suite"`
	Design    string `json:"design,omitempty"`    // e1, e2: engine or naive
	Mode      string `json:"mode,omitempty"`      // e3: mutex or engine
	Transport string `json:"transport,omitempty"` // e5: rc, uc, ud or auto
	VConns    int    `json:"vconns,omitempty"`    // connections (pairs of ends)
	// QPs are the queue pairs on one of the two devices: the engine's
	// own and its peer's toward it, or one per naive connection.
	QPs       int `json:"qps,omitempty"`
	Producers int `json:"producers,omitempty"`
	MsgBytes  int `json:"msg_bytes,omitempty"`

	// NICModel says the devices modelled a NIC's QP-context cache and
	// receive ring (soft.NICModel); E1 only.
	NICModel bool `json:"nic_model,omitempty"`

	// Pollers is E1's polling goroutines per endpoint, either design.
	Pollers int `json:"pollers,omitempty"`

	// MsgsPerSec (and MBPerSec) are the median of Samples, the rates of
	// Plan.Repeats runs, which alternate with the runs of the lines they
	// are compared with so that a change in the machine's load hits both.
	MsgsPerSec *float64 `json:"msgs_per_sec,omitempty"`
	// CPUNsPerMsg is the CPU time the whole process (both ends) spent per
	// message in the run MsgsPerSec comes from (getrusage).
	CPUNsPerMsg *float64  `json:"cpu_ns_per_msg,omitempty"`
	MBPerSec    *float64  `json:"mb_per_sec,omitempty"`
	Samples     []float64 `json:"samples,omitempty"`
	// E2, per vconn end: growth of both ends divided by 2×VConns.
	// BytesPerVConn is HeapBytes + MappedBytes: live Go heap plus memory
	// mapped outside it (registered regions, which hardware pins);
	// RSSBytes is what this machine actually made resident.
	BytesPerVConn       *float64 `json:"bytes_per_vconn,omitempty"`
	HeapBytesPerVConn   *float64 `json:"heap_bytes_per_vconn,omitempty"`
	MappedBytesPerVConn *float64 `json:"mapped_bytes_per_vconn,omitempty"`
	RSSBytesPerVConn    *float64 `json:"rss_bytes_per_vconn,omitempty"`
	Per                 string   `json:"per,omitempty"`
	// FixedBytes is what both endpoints cost before any connection (heap
	// plus mapped): the engine's buffer pool and SRQ, for instance.
	FixedBytes *int64 `json:"fixed_bytes,omitempty"`

	Seconds      float64 `json:"seconds,omitempty"`       // measured window
	SetupSeconds float64 `json:"setup_seconds,omitempty"` // opening the connections
	Wire         string  `json:"wire,omitempty"`
	Error        string  `json:"error,omitempty"`
}

// Plan sizes the suites.
type Plan struct {
	Warmup, Measure time.Duration
	// Repeats is how many times each throughput is measured (default 1).
	Repeats int
	// Producers is the number of goroutines E1 sends from, round-robin
	// over the connections.
	Producers int
	MsgBytes  int // E1 and E3 message size
	E1VConns  []int
	// E1NICModels are the settings of the soft NIC model E1 runs every
	// count with (empty: off only).
	E1NICModels []bool

	// Pollers is the number of polling goroutines, each with its CQ, of
	// every E1 endpoint, the engine's and the naive one's (default 1).
	Pollers int

	// E2EngineVConns and E2NaiveVConns are the connection counts E2
	// opens for each design.
	E2EngineVConns, E2NaiveVConns []int
	E3Producers                   []int
	E5Sizes                       []int
	// Timeout bounds one measurement, setup and teardown included.
	Timeout time.Duration
}

// FullPlan is what `make bench` runs.
func FullPlan() Plan {
	return Plan{
		Warmup: 500 * time.Millisecond, Measure: 1500 * time.Millisecond, Repeats: 3,
		Producers: 2, MsgBytes: 64,
		E1VConns:       []int{1, 50, 100, 200, 400, 600, 800, 1000, 2000, 10000, 100000},
		E1NICModels:    []bool{false, true},
		E2EngineVConns: []int{1000, 10000, 100000},
		E2NaiveVConns:  []int{1000, 10000, 100000},
		E3Producers:    []int{1, 4, 16, 64},
		E5Sizes:        []int{16, 64, 256, 1 << 10, 4 << 10, 16 << 10, 64 << 10, 256 << 10, 1 << 20},
		Timeout:        3 * time.Minute,
	}
}

// QuickPlan keeps every count and size of the full plan that decides a
// target (E1 up to 100,000 vconns, E2 up to 100,000, E3 up to 64
// producers) but measures once for 0.4 s after 0.2 s of warm-up instead of
// three times for 1.5 s after 0.5 s, and runs E5 at every other size (16 B,
// 256 B, 4 KiB, 64 KiB, 1 MiB).
func QuickPlan() Plan {
	p := FullPlan()
	p.Warmup, p.Measure, p.Repeats = 200*time.Millisecond, 400*time.Millisecond, 1
	p.E5Sizes = []int{16, 256, 4 << 10, 64 << 10, 1 << 20}
	p.Timeout = time.Minute
	return p
}

// Options configure Run.
type Options struct {
	Suites []string // of Suites; empty: all
	Plan   Plan
	// Budget bounds the memory a measurement may make resident,
	// estimated from the per-connection growth measured at a smaller
	// count (default 2 GiB).
	Budget int64
	// Wire is "fabric" or "udp" for every suite; empty takes each
	// suite's own: UDP for E3, whose point is batching doorbells (on UDP
	// a post costs a system call, as a doorbell costs an MMIO write on a
	// NIC; on the in-memory fabric it is a function call and batching
	// cannot show), the fabric for the others.
	Wire   string
	Format string // "json" (default) or "text"
	Out    io.Writer
	// JSONCopy, if set, gets every record as a JSON line too, whatever
	// the format.
	JSONCopy io.Writer
	Log      logr.Logger
}

// DefaultBudget is Options.Budget's default.
const DefaultBudget = 2 << 30

// env is what every suite gets.
type env struct {
	Options
	emit func(Record) error
}

// wireFor is the wire a suite runs on.
func (e *env) wireFor(suite string) string {
	switch {
	case e.Wire != "":
		return e.Wire
	case suite == "e3":
		return "udp"
	}
	return "fabric"
}

// Run runs the suites and writes their records to o.Out.
func Run(ctx context.Context, o Options) error {
	if len(o.Suites) == 0 {
		o.Suites = Suites
	}
	for _, s := range o.Suites {
		if !slices.Contains(Suites, s) {
			return fmt.Errorf("bench: unknown suite %q: want one of %s or all", s, strings.Join(Suites, ", "))
		}
	}
	if o.Budget == 0 {
		o.Budget = DefaultBudget
	}
	switch o.Wire {
	case "", "fabric", "udp":
	default:
		return fmt.Errorf("bench: unknown wire %q: want fabric or udp", o.Wire)
	}
	var enc func(Record) error
	switch o.Format {
	case "", "json":
		je := json.NewEncoder(o.Out)
		enc = func(r Record) error { return je.Encode(r) }
	case "text":
		enc = func(r Record) error { return writeText(o.Out, r) }
	default:
		return fmt.Errorf("bench: unknown format %q: want json or text", o.Format)
	}
	if o.Plan.Measure == 0 {
		o.Plan = FullPlan()
	}
	if o.Plan.Timeout == 0 {
		o.Plan.Timeout = time.Minute
	}
	o.Plan.Repeats = max(1, o.Plan.Repeats)
	o.Plan.Pollers = max(1, o.Plan.Pollers)
	if o.Plan.Pollers > 64 {
		return fmt.Errorf("bench: %d pollers: at most 64", o.Plan.Pollers)
	}
	if lim, err := raiseFileLimit(); err != nil {
		o.Log.Info("Could not raise the file descriptor limit", "limit", lim, "err", err)
	} else {
		o.Log.V(1).Info("File descriptor limit", "limit", lim)
	}
	e := &env{Options: o}
	var cp *json.Encoder
	if o.JSONCopy != nil {
		cp = json.NewEncoder(o.JSONCopy)
	}
	e.emit = func(r Record) error {
		r.Wire = e.wireFor(r.Suite)
		if cp != nil {
			if err := cp.Encode(r); err != nil {
				return err
			}
		}
		return enc(r)
	}
	suites := map[string]func(context.Context, *env) error{"e1": runE1, "e2": runE2, "e3": runE3, "e5": runE5}
	for _, s := range Suites {
		if !slices.Contains(o.Suites, s) {
			continue
		}
		start := time.Now()
		o.Log.Info("Running suite", "suite", s)
		if err := suites[s](ctx, e); err != nil {
			return fmt.Errorf("bench: suite %s: %w", s, err)
		}
		o.Log.Info("Suite done", "suite", s, "seconds", time.Since(start).Seconds())
		if err := ctx.Err(); err != nil {
			return err
		}
	}
	return nil
}

// series collects the repeated measurements of one line.
type series struct {
	rec   Record
	rates []rate
	err   error // the first failure: the line reports it
}

func (s *series) add(r rate, err error) {
	if s.err != nil {
		return
	}
	if err != nil {
		s.err = err
		return
	}
	s.rates = append(s.rates, r)
}

// record is the line: the median rate, or the error.
func (s *series) record(withMB bool) Record {
	r := s.rec
	if s.err != nil {
		return errLine(r, s.err)
	}
	if len(s.rates) == 0 {
		return r
	}
	sorted := slices.Clone(s.rates)
	slices.SortFunc(sorted, func(a, b rate) int { return cmp.Compare(a.msgsPerSec, b.msgsPerSec) })
	med := sorted[len(sorted)/2]
	r.MsgsPerSec = ptr(round(med.msgsPerSec, 0))
	if med.cpuNsPerMsg > 0 {
		r.CPUNsPerMsg = ptr(round(med.cpuNsPerMsg, 0))
	}
	if withMB {
		r.MBPerSec = ptr(round(med.bytesPerSec/1e6, 1))
	}
	r.Seconds = round(med.seconds, 3)
	if len(s.rates) > 1 {
		for _, x := range s.rates {
			r.Samples = append(r.Samples, round(x.msgsPerSec, 0))
		}
	}
	return r
}

// errLine makes a Record an error line. A joined error of many lines (a
// teardown's every failure) keeps its first few and counts the rest.
func errLine(r Record, err error) Record {
	r.Error = err.Error()
	if lines := strings.Split(r.Error, "\n"); len(lines) > maxErrLines {
		r.Error = fmt.Sprintf("%s (and %d more lines)", strings.Join(lines[:maxErrLines], "; "), len(lines)-maxErrLines)
	}
	return r
}

// maxErrLines is how many lines of an error a Record keeps.
const maxErrLines = 3

func ptr[T any](v T) *T { return &v }

// round keeps d decimals.
func round(v float64, d int) float64 {
	p := math.Pow(10, float64(d))
	return math.Round(v*p) / p
}

// writeText writes r as `suite key=value ...` on one line, in the JSON
// field order.
func writeText(w io.Writer, r Record) error {
	b, err := json.Marshal(r)
	if err != nil {
		return err
	}
	dec := json.NewDecoder(strings.NewReader(string(b)))
	dec.UseNumber()
	var sb strings.Builder
	sb.WriteString(r.Suite)
	if _, err := dec.Token(); err != nil { // {
		return err
	}
	for dec.More() {
		k, err := dec.Token()
		if err != nil {
			return err
		}
		v, err := dec.Token()
		if err != nil {
			return err
		}
		if k == "suite" || k == "wire" {
			continue
		}
		if s, ok := v.(string); ok && strings.ContainsAny(s, " \t") {
			v = fmt.Sprintf("%q", s)
		}
		fmt.Fprintf(&sb, " %s=%v", k, v)
	}
	sb.WriteByte('\n')
	_, err = io.WriteString(w, sb.String())
	return err
}

// ParseBytes reads a byte count: a number with an optional B, KiB, MiB,
// GiB or TiB suffix (or K, M, G, T, same powers of 1024).
func ParseBytes(s string) (int64, error) {
	s = strings.TrimSpace(s)
	units := []struct {
		suffix string
		mult   float64
	}{{"TiB", 1 << 40}, {"GiB", 1 << 30}, {"MiB", 1 << 20}, {"KiB", 1 << 10}, {"T", 1 << 40}, {"G", 1 << 30}, {"M", 1 << 20}, {"K", 1 << 10}, {"B", 1}}
	mult := 1.0
	for _, u := range units {
		if rest, ok := strings.CutSuffix(s, u.suffix); ok {
			s, mult = strings.TrimSpace(rest), u.mult
			break
		}
	}
	v, err := strconv.ParseFloat(s, 64)
	if err != nil || v < 0 || math.IsInf(v, 0) || math.IsNaN(v) {
		return 0, fmt.Errorf("bench: bad byte count %q", s)
	}
	n := v * mult
	if n > math.MaxInt64/2 {
		return 0, errors.New("bench: byte count too large")
	}
	return int64(n), nil
}
