// Package ladder_test is benchmark E6, "the ladder": every way a program
// reaches a vconn, and for comparison the engine called directly and TCP
// on loopback, measured between two agents (internal/agent/agenttest,
// node-a and node-b, transport auto) with both ends of each connection on
// the same path:
//
//	engine    engine.VConn called directly (two engines configured as the agents')
//	shm       package vconn with Options.SharedMemory (memfd rings)
//	socket    package vconn on the agent's unix socket
//	shm-proc, socket-proc  the same in processes of their own, as pods'
//	          programs are (test/ladder/goladder)
//	libvconn  clib/test/ladder.c over libvconn
//	preload   clib/test/ladder_tcp.c, plain TCP sockets, under librdmavisor-preload.so
//	python    test/ladder/ladder.py over the rdmavisor package
//	tcp       Go's net on 127.0.0.1
//	tcp-c     clib/test/ladder_tcp.c on 127.0.0.1, without the preload library
//
// Each path runs a 64-byte ping-pong with 1 and with 16 messages in flight
// (every echo checked), whose round trips give p50, p99 and p99.9 and, at
// 16 in flight, the request rate; and a one-way stream of 4 KiB and of
// 64 KiB messages, timed until the server has counted every byte. The
// engine, shm, socket and tcp paths run both ends as goroutines of this
// test, beside the agents (a program's hand-off to its agent is then a
// goroutine's, which a pod's program never has); the others are two
// processes each. The Go paths speak package ladderproto. Rounds rotate
// through the paths, so that a change in the machine's speed hits them all
// alike, and hack/bench-e6.sh reports each figure's median over rounds.
//
// TestLadderEcho checks that every path echoes and counts correctly, on
// little work. TestE6 measures, only when RDMAVISOR_E6 names a file to
// append its lines to (hack/bench-e6.sh sets it); RDMAVISOR_E6_MODE=busy
// runs two CPU-bound processes beside it; RDMAVISOR_E6_ROUNDS (default 7),
// RDMAVISOR_E6_SCALE (the work of a round, default 1) and
// RDMAVISOR_E6_PATHS (a comma-separated list, default all but
// libvconn-shm) shape the run. No test asserts a timing.
package ladder_test

import (
	"context"
	"fmt"
	"github.com/rdmavisor/rdmavisor/test/ladder/ladderproto"
	"math"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/rdmavisor/rdmavisor/internal/agent/agenttest"
	"github.com/rdmavisor/rdmavisor/internal/engine"
)

type harness struct {
	t         *testing.T
	ctx       context.Context
	repo      string
	bin       string // clib's build: libvconn, the preload library, ladder, ladder_tcp
	py        string // the Python interpreter
	cl        *agenttest.Cluster
	engineCfg engine.Config // the agents' engines' configuration
}

func newHarness(t *testing.T) *harness {
	_, file, _, _ := runtime.Caller(0)
	h := &harness{t: t, repo: filepath.Join(filepath.Dir(file), "..", ".."), bin: t.TempDir()}
	for _, p := range []string{"make", "cc"} {
		if _, err := exec.LookPath(p); err != nil {
			t.Fatalf("%s is not installed: run hack/deps.sh test (as root) or apt-get install it", p)
		}
	}
	h.py = os.Getenv("RDMAVISOR_PYTHON")
	if h.py == "" {
		h.py = "python3"
	}
	if _, err := exec.LookPath(h.py); err != nil {
		t.Fatalf("%s: %v (RDMAVISOR_PYTHON names another interpreter)", h.py, err)
	}
	out, err := exec.Command("make", "-s", "-C", filepath.Join(h.repo, "clib"), "BUILD="+h.bin, "all", "preload", "ladder").CombinedOutput()
	if err != nil {
		t.Fatalf("make -C clib all preload ladder: %v\n%s", err, out)
	}
	goladder := exec.Command("go", "build", "-o", filepath.Join(h.bin, "goladder"), "./test/ladder/goladder")
	goladder.Dir = h.repo
	if out, err := goladder.CombinedOutput(); err != nil {
		t.Fatalf("go build ./test/ladder/goladder: %v\n%s", err, out)
	}
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	h.ctx = ctx
	var mu sync.Mutex
	logs := &logTail{}
	h.cl, err = agenttest.Start(agenttest.Options{Transport: "auto", Log: logs.logger(), TuneEngine: func(c *engine.Config) {
		mu.Lock()
		defer mu.Unlock()
		h.engineCfg = *c
	}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := h.cl.Close(); err != nil {
			t.Errorf("close the agents: %v", err)
		}
	})
	// Registered after the close, so it runs before it: the engines'
	// counters are still there.
	h.keepLogs(t, logs)
	return h
}

// connect starts the paths named (all but the extra ones when names is
// empty), in the order of paths.
func (h *harness) connect(names []string) []*rung {
	var rs []*rung
	for _, p := range paths {
		if len(names) == 0 && p.extra || len(names) > 0 && !slices.Contains(names, p.name) {
			continue
		}
		c, err := p.start(h)
		if err != nil {
			h.t.Fatalf("%s: %v", p.name, err)
		}
		rs = append(rs, &rung{name: p.name, c: c})
	}
	for _, n := range names {
		if !slices.ContainsFunc(paths, func(p path) bool { return p.name == n }) {
			h.t.Fatalf("RDMAVISOR_E6_PATHS: no path %q", n)
		}
	}
	return rs
}

// rung is a path being measured.
type rung struct {
	name string
	c    client
}

// work is what one round asks of each path.
type work struct {
	pp1, pp16  int // messages of the ping-pongs at 1 and at 16 in flight
	s4k, s64k  int // messages of the streams
	size       int // of a ping-pong's messages
	streamSize [2]int
}

func workOf(scale float64) work {
	n := func(v float64) int { return max(16, int(v*scale)) }
	return work{pp1: n(3000), pp16: n(8000), s4k: n(16384), s64k: n(1024), size: 64, streamSize: [2]int{4 << 10, 64 << 10}}
}

// result is one round of one path.
type result struct {
	pp1, pp16 [3]float64 // p50, p99, p99.9 round trip (µs)
	rate      float64    // round trips/s at 16 in flight
	s4k, s64k float64    // MB/s
}

var quantiles = [3]float64{0.5, 0.99, 0.999}

// percentiles are the nearest-rank quantiles of rtts, in µs.
func percentiles(rtts []time.Duration) [3]float64 {
	s := slices.Clone(rtts)
	slices.Sort(s)
	var p [3]float64
	for i, q := range quantiles {
		k := max(0, int(math.Ceil(q*float64(len(s))))-1)
		p[i] = float64(s[k].Nanoseconds()) / 1e3
	}
	return p
}

func (r *rung) measure(w work) (result, error) {
	var res result
	_, rtt, err := r.c.pingPong(w.size, 1, w.pp1)
	if err != nil {
		return res, fmt.Errorf("ping-pong, 1 in flight: %w", err)
	}
	res.pp1 = percentiles(rtt)
	d, rtt, err := r.c.pingPong(w.size, 16, w.pp16)
	if err != nil {
		return res, fmt.Errorf("ping-pong, 16 in flight: %w", err)
	}
	res.pp16, res.rate = percentiles(rtt), float64(w.pp16)/d.Seconds()
	for i, n := range []int{w.s4k, w.s64k} {
		size := w.streamSize[i]
		d, err := r.c.stream(size, n)
		if err != nil {
			return res, fmt.Errorf("stream of %d-byte messages: %w", size, err)
		}
		mbps := float64(size*n) / d.Seconds() / 1e6
		if i == 0 {
			res.s4k = mbps
		} else {
			res.s64k = mbps
		}
	}
	return res, nil
}

// line is a round's record, as hack/cmd/e6report reads it.
func (r result) line(mode string, round int, path string) string {
	f := func(v float64) string { return strconv.FormatFloat(v, 'f', 2, 64) }
	return fmt.Sprintf("E6 mode=%s round=%d path=%s pp1.p50=%s pp1.p99=%s pp1.p999=%s pp16.p50=%s pp16.p99=%s pp16.p999=%s rate=%.0f s4k=%s s64k=%s",
		mode, round, path, f(r.pp1[0]), f(r.pp1[1]), f(r.pp1[2]), f(r.pp16[0]), f(r.pp16[1]), f(r.pp16[2]), r.rate, f(r.s4k), f(r.s64k))
}

func (h *harness) quit(rs []*rung) {
	for _, r := range rs {
		if err := r.c.quit(); err != nil {
			h.t.Errorf("%s: %v", r.name, err)
		}
	}
}

// TestLadderEcho runs every path, the extra ones too, on little work: each
// echo compared with what was sent, each stream's messages counted and
// their numbers checked by the server.
func TestLadderEcho(t *testing.T) {
	h := newHarness(t)
	rs := h.connect(pathNames(true))
	w := work{pp1: 50, pp16: 200, s4k: 64, s64k: 16, size: 64, streamSize: [2]int{4 << 10, 64 << 10}}
	for _, r := range rs {
		if _, err := r.measure(w); err != nil {
			t.Errorf("%s: %v", r.name, err)
		}
		// Sizes other than the benchmark's: a message's bytes all count.
		if _, _, err := r.c.pingPong(ladderproto.MaxMsg, 3, 10); err != nil {
			t.Errorf("%s: 64 KiB echoes: %v", r.name, err)
		}
		if _, err := r.c.stream(8, 1000); err != nil {
			t.Errorf("%s: 8-byte stream: %v", r.name, err)
		}
	}
	h.quit(rs)
}

func pathNames(extra bool) []string {
	var n []string
	for _, p := range paths {
		if extra || !p.extra {
			n = append(n, p.name)
		}
	}
	return n
}

// TestE6 measures the ladder: see the package's comment.
func TestE6(t *testing.T) {
	out := os.Getenv("RDMAVISOR_E6")
	if out == "" {
		t.Skip("RDMAVISOR_E6 is not set: hack/bench-e6.sh measures E6")
	}
	mode := os.Getenv("RDMAVISOR_E6_MODE")
	if mode == "" {
		mode = "quiet"
	}
	if mode != "quiet" && mode != "busy" {
		t.Fatalf("RDMAVISOR_E6_MODE=%q: quiet or busy", mode)
	}
	rounds, scale := 7, 1.0
	if s := os.Getenv("RDMAVISOR_E6_ROUNDS"); s != "" {
		var err error
		if rounds, err = strconv.Atoi(s); err != nil || rounds < 1 {
			t.Fatalf("RDMAVISOR_E6_ROUNDS=%q: want a count", s)
		}
	}
	if s := os.Getenv("RDMAVISOR_E6_SCALE"); s != "" {
		var err error
		if scale, err = strconv.ParseFloat(s, 64); err != nil || scale <= 0 {
			t.Fatalf("RDMAVISOR_E6_SCALE=%q: want a positive number", s)
		}
	}
	var names []string
	if s := os.Getenv("RDMAVISOR_E6_PATHS"); s != "" {
		names = strings.Split(s, ",")
	}
	f, err := os.OpenFile(out, os.O_WRONLY|os.O_APPEND|os.O_CREATE, 0o644)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	emit := func(format string, args ...any) {
		line := fmt.Sprintf(format, args...)
		if _, err := fmt.Fprintln(f, line); err != nil {
			t.Fatal(err)
		}
		t.Log(line)
	}

	h := newHarness(t)
	rs := h.connect(names)
	w := workOf(scale)
	start := time.Now()
	emit("# E6 mode=%s rounds=%d scale=%g paths=%d cpus=%d go=%s transport=%s pp1=%d pp16=%d s4k=%d s64k=%d date=%s load.start=%s",
		mode, rounds, scale, len(rs), runtime.NumCPU(), runtime.Version(), h.engineCfg.Transport, w.pp1, w.pp16, w.s4k, w.s64k, start.UTC().Format(time.RFC3339), loadavg())
	// A warm-up round on a tenth of the work, not recorded.
	for _, r := range rs {
		if _, err := r.measure(workOf(scale / 10)); err != nil {
			t.Fatalf("%s, warming up: %v", r.name, err)
		}
	}
	if mode == "busy" {
		spin(t, 2)
	}
	byPath := map[string][]result{}
	for round := 0; round < rounds; round++ {
		for i := range rs {
			r := rs[(round+i)%len(rs)]
			res, err := r.measure(w)
			if err != nil {
				t.Fatalf("%s, round %d (load %s): %v", r.name, round+1, loadavg(), err)
			}
			byPath[r.name] = append(byPath[r.name], res)
			emit("%s", res.line(mode, round+1, r.name))
		}
	}
	emit("# E6 mode=%s took=%s load.end=%s", mode, time.Since(start).Round(time.Second), loadavg())
	h.quit(rs)
	// The medians, for the log: hack/cmd/e6report writes the tables.
	var b strings.Builder
	fmt.Fprintf(&b, "E6 %s, medians over %d rounds: p50/p99/p99.9 µs at 1 and 16 in flight, round trips/s at 16, MB/s at 4 and 64 KiB\n", mode, rounds)
	for _, r := range rs {
		med := func(get func(result) float64) float64 {
			v := make([]float64, 0, rounds)
			for _, x := range byPath[r.name] {
				v = append(v, get(x))
			}
			slices.Sort(v)
			if n := len(v); n%2 == 0 {
				return (v[n/2-1] + v[n/2]) / 2
			}
			return v[len(v)/2]
		}
		fmt.Fprintf(&b, "%-12s %8.1f %8.1f %8.1f | %8.1f %8.1f %8.1f | %9.0f | %8.1f %8.1f\n", r.name,
			med(func(x result) float64 { return x.pp1[0] }), med(func(x result) float64 { return x.pp1[1] }), med(func(x result) float64 { return x.pp1[2] }),
			med(func(x result) float64 { return x.pp16[0] }), med(func(x result) float64 { return x.pp16[1] }), med(func(x result) float64 { return x.pp16[2] }),
			med(func(x result) float64 { return x.rate }), med(func(x result) float64 { return x.s4k }), med(func(x result) float64 { return x.s64k }))
	}
	t.Log(b.String())
}

// loadavg is the machine's 1-minute load average (other work than this
// test's shows in it), "?" where it cannot be read.
func loadavg() string {
	b, err := os.ReadFile("/proc/loadavg")
	if f := strings.Fields(string(b)); err == nil && len(f) > 0 {
		return f[0]
	}
	return "?"
}

// spin runs n CPU-bound processes beside the test, at normal priority,
// until it ends.
func spin(t *testing.T, n int) {
	for range n {
		cmd := exec.Command("sh", "-c", "while :; do :; done")
		cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() {
			_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
			_ = cmd.Wait()
		})
	}
}
