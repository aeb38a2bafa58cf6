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
			t.PerRepeat, t.Value = rs, median(rs)
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

func median(xs []float64) float64 {
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
	e1 := func(design string, n int) *Record {
		return rs.find("e1", func(r *Record) bool { return r.Design == design && r.VConns == n })
	}
	ts = append(ts,
		ratio("e1", "engine at 100,000 vconns / engine at 100", 0.8, e1(designEngine, 100000), e1(designEngine, 100), "msgs/s", msgsPerSec, "engine at 100,000", "engine at 100"),
		ratio("e1", "engine / naive at 10,000 vconns", 3, e1(designEngine, 10000), e1(designNaive, 10000), "msgs/s", msgsPerSec, "engine at 10,000", "naive at 10,000"))

	// E2 at the largest count the engine measured, and the ratio at the
	// largest count both designs measured.
	largest := func(design string) *Record {
		var best *Record
		for i := range rs.recs {
			r := &rs.recs[i]
			if r.Suite == "e2" && r.Design == design && r.Error == "" && r.BytesPerVConn != nil && (best == nil || r.VConns > best.VConns) {
				best = r
			}
		}
		return best
	}
	eng := largest(designEngine)
	t := Target{Suite: "e2", Name: "engine bytes per vconn", Goal: 512, AtMost: true}
	if eng == nil {
		t.Missing = "no engine E2 record without error"
	} else {
		t.Name = fmt.Sprintf("engine bytes per vconn at %s vconns", thousands(eng.VConns))
		t.Value = *eng.BytesPerVConn
	}
	ts = append(ts, t)
	var pairN, pairE *Record // the largest count both designs measured
	for i := range rs.recs {
		n := &rs.recs[i]
		if n.Suite != "e2" || n.Design != designNaive || n.Error != "" || n.BytesPerVConn == nil || pairN != nil && n.VConns <= pairN.VConns {
			continue
		}
		if en := rs.find("e2", func(r *Record) bool {
			return r.Design == designEngine && r.VConns == n.VConns && r.Error == "" && r.BytesPerVConn != nil
		}); en != nil {
			pairN, pairE = n, en
		}
	}
	if pairN == nil {
		t = Target{Suite: "e2", Name: "naive / engine bytes per vconn", Goal: 100, Missing: "no count measured for both designs"}
	} else {
		t = ratio("e2", fmt.Sprintf("naive / engine bytes per vconn at %s vconns", thousands(pairN.VConns)), 100, pairN, pairE, "bytes", bytesPerVConn, "naive", "engine")
	}
	ts = append(ts, t)

	e3 := func(mode string, k int) *Record {
		return rs.find("e3", func(r *Record) bool { return r.Mode == mode && r.Producers == k })
	}
	ts = append(ts, ratio("e3", "engine / mutex at 16 producers", 2, e3(modeEngine, 16), e3(modeMutex, 16), "msgs/s", msgsPerSec, "engine at 16", "mutex at 16"))

	for _, size := range e5Sizes(recs) {
		auto := rs.find("e5", func(r *Record) bool { return r.Transport == "auto" && r.MsgBytes == size })
		var best *Record
		var fixed []*Record
		for _, tr := range []string{"rc", "uc", "ud"} {
			r := rs.find("e5", func(r *Record) bool { return r.Transport == tr && r.MsgBytes == size })
			if r == nil || r.Error != "" || r.MsgsPerSec == nil {
				continue
			}
			fixed = append(fixed, r)
			if best == nil || *r.MsgsPerSec > *best.MsgsPerSec {
				best = r
			}
		}
		name := fmt.Sprintf("auto / best fixed at %s", sizeName(size))
		if best != nil {
			name += " (" + best.Transport + ")"
			// Per repeat, auto is compared with the best fixed transport
			// of that repeat.
			b := *best
			b.Samples = bestPerRepeat(fixed)
			best = &b
		}
		ts = append(ts, ratio("e5", name, 0.95, auto, best, "msgs/s", msgsPerSec, "auto", "best fixed transport"))
	}
	for _, r := range recs {
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

// bestPerRepeat is the highest rate of each repeat among rs, or nil unless
// they all have the same repeats.
func bestPerRepeat(rs []*Record) []float64 {
	var out []float64
	for _, r := range rs {
		switch {
		case len(r.Samples) == 0:
			return nil
		case out == nil:
			out = slices.Clone(r.Samples)
		case len(r.Samples) != len(out):
			return nil
		default:
			for i, x := range r.Samples {
				out[i] = max(out[i], x)
			}
		}
	}
	return out
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

// Summarize writes the Markdown summary of a run's records: a table per
// suite and its targets, each marked met or missed.
func Summarize(r io.Reader, w io.Writer) error {
	recs, err := ReadRecords(r)
	if err != nil {
		return err
	}
	var b strings.Builder
	ts := Evaluate(recs)
	wires := map[string]string{}
	for _, r := range recs {
		if r.Wire != "" && wires[r.Suite] == "" {
			wires[r.Suite] = r.Wire
		}
	}
	var on []string
	for _, s := range Suites {
		if w := wires[s]; w != "" {
			on = append(on, s+" on "+w)
		}
	}
	fmt.Fprintf(&b, "## Engine vs naive (`rdmavisor bench`: %s)\n\n", or(strings.Join(on, ", "), "unknown wire"))
	b.WriteString("Every figure comes from the JSON lines of the same run (bench/results/engine.jsonl).\n")
	section := func(suite, title string, table func(*strings.Builder)) {
		fmt.Fprintf(&b, "\n### %s\n\n", title)
		table(&b)
		b.WriteString("\n")
		for _, t := range ts {
			if t.Suite != suite {
				continue
			}
			goal := "≥"
			if t.AtMost {
				goal = "≤"
			}
			if t.Missing != "" {
				fmt.Fprintf(&b, "- %s (target %s %s): **not measured**: %s\n", t.Name, goal, num(t.Goal), t.Missing)
				continue
			}
			per := ""
			if len(t.PerRepeat) > 0 {
				xs := make([]string, len(t.PerRepeat))
				for i, x := range t.PerRepeat {
					xs[i] = num(x)
				}
				per = " (median of the repeats' ratios: " + strings.Join(xs, ", ") + ")"
			}
			fmt.Fprintf(&b, "- %s: %s%s (target %s %s): **%s**\n", t.Name, num(t.Value), per, goal, num(t.Goal), t.Status())
		}
	}
	section("e1", "E1: messages/s vs vconns (64-byte messages)", func(b *strings.Builder) {
		b.WriteString("| vconns | engine msgs/s | engine QPs | engine CPU ns/msg | naive msgs/s | naive QPs | naive CPU ns/msg |\n|---:|---:|---:|---:|---:|---:|---:|\n")
		for _, n := range counts(recs, "e1") {
			row := []string{thousands(n)}
			for _, d := range []string{designEngine, designNaive} {
				r := (results{recs}).find("e1", func(r *Record) bool { return r.Design == d && r.VConns == n })
				row = append(row, cell(r, msgsPerSec), qpsCell(r), cell(r, cpuPerMsg))
			}
			fmt.Fprintf(b, "| %s |\n", strings.Join(row, " | "))
		}
		b.WriteString("\nCPU ns/msg is the process's CPU time (getrusage: both ends, all threads) per message delivered in the median run: it stays flat as vconns grow where the cost per message does not grow with them.\n")
	})
	section("e2", "E2: memory per vconn end (heap + registered)", func(b *strings.Builder) {
		b.WriteString("| vconns | engine bytes | naive bytes |\n|---:|---:|---:|\n")
		for _, n := range counts(recs, "e2") {
			row := []string{thousands(n)}
			for _, d := range []string{designEngine, designNaive} {
				r := (results{recs}).find("e2", func(r *Record) bool { return r.Design == d && r.VConns == n })
				row = append(row, cell(r, bytesPerVConn))
			}
			fmt.Fprintf(b, "| %s |\n", strings.Join(row, " | "))
		}
	})
	section("e3", "E3: producers sharing one QP (64-byte messages)", func(b *strings.Builder) {
		b.WriteString("| producers | mutex msgs/s | engine msgs/s | engine / mutex |\n|---:|---:|---:|---:|\n")
		var ks []int
		for _, r := range recs {
			if r.Suite == "e3" && !slices.Contains(ks, r.Producers) {
				ks = append(ks, r.Producers)
			}
		}
		slices.Sort(ks)
		for _, k := range ks {
			m := (results{recs}).find("e3", func(r *Record) bool { return r.Mode == modeMutex && r.Producers == k })
			e := (results{recs}).find("e3", func(r *Record) bool { return r.Mode == modeEngine && r.Producers == k })
			t := ratio("", "", 0, e, m, "msgs/s", msgsPerSec, "engine", "mutex")
			rt := "—"
			if t.Missing == "" {
				rt = num(t.Value)
			}
			fmt.Fprintf(b, "| %d | %s | %s | %s |\n", k, cell(m, msgsPerSec), cell(e, msgsPerSec), rt)
		}
	})
	section("e5", "E5: msgs/s by transport and message size", func(b *strings.Builder) {
		b.WriteString("| size | rc | uc | ud | auto |\n|---:|---:|---:|---:|---:|\n")
		for _, size := range e5Sizes(recs) {
			row := []string{sizeName(size)}
			for _, tr := range []string{"rc", "uc", "ud", "auto"} {
				r := (results{recs}).find("e5", func(r *Record) bool { return r.Transport == tr && r.MsgBytes == size })
				row = append(row, cell(r, msgsPerSec))
			}
			fmt.Fprintf(b, "| %s |\n", strings.Join(row, " | "))
		}
	})
	section("e5loss", "E5: msgs/s by packet loss (in-memory fabric), Auto against RC, the best reliable fixed transport", func(b *strings.Builder) {
		b.WriteString("UC is not reliable: its column is what it delivered.\n\n")
		b.WriteString("| loss | size | rc | auto | auto / rc | uc (delivered) |\n|---:|---:|---:|---:|---:|---:|\n")
		for _, r := range recs {
			if r.Suite != "e5loss" || r.Transport != "rc" || r.Loss == nil {
				continue
			}
			at := func(tr string) *Record {
				return (results{recs}).find("e5loss", func(x *Record) bool {
					return x.Transport == tr && x.MsgBytes == r.MsgBytes && x.Loss != nil && *x.Loss == *r.Loss
				})
			}
			rc, auto := &r, at("auto")
			t := ratio("", "", 0, auto, rc, "msgs/s", msgsPerSec, "auto", "rc")
			rt := "—"
			if t.Missing == "" {
				rt = num(t.Value)
			}
			fmt.Fprintf(b, "| %g%% | %s | %s | %s | %s | %s |\n", *r.Loss*100, sizeName(r.MsgBytes), cell(rc, msgsPerSec), cell(auto, msgsPerSec), rt, cell(at("uc"), msgsPerSec))
		}
	})
	var errs []string
	for _, r := range recs {
		if r.Error != "" {
			errs = append(errs, fmt.Sprintf("- %s %s: %s", r.Suite, describe(r), r.Error))
		}
	}
	if len(errs) > 0 {
		b.WriteString("\n### Not measured\n\n")
		b.WriteString(strings.Join(errs, "\n"))
		b.WriteString("\n")
	}
	_, err = io.WriteString(w, b.String())
	return err
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
