package bench

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/go-logr/logr/testr"
)

// tinyPlan runs every suite at a size that only checks the plumbing.
func tinyPlan() Plan {
	return Plan{
		Warmup: 20 * time.Millisecond, Measure: 50 * time.Millisecond,
		Producers: 2, MsgBytes: 64,
		E1VConns:       []int{1, 10},
		E2EngineVConns: []int{10},
		E2NaiveVConns:  []int{10},
		E3Producers:    []int{1, 3},
		E5Sizes:        []int{16, 8 << 10}, // 8 KiB: past what UD carries
		Timeout:        30 * time.Second,
	}
}

// required are the fields every line of a suite has, on success.
var required = map[string][]string{
	"e1": {"design", "vconns", "qps", "msgs_per_sec", "cpu_ns_per_msg", "msg_bytes"},
	"e2": {"design", "vconns", "bytes_per_vconn"},
	"e3": {"mode", "producers", "msgs_per_sec"},
	"e5": {"transport", "msg_bytes", "msgs_per_sec"},
}

// TestSmoke runs every suite at a tiny size and checks the lines: each
// parses, names its suite, and has the suite's fields or an error.
//
// A configuration measures for 50 ms: on a host with more runnable threads
// than cores (15 on 2), one in a few runs had a configuration deliver
// nothing in its window ("no message delivered"). A design that cannot
// deliver fails every run: so such a run is run again, up to 3 times.
func TestSmoke(t *testing.T) {
	var out bytes.Buffer
	for try := 1; ; try++ {
		out.Reset()
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
		err := Run(ctx, Options{Plan: tinyPlan(), Out: &out, Log: testr.NewWithInterface(t, testr.Options{})})
		cancel()
		if err != nil {
			t.Fatal(err)
		}
		stalled := strings.Count(out.String(), `"error":"no message delivered in `)
		if stalled == 0 || try == 3 {
			break
		}
		t.Logf("run %d: %d configurations delivered nothing in their window: running again\n%s", try, stalled, out.String())
	}
	counts := map[string]int{}
	for i, line := range strings.Split(strings.TrimSpace(out.String()), "\n") {
		var m map[string]any
		if err := json.Unmarshal([]byte(line), &m); err != nil {
			t.Fatalf("line %d %q: %v", i+1, line, err)
		}
		suite, _ := m["suite"].(string)
		fields, ok := required[suite]
		if !ok {
			t.Fatalf("line %d: suite %q", i+1, suite)
		}
		counts[suite]++
		if e, ok := m["error"]; ok {
			// Only UD past its datagram size may fail here.
			if suite != "e5" || m["transport"] != "ud" || m["msg_bytes"] != float64(8<<10) {
				t.Errorf("line %d: unexpected error %v", i+1, e)
			}
			continue
		}
		for _, f := range fields {
			if _, ok := m[f]; !ok {
				t.Errorf("line %d %s: no %q", i+1, line, f)
			}
		}
	}
	// e1: 2 designs × 2 counts; e2: 2 designs; e3: 2 modes × 2; e5: 4 × 2.
	want := map[string]int{"e1": 4, "e2": 2, "e3": 4, "e5": 8}
	for s, n := range want {
		if counts[s] != n {
			t.Errorf("suite %s: %d lines, want %d", s, counts[s], n)
		}
	}
	if t.Failed() {
		t.Log(out.String())
	}
	// And the summary of those lines renders.
	if err := Summarize(bytes.NewReader(out.Bytes()), &bytes.Buffer{}); err != nil {
		t.Fatal(err)
	}
}

func TestRunRejectsBadOptions(t *testing.T) {
	for _, o := range []Options{
		{Suites: []string{"e4"}},
		{Wire: "carrier-pigeon"},
		{Format: "xml"},
	} {
		o.Out = &bytes.Buffer{}
		if err := Run(context.Background(), o); err == nil {
			t.Errorf("%+v: no error", o)
		}
	}
}

// TestOverBudget checks that a count whose estimate exceeds the budget is
// reported, not run.
func TestOverBudget(t *testing.T) {
	e := &env{Options: Options{Budget: 1 << 20}}
	var est estimator
	est.observe(100, memSample{RSS: 100 << 10}) // 1 KiB per connection
	// The same count again, growing less (memory already resident): the
	// estimate keeps the larger.
	est.observe(100, memSample{RSS: 10 << 10})
	if err := e.admit(designEngine, 2000, est); err == nil || !strings.Contains(err.Error(), "budget") {
		t.Errorf("2000 connections at 1 KiB within 1 MiB: %v", err)
	}
	if err := e.admit(designEngine, 500, est); err != nil {
		t.Errorf("500 connections at 1 KiB within 1 MiB: %v", err)
	}
	limit, err := readUint("/proc/sys/vm/max_map_count")
	if err != nil {
		t.Fatal(err)
	}
	// Two mappings per connection: half the limit in connections would
	// need all of it.
	est.observe(1000, memSample{RSS: 1, Maps: 2000})
	if err := e.admit(designNaive, int(limit/2), est); err == nil || !strings.Contains(err.Error(), "vm.max_map_count") {
		t.Errorf("%d connections of 2 mappings each: %v", limit/2, err)
	}
	if err := e.admit(designNaive, int(limit/4), est); err != nil {
		t.Errorf("%d connections of 2 mappings each: %v", limit/4, err)
	}
}

// TestErrLineLong: a joined error of many lines keeps a few and counts the
// rest.
func TestErrLineLong(t *testing.T) {
	errs := make([]error, 1000)
	for i := range errs {
		errs[i] = errors.New("munmap: cannot allocate memory")
	}
	r := errLine(Record{Suite: "e1"}, errors.Join(errs...))
	if strings.Count(r.Error, "munmap") != 3 || !strings.HasSuffix(r.Error, "(and 997 more lines)") {
		t.Errorf("error line: %q", r.Error)
	}
}

func TestSeriesMedian(t *testing.T) {
	s := &series{rec: Record{Suite: "e3", Mode: modeEngine, Producers: 4}}
	for _, v := range []float64{300, 100, 200} {
		s.add(rate{msgsPerSec: v, bytesPerSec: 64 * v, seconds: 1.5}, nil)
	}
	r := s.record(true)
	if r.MsgsPerSec == nil || *r.MsgsPerSec != 200 || r.MBPerSec == nil || *r.MBPerSec != 0 || len(r.Samples) != 3 || r.Samples[0] != 300 {
		t.Fatalf("got %+v", r)
	}
	s.add(rate{}, errOverBudget)
	s.add(rate{msgsPerSec: 1}, nil)
	if r := s.record(false); r.Error != "not run" || r.MsgsPerSec != nil {
		t.Fatalf("after an error: %+v", r)
	}
}
