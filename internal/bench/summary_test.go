package bench

import (
	"bytes"
	"fmt"
	"math"
	"slices"
	"strings"
	"testing"
)

// sampleRun is a small run with every target decidable: E1 and E3 met,
// the E2 amount missed and its ratio met, E5 met at one size and missed at
// the other, and some error lines.
const sampleRun = `{"suite":"e1","design":"engine","vconns":100,"qps":8,"msg_bytes":64,"msgs_per_sec":400000,"wire":"fabric"}
{"suite":"e1","design":"engine","vconns":10000,"qps":8,"msg_bytes":64,"msgs_per_sec":360000,"cpu_ns_per_msg":2100,"wire":"fabric"}
{"suite":"e1","design":"engine","vconns":100000,"qps":8,"msg_bytes":64,"msgs_per_sec":340000,"wire":"fabric"}
{"suite":"e1","design":"naive","vconns":100,"qps":100,"msg_bytes":64,"msgs_per_sec":500000,"wire":"fabric"}
{"suite":"e1","design":"naive","vconns":10000,"qps":10000,"msg_bytes":64,"msgs_per_sec":100000,"cpu_ns_per_msg":15400,"wire":"fabric"}
{"suite":"e1","design":"naive","vconns":100000,"msg_bytes":64,"wire":"fabric","error":"not run: over budget"}

{"suite":"e2","design":"engine","vconns":1000,"bytes_per_vconn":900,"wire":"fabric"}
{"suite":"e2","design":"engine","vconns":10000,"bytes_per_vconn":600,"wire":"fabric"}
{"suite":"e2","design":"engine","vconns":100000,"bytes_per_vconn":520,"wire":"fabric"}
{"suite":"e2","design":"naive","vconns":1000,"bytes_per_vconn":500000,"wire":"fabric"}
{"suite":"e2","design":"naive","vconns":10000,"bytes_per_vconn":480000,"wire":"fabric"}
{"suite":"e2","design":"naive","vconns":100000,"wire":"fabric","error":"not run: too many descriptors"}
{"suite":"e3","mode":"mutex","producers":16,"msgs_per_sec":100000,"wire":"fabric"}
{"suite":"e3","mode":"engine","producers":16,"msgs_per_sec":250000,"wire":"fabric"}
{"suite":"e5","transport":"rc","msg_bytes":16,"msgs_per_sec":1000,"wire":"fabric"}
{"suite":"e5","transport":"uc","msg_bytes":16,"msgs_per_sec":1100,"wire":"fabric"}
{"suite":"e5","transport":"ud","msg_bytes":16,"msgs_per_sec":2000,"wire":"fabric"}
{"suite":"e5","transport":"auto","msg_bytes":16,"msgs_per_sec":1950,"wire":"fabric"}
{"suite":"e5","transport":"rc","msg_bytes":65536,"msgs_per_sec":500,"wire":"fabric"}
{"suite":"e5","transport":"uc","msg_bytes":65536,"wire":"fabric","error":"too large"}
{"suite":"e5","transport":"ud","msg_bytes":65536,"wire":"fabric","error":"UD carries at most 4072 bytes"}
{"suite":"e5","transport":"auto","msg_bytes":65536,"msgs_per_sec":400,"wire":"fabric"}
`

func TestEvaluate(t *testing.T) {
	recs, err := ReadRecords(strings.NewReader(sampleRun))
	if err != nil {
		t.Fatal(err)
	}
	want := []struct {
		name   string
		value  float64
		status string
	}{
		{"engine at 100,000 vconns / engine at 100", 0.85, "met"},
		{"engine / naive at 10,000 vconns", 3.6, "met"},
		{"engine bytes per vconn at 100,000 vconns", 520, "missed"},
		{"naive / engine bytes per vconn at 10,000 vconns", 800, "met"},
		{"engine / mutex at 16 producers", 2.5, "met"},
		{"auto / rc at 16 B", 1.95, "met"},
		{"auto / rc at 64 KiB", 0.8, "missed"},
	}
	got := Evaluate(recs)
	if len(got) != len(want) {
		t.Fatalf("got %d targets, want %d: %+v", len(got), len(want), got)
	}
	for i, w := range want {
		g := got[i]
		if g.Name != w.name || g.Status() != w.status || g.Missing != "" || g.Value < w.value-1e-9 || g.Value > w.value+1e-9 {
			t.Errorf("target %d: got %q = %v (%s, missing %q), want %q = %v (%s)", i, g.Name, g.Value, g.Status(), g.Missing, w.name, w.value, w.status)
		}
	}
}

// TestEvaluatePerRepeat: with the rates of each repeat, a ratio is the
// median of the repeats' ratios, so a repeat in which the machine slowed down between the
// two runs does not decide it; without them, the ratio of the medians.
func TestEvaluatePerRepeat(t *testing.T) {
	recs, err := ReadRecords(strings.NewReader(`{"suite":"e1","design":"engine","vconns":100,"msgs_per_sec":200,"samples":[400,200,100]}
{"suite":"e1","design":"engine","vconns":100000,"msgs_per_sec":180,"samples":[360,90,180]}
{"suite":"e5","transport":"rc","msg_bytes":16,"msgs_per_sec":100,"samples":[100,100,50]}
{"suite":"e5","transport":"uc","msg_bytes":16,"msgs_per_sec":200,"samples":[300,200,100]}
{"suite":"e5","transport":"ud","msg_bytes":16,"error":"down"}
{"suite":"e5","transport":"auto","msg_bytes":16,"msgs_per_sec":180,"samples":[360,180,120]}
{"suite":"e5","transport":"rc","msg_bytes":64,"msgs_per_sec":100,"samples":[100,100]}
{"suite":"e5","transport":"uc","msg_bytes":64,"msgs_per_sec":100}
{"suite":"e5","transport":"auto","msg_bytes":64,"msgs_per_sec":90,"samples":[80,100]}
`))
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]struct {
		value float64
		per   []float64
	}{
		// 0.9, 0.45, 1.8: the medians' ratio is 0.9 too, by chance.
		"engine at 100,000 vconns / engine at 100": {0.9, []float64{0.9, 0.45, 1.8}},
		"auto / rc at 16 B":                        {2.4, []float64{3.6, 1.8, 2.4}},
		"auto / rc at 64 B":                        {0.9, []float64{0.8, 1}},
	}
	for _, g := range Evaluate(recs) {
		w, ok := want[g.Name]
		if !ok {
			continue
		}
		delete(want, g.Name)
		if g.Missing != "" || math.Abs(g.Value-w.value) > 1e-9 || len(g.PerRepeat) != len(w.per) {
			t.Errorf("%s: got %v per repeat %v (missing %q), want %v per repeat %v", g.Name, g.Value, g.PerRepeat, g.Missing, w.value, w.per)
			continue
		}
		for i := range w.per {
			if math.Abs(g.PerRepeat[i]-w.per[i]) > 1e-9 {
				t.Errorf("%s: per repeat %v, want %v", g.Name, g.PerRepeat, w.per)
			}
		}
	}
	for name := range want {
		t.Errorf("no target %q", name)
	}
	var out bytes.Buffer
	if err := Summarize(strings.NewReader(`{"suite":"e3","mode":"mutex","producers":16,"msgs_per_sec":100,"samples":[100,50,100]}
{"suite":"e3","mode":"engine","producers":16,"msgs_per_sec":250,"samples":[250,200,300]}
`), &out); err != nil {
		t.Fatal(err)
	}
	if want := "- engine / mutex at 16 producers: 3.00 (median of the repeats' ratios: 2.50, 4.00, 3.00) (target ≥ 2.00): **met**"; !strings.Contains(out.String(), want) {
		t.Errorf("summary lacks %q:\n%s", want, out.String())
	}
}

func TestEvaluateMissing(t *testing.T) {
	recs, err := ReadRecords(strings.NewReader(`{"suite":"e1","design":"engine","vconns":10000,"msgs_per_sec":5}
{"suite":"e1","design":"naive","vconns":10000,"error":"not run: out of descriptors"}
`))
	if err != nil {
		t.Fatal(err)
	}
	ts := Evaluate(recs)
	if len(ts) != 5 { // E1 ×2, E2 ×2, E3; no E5 sizes
		t.Fatalf("got %d targets: %+v", len(ts), ts)
	}
	for _, tg := range ts {
		if tg.Status() != "not measured" || tg.Missing == "" {
			t.Errorf("%s: %s (%q), want not measured", tg.Name, tg.Status(), tg.Missing)
		}
	}
	if !strings.Contains(ts[1].Missing, "out of descriptors") {
		t.Errorf("engine/naive at 10,000: missing %q, want the naive line's error", ts[1].Missing)
	}
}

func TestSummarize(t *testing.T) {
	var out bytes.Buffer
	if err := Summarize(strings.NewReader(sampleRun), &out); err != nil {
		t.Fatal(err)
	}
	s := out.String()
	for _, want := range []string{
		"### E1: messages/s vs vconns",
		"| 10,000 | 360,000 | 0.90 | 8 | 2,100 | 100,000 | 10,000 | 15,400 | 3.60 |",
		"| 100,000 | 340,000 | 0.85 | 8 |  | not run |  | not run | — |",
		"Naive's knee with the model off: between 100 and 10,000 connections (at 10,000 its rate is 0.20 of its best",
		"- engine at 100,000 vconns / engine at 100: 0.85 (target ≥ 0.80): **met**",
		"- engine / naive at 10,000 vconns: 3.60 (target ≥ 3.00): **met**",
		"- engine bytes per vconn at 100,000 vconns: 520 (target ≤ 512): **missed**",
		"- naive / engine bytes per vconn at 10,000 vconns: 800 (target ≥ 100): **met**",
		"| 16 | 100,000 | 250,000 | 2.50 |",
		"- auto / rc at 64 KiB: 0.80 (target ≥ 0.95): **missed**",
		"| 64 KiB | 500 | not run | not run | 400 |",
		"- e2 naive, 100,000 vconns: not run: too many descriptors",
	} {
		if !strings.Contains(s, want) {
			t.Errorf("summary lacks %q", want)
		}
	}
	if t.Failed() {
		t.Log(s)
	}
}

func TestReadRecordsRejectsGarbage(t *testing.T) {
	for _, in := range []string{"not json\n", `{"design":"engine"}` + "\n"} {
		if _, err := ReadRecords(strings.NewReader(in)); err == nil {
			t.Errorf("%q: no error", in)
		}
	}
}

func TestParseBytes(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want int64
		ok   bool
	}{
		{"2GiB", 2 << 30, true}, {"2 GiB", 2 << 30, true}, {"512MiB", 512 << 20, true}, {"1.5G", 3 << 29, true},
		{"1048576", 1 << 20, true}, {"10B", 10, true}, {"x", 0, false}, {"2x", 0, false}, {"-1", 0, false}, {"", 0, false},
	} {
		got, err := ParseBytes(tc.in)
		if (err == nil) != tc.ok || got != tc.want {
			t.Errorf("ParseBytes(%q) = %d, %v; want %d, ok %v", tc.in, got, err, tc.want, tc.ok)
		}
	}
}

func TestWriteText(t *testing.T) {
	var b bytes.Buffer
	r := Record{Suite: "e1", Design: "engine", VConns: 10, QPs: 8, MsgBytes: 64, MsgsPerSec: ptr(1234.0), Wire: "fabric"}
	if err := writeText(&b, r); err != nil {
		t.Fatal(err)
	}
	if got, want := b.String(), "e1 design=engine vconns=10 qps=8 msg_bytes=64 msgs_per_sec=1234\n"; got != want {
		t.Errorf("got %q, want %q", got, want)
	}
	b.Reset()
	if err := writeText(&b, errLine(Record{Suite: "e5", Transport: "ud", MsgBytes: 1 << 20}, errOverBudget)); err != nil {
		t.Fatal(err)
	}
	if got, want := b.String(), "e5 transport=ud msg_bytes=1048576 error=\"not run\"\n"; got != want {
		t.Errorf("got %q, want %q", got, want)
	}
}

// TestSummarizeNICModel: E1 with the model off and on gives a table and a
// knee for each, and the E1 targets for each.
func TestSummarizeNICModel(t *testing.T) {
	var in strings.Builder
	for _, nic := range []bool{false, true} {
		for i, n := range []int{100, 400, 1000} {
			naive := []float64{500, 450, 300}[i]
			if nic {
				naive = []float64{400, 100, 50}[i]
			}
			fmt.Fprintf(&in, `{"suite":"e1","design":"engine","vconns":%d,"nic_model":%v,"msgs_per_sec":1000}`+"\n", n, nic)
			fmt.Fprintf(&in, `{"suite":"e1","design":"naive","vconns":%d,"nic_model":%v,"msgs_per_sec":%v}`+"\n", n, nic, naive)
		}
	}
	recs, err := ReadRecords(strings.NewReader(in.String()))
	if err != nil {
		t.Fatal(err)
	}
	if b, a, f := Knee(recs, designNaive, false); b != 400 || a != 1000 || math.Abs(f-0.6) > 1e-9 {
		t.Errorf("knee off: %d, %d, %v; want 400, 1000, 0.6", b, a, f)
	}
	if b, a, f := Knee(recs, designNaive, true); b != 100 || a != 400 || math.Abs(f-0.25) > 1e-9 {
		t.Errorf("knee on: %d, %d, %v; want 100, 400, 0.25", b, a, f)
	}
	if b, a, _ := Knee(recs, designEngine, true); b != 0 || a != 0 {
		t.Errorf("engine knee: %d, %d; want none", b, a)
	}
	var names []string
	for _, tg := range Evaluate(recs) {
		if tg.Suite == "e1" {
			names = append(names, tg.Name)
		}
	}
	if want := "engine / naive at 10,000 vconns (NIC model)"; !slices.Contains(names, want) {
		t.Errorf("targets %q lack %q", names, want)
	}
	var out bytes.Buffer
	if err := Summarize(strings.NewReader(in.String()), &out); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{
		"Without the NIC model",
		"With the soft provider's NIC model",
		"| 400 | 1,000 | 1.00 |  |  | 100 |  |  | 10.0 |",
		"Naive's knee with the model off: between 400 and 1,000 connections",
		"Naive's knee with the model on: between 100 and 400 connections",
	} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("summary lacks %q:\n%s", want, out.String())
		}
	}
}

// TestKneeIgnoresADip: one slow count that the next ones recover from is
// not the knee.
func TestKneeIgnoresADip(t *testing.T) {
	recs, err := ReadRecords(strings.NewReader(`{"suite":"e1","design":"naive","vconns":100,"msgs_per_sec":500}
{"suite":"e1","design":"naive","vconns":200,"msgs_per_sec":300}
{"suite":"e1","design":"naive","vconns":400,"msgs_per_sec":480}
{"suite":"e1","design":"naive","vconns":1000,"msgs_per_sec":100}
`))
	if err != nil {
		t.Fatal(err)
	}
	if b, a, f := Knee(recs, designNaive, false); b != 400 || a != 1000 || math.Abs(f-0.2) > 1e-9 {
		t.Errorf("knee: %d, %d, %v; want 400, 1000, 0.2", b, a, f)
	}
}
