package bench

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"math"
	"slices"
	"strings"
)

// Target is one performance goal evaluated on a run's records.
type Target struct {
	Suite string
	Name  string
	// Value is the measured ratio or amount; valid when Missing is empty.
	Value float64
	// Goal is the bound Value must reach: at least Goal, or at most Goal
	// when AtMost is set.
	Goal   float64
	AtMost bool
	// Missing says why the target could not be evaluated.
	Missing string
	// PerRepeat are the ratios of the runs measured back to back, one
	// per repeat, when both sides have them; Value is their median.
	PerRepeat []float64
}

// Met reports whether the target was evaluated and reached.
func (t Target) Met() bool {
	if t.Missing != "" {
		return false
	}
	if t.AtMost {
		return t.Value <= t.Goal
	}
	return t.Value >= t.Goal
}

// Status is "met", "missed" or "not measured".
func (t Target) Status() string {
	switch {
	case t.Missing != "":
		return "not measured"
	case t.Met():
		return "met"
	}
	return "missed"
}

// ReadRecords reads JSON lines; blank lines are skipped.
func ReadRecords(r io.Reader) ([]Record, error) {
	var recs []Record
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for line := 1; sc.Scan(); line++ {
		b := sc.Bytes()
		if len(strings.TrimSpace(string(b))) == 0 {
			continue
		}
		var rec Record
		if err := json.Unmarshal(b, &rec); err != nil {
			return nil, fmt.Errorf("bench: line %d: %w", line, err)
		}
		if rec.Suite == "" {
			return nil, fmt.Errorf("bench: line %d: no suite", line)
		}
		recs = append(recs, rec)
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("bench: read records: %w", err)
	}
	return recs, nil
}

// results indexes a run's records.
type results struct{ recs []Record }

// find returns the record of suite matching, or nil.
func (rs results) find(suite string, match func(*Record) bool) *Record {
	for i := range rs.recs {
		r := &rs.recs[i]
		if r.Suite == suite && match(r) {
			return r
		}
	}
	return nil
}

// metric returns a record's value or why there is none.
func metric(r *Record, what string, v func(*Record) *float64) (float64, string) {
	if r == nil {
		return 0, what + ": no record"
	}
	if r.Error != "" {
		return 0, what + ": " + r.Error
	}
	if p := v(r); p != nil {
		return *p, ""
	}
	return 0, what + ": no value"
}

func msgsPerSec(r *Record) *float64    { return r.MsgsPerSec }
func bytesPerVConn(r *Record) *float64 { return r.BytesPerVConn }
func cpuPerMsg(r *Record) *float64     { return r.CPUNsPerMsg }

// ratio is a/b as a Target. When both records have the rates of the same
// repeats (Record.Samples: a run of a and a run of b back to back in each),
// Value is the median of the repeats' ratios, not the ratio of the medians:
// this machine's speed changes by 2x for tens of seconds at a time, and a
// ratio of two runs seconds apart is a ratio at one speed, where medians
// taken apart may come from different speeds.
func ratio(suite, name string, goal float64, a, b *Record, what string, v func(*Record) *float64, whatA, whatB string) Target {
	t := Target{Suite: suite, Name: name, Goal: goal}
	x, missA := metric(a, whatA, v)
	y, missB := metric(b, whatB, v)
	switch {
	case missA != "":
		t.Missing = missA
	case missB != "":
		t.Missing = missB
	case y == 0:
		t.Missing = whatB + ": zero " + what
	default:
		t.Value = x / y
		if rs := perRepeat(a.Samples, b.Samples); rs != nil {
			t.PerRepeat, t.Value = rs, Median(rs)
		}
	}
	return t
}

// perRepeat returns a[i]/b[i] for each repeat, or nil unless both have the
// same two or more.
func perRepeat(a, b []float64) []float64 {
	if len(a) < 2 || len(a) != len(b) || slices.Contains(b, 0) {
		return nil
	}
	rs := make([]float64, len(a))
	for i := range a {
		rs[i] = a[i] / b[i]
	}
	return rs
}

// Median is the median of xs (NaN for none), which it leaves unsorted:
// the one the benchmarks' reports (E6's tools and tests, benchpair) share.
func Median(xs []float64) float64 {
	if len(xs) == 0 {
		return math.NaN()
	}
	s := slices.Sorted(slices.Values(xs))
	n := len(s)
	if n%2 == 1 {
		return s[n/2]
	}
	return (s[n/2-1] + s[n/2]) / 2
}

// Evaluate computes the targets of DESIGN.md §6 as the issue states them.
func Evaluate(recs []Record) []Target {
	rs := results{recs}
	var ts []Target
	ts = append(ts, e1Targets(rs)...)
	ts = append(ts, e2Targets(rs)...)
	e3 := func(mode string, k int) *Record {
		return rs.find("e3", func(r *Record) bool { return r.Mode == mode && r.Producers == k })
	}
	ts = append(ts, ratio("e3", "engine / mutex at 16 producers", 2, e3(modeEngine, 16), e3(modeMutex, 16), "msgs/s", msgsPerSec, "engine at 16", "mutex at 16"))
	ts = append(ts, e5Targets(rs)...)
	return ts
}

// e1Targets: the engine's rate holds from 100 to 100,000 vconns, and beats
// naive's at 10,000, with each NIC model setting measured.
func e1Targets(rs results) []Target {
	var ts []Target
	e1 := func(design string, nic bool, n int) *Record {
		return rs.find("e1", func(r *Record) bool { return r.Design == design && r.NICModel == nic && r.VConns == n })
	}
	for _, nic := range e1Models(rs.recs) {
		sfx := ""
		if nic {
			sfx = " (NIC model)"
		}
		ts = append(ts,
			ratio("e1", "engine at 100,000 vconns / engine at 100"+sfx, 0.8, e1(designEngine, nic, 100000), e1(designEngine, nic, 100), "msgs/s", msgsPerSec, "engine at 100,000", "engine at 100"),
			ratio("e1", "engine / naive at 10,000 vconns"+sfx, 3, e1(designEngine, nic, 10000), e1(designNaive, nic, 10000), "msgs/s", msgsPerSec, "engine at 10,000", "naive at 10,000"))
	}
	return ts
}

// e2Targets: E2 at the largest count the engine measured, and the ratio at
// the largest count both designs measured.
func e2Targets(rs results) []Target {
	t := Target{Suite: "e2", Name: "engine bytes per vconn", Goal: 512, AtMost: true}
	if eng := largestE2(rs, designEngine); eng == nil {
		t.Missing = "no engine E2 record without error"
	} else {
		t.Name = fmt.Sprintf("engine bytes per vconn at %s vconns", thousands(eng.VConns))
		t.Value = *eng.BytesPerVConn
	}
	ts := []Target{t}
	if pairN, pairE := largestE2Pair(rs); pairN == nil {
		t = Target{Suite: "e2", Name: "naive / engine bytes per vconn", Goal: 100, Missing: "no count measured for both designs"}
	} else {
		t = ratio("e2", fmt.Sprintf("naive / engine bytes per vconn at %s vconns", thousands(pairN.VConns)), 100, pairN, pairE, "bytes", bytesPerVConn, "naive", "engine")
	}
	return append(ts, t)
}

// measuredE2 reports whether r is an E2 record of design with a size.
func measuredE2(r *Record, design string) bool {
	return r.Suite == "e2" && r.Design == design && r.Error == "" && r.BytesPerVConn != nil
}

// largestE2 is design's E2 record at the largest count it measured.
func largestE2(rs results, design string) *Record {
	var best *Record
	for i := range rs.recs {
		r := &rs.recs[i]
		if measuredE2(r, design) && (best == nil || r.VConns > best.VConns) {
			best = r
		}
	}
	return best
}

// largestE2Pair are naive's and the engine's E2 records at the largest
// count both designs measured.
func largestE2Pair(rs results) (pairN, pairE *Record) {
	for i := range rs.recs {
		n := &rs.recs[i]
		if !measuredE2(n, designNaive) || pairN != nil && n.VConns <= pairN.VConns {
			continue
		}
		if en := rs.find("e2", func(r *Record) bool {
			return r.Design == designEngine && r.VConns == n.VConns && r.Error == "" && r.BytesPerVConn != nil
		}); en != nil {
			pairN, pairE = n, en
		}
	}
	return pairN, pairE
}

// e5Targets: E5 as restated for a 2-core machine: Auto against RC, the one
// fixed transport that is reliable as Auto is, at every size and loss, and
// against unreliable UC at 4 KiB, where UC is cheapest.
func e5Targets(rs results) []Target {
	var ts []Target
	e5 := func(tr string, size int) *Record {
		return rs.find("e5", func(r *Record) bool { return r.Transport == tr && r.MsgBytes == size })
	}
	for _, size := range e5Sizes(rs.recs) {
		ts = append(ts, ratio("e5", fmt.Sprintf("auto / rc at %s", sizeName(size)), 0.95, e5("auto", size), e5("rc", size), "msgs/s", msgsPerSec, "auto", "rc"))
		if size == 4<<10 {
			ts = append(ts, ratio("e5", "auto / uc at 4 KiB", 0.85, e5("auto", size), e5("uc", size), "msgs/s", msgsPerSec, "auto", "uc"))
		}
	}
	for _, r := range rs.recs {
		if r.Suite != "e5loss" || r.Transport != "rc" || r.Loss == nil {
			continue
		}
		auto := rs.find("e5loss", func(x *Record) bool {
			return x.Transport == "auto" && x.MsgBytes == r.MsgBytes && x.Loss != nil && *x.Loss == *r.Loss
		})
		name := fmt.Sprintf("auto / rc at %s, %g%% loss", sizeName(r.MsgBytes), *r.Loss*100)
		ts = append(ts, ratio("e5loss", name, 0.95, auto, &r, "msgs/s", msgsPerSec, "auto", "rc"))
	}
	return ts
}

// e1Models are the NIC model settings E1 records carry: off first.
func e1Models(recs []Record) []bool {
	var off, on bool
	for _, r := range recs {
		if r.Suite == "e1" {
			off = off || !r.NICModel
			on = on || r.NICModel
		}
	}
	var ms []bool
	if off || !on {
		ms = append(ms, false)
	}
	if on {
		ms = append(ms, true)
	}
	return ms
}

// kneeFall is how far below its best at fewer connections a design's rate
// must fall for Knee to call it the knee.
const kneeFall = 0.8

// Knee finds where a design's E1 rate bends down for good: the first count
// from which every rate, there and above, is below kneeFall of the best
// rate at fewer connections (one slow measurement on a shared machine is
// not a knee). It returns that count and the one measured before it (0, 0
// if there is none), and the ratio at the knee.
func Knee(recs []Record, design string, nic bool) (before, at int, fall float64) {
	var ns []int
	var vs []float64
	for _, n := range counts(recs, "e1") {
		r := (results{recs}).find("e1", func(r *Record) bool { return r.Design == design && r.NICModel == nic && r.VConns == n })
		if r == nil || r.Error != "" || r.MsgsPerSec == nil {
			continue
		}
		ns, vs = append(ns, n), append(vs, *r.MsgsPerSec)
	}
	for i := 1; i < len(vs); i++ {
		best := slices.Max(vs[:i])
		if slices.Max(vs[i:]) < kneeFall*best {
			return ns[i-1], ns[i], vs[i] / best
		}
	}
	return 0, 0, 0
}

func e5Sizes(recs []Record) []int {
	var sizes []int
	for _, r := range recs {
		if r.Suite == "e5" && !slices.Contains(sizes, r.MsgBytes) {
			sizes = append(sizes, r.MsgBytes)
		}
	}
	slices.Sort(sizes)
	return sizes
}

// countRuns is how many runs concatenated records hold: the most records
// of one measurement.
func countRuns(recs []Record) int {
	n := map[recordKey]int{}
	most := 0
	for i := range recs {
		k := keyOf(&recs[i])
		n[k]++
		most = max(most, n[k])
	}
	return most
}

func counts(recs []Record, suite string) []int {
	var ns []int
	for _, r := range recs {
		if r.Suite == suite && !slices.Contains(ns, r.VConns) {
			ns = append(ns, r.VConns)
		}
	}
	slices.Sort(ns)
	return ns
}

func describe(r Record) string {
	var parts []string
	for _, s := range []string{r.Design, r.Mode, r.Transport} {
		if s != "" {
			parts = append(parts, s)
		}
	}
	if r.VConns > 0 {
		parts = append(parts, thousands(r.VConns)+" vconns")
	}
	if r.NICModel {
		parts = append(parts, "NIC model")
	}
	if r.Producers > 0 {
		parts = append(parts, fmt.Sprintf("%d producers", r.Producers))
	}
	if r.MsgBytes > 0 && r.Suite == "e5" {
		parts = append(parts, sizeName(r.MsgBytes))
	}
	return strings.Join(parts, ", ")
}

func cell(r *Record, v func(*Record) *float64) string {
	switch {
	case r == nil:
		return ""
	case r.Error != "":
		return "not run"
	case v(r) == nil:
		return ""
	}
	return num(*v(r))
}

func qpsCell(r *Record) string {
	if r == nil || r.Error != "" || r.QPs == 0 {
		return ""
	}
	return thousands(r.QPs)
}

// num prints a value with three significant digits, in thousands
// separators when large.
func num(v float64) string {
	switch a := math.Abs(v); {
	case a >= 1000:
		return thousands(int(math.Round(v)))
	case a >= 100:
		return fmt.Sprintf("%.0f", v)
	case a >= 10:
		return fmt.Sprintf("%.1f", v)
	}
	return fmt.Sprintf("%.2f", v)
}

func thousands(n int) string {
	s := fmt.Sprint(n)
	neg := strings.HasPrefix(s, "-")
	s = strings.TrimPrefix(s, "-")
	var out []string
	for len(s) > 3 {
		out = append([]string{s[len(s)-3:]}, out...)
		s = s[:len(s)-3]
	}
	out = append([]string{s}, out...)
	r := strings.Join(out, ",")
	if neg {
		r = "-" + r
	}
	return r
}

func sizeName(n int) string {
	switch {
	case n >= 1<<20 && n%(1<<20) == 0:
		return fmt.Sprintf("%d MiB", n>>20)
	case n >= 1<<10 && n%(1<<10) == 0:
		return fmt.Sprintf("%d KiB", n>>10)
	}
	return fmt.Sprintf("%d B", n)
}

func or(s, d string) string {
	if s == "" {
		return d
	}
	return s
}
