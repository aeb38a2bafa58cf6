// Command e6report writes benchmark E6's tables and figure (hack/bench-e6.sh
// runs it) from the lines test/ladder's TestE6 appended to e6.txt: per
// mode (quiet, busy), one row per path with each figure's median over the
// mode's rounds, and e6-ladder.svg, the p50 and p99 round trips of every
// path, quiet and busy (package plot).
package main

import (
	"bufio"
	"flag"
	"fmt"
	"io"
	"math"
	"os"
	"strconv"
	"strings"

	"github.com/rdmavisor/rdmavisor/internal/bench"
	"github.com/rdmavisor/rdmavisor/internal/plot"
)

func main() {
	in := flag.String("in", "bench/results/e6.txt", "TestE6's lines (test/ladder)")
	md := flag.String("md", "bench/results/e6.md", "the tables to write")
	svg := flag.String("svg", "bench/results/e6-ladder.svg", "the figure to write")
	flag.Parse()
	if err := run(*in, *md, *svg); err != nil {
		fmt.Fprintln(os.Stderr, "e6report:", err)
		os.Exit(1)
	}
}

// mode is one run of TestE6.
type mode struct {
	name   string
	header map[string]string // its "# E6" lines' fields
	paths  []string          // in the order of the lines
	// rounds[path][round] are the round's figures by name.
	rounds map[string]map[int]map[string]float64
}

// fields parses "key=value" words.
func fields(words []string) map[string]string {
	m := map[string]string{}
	for _, w := range words {
		if k, v, ok := strings.Cut(w, "="); ok {
			m[k] = v
		}
	}
	return m
}

func parse(r io.Reader) ([]*mode, error) {
	var modes []*mode
	get := func(name string) *mode {
		for _, m := range modes {
			if m.name == name {
				return m
			}
		}
		m := &mode{name: name, header: map[string]string{}, rounds: map[string]map[int]map[string]float64{}}
		modes = append(modes, m)
		return m
	}
	sc := bufio.NewScanner(r)
	for n := 1; sc.Scan(); n++ {
		w := strings.Fields(sc.Text())
		switch {
		case len(w) > 2 && w[0] == "#" && w[1] == "E6":
			f := fields(w[2:])
			m := get(f["mode"])
			for k, v := range f {
				m.header[k] = v
			}
		case len(w) > 1 && w[0] == "E6":
			f := fields(w[1:])
			m, path := get(f["mode"]), f["path"]
			round, err := strconv.Atoi(f["round"])
			if err != nil || path == "" || f["mode"] == "" {
				return nil, fmt.Errorf("line %d: no mode, round or path: %q", n, sc.Text())
			}
			if m.rounds[path] == nil {
				m.rounds[path] = map[int]map[string]float64{}
				m.paths = append(m.paths, path)
			}
			vals := map[string]float64{}
			for k, v := range f {
				if k == "mode" || k == "round" || k == "path" {
					continue
				}
				x, err := strconv.ParseFloat(v, 64)
				if err != nil {
					return nil, fmt.Errorf("line %d: %s=%q: %v", n, k, v, err)
				}
				vals[k] = x
			}
			m.rounds[path][round] = vals
		}
	}
	if err := sc.Err(); err != nil {
		return nil, err
	}
	if len(modes) == 0 {
		return nil, fmt.Errorf("no E6 lines")
	}
	return modes, nil
}

// med is the median over the rounds of path's figure key.
func (m *mode) med(path, key string) float64 {
	var v []float64
	for _, r := range m.rounds[path] {
		if x, ok := r[key]; ok {
			v = append(v, x)
		}
	}
	return bench.Median(v)
}

// ratio is the median over the rounds of num/den, each round's two figures
// from that round (a and b paths; the same path for a figure's ratio to
// another of its own).
func (m *mode) ratio(pa, ka, pb, kb string) float64 {
	var v []float64
	for round, ra := range m.rounds[pa] {
		rb, ok := m.rounds[pb][round]
		if ok && rb[kb] > 0 {
			v = append(v, ra[ka]/rb[kb])
		}
	}
	return bench.Median(v)
}

func num(v float64, prec int) string {
	if math.IsNaN(v) {
		return "—"
	}
	s := strconv.FormatFloat(v, 'f', prec, 64)
	// Thousands separated, as summary.md writes rates.
	if i := strings.IndexByte(s, '.'); i < 0 && len(s) > 4 {
		var b strings.Builder
		for k, c := range s {
			if k > 0 && (len(s)-k)%3 == 0 {
				b.WriteByte(',')
			}
			b.WriteRune(c)
		}
		return b.String()
	}
	return s
}

var about = map[string]string{
	"engine":       "engine.VConn called directly: two engines configured as the agents', in the test's process",
	"shm":          "package vconn with SharedMemory: memfd rings to the agent; the program's goroutines in the agents' process (the test's)",
	"socket":       "package vconn on the agent's unix socket; the program's goroutines in the agents' process (the test's)",
	"shm-proc":     "the same as shm, package vconn in a process of its own as a pod's program is (test/ladder/goladder)",
	"socket-proc":  "the same as socket, in a process of its own (test/ladder/goladder)",
	"libvconn":     "clib/test/ladder.c over libvconn (the socket)",
	"libvconn-shm": "clib/test/ladder.c over libvconn with shared memory",
	"preload":      "clib/test/ladder_tcp.c, plain TCP sockets, under librdmavisor-preload.so",
	"python":       "test/ladder/ladder.py over the rdmavisor package (the socket)",
	"tcp":          "Go's net on 127.0.0.1, both ends in the test's process",
	"tcp-c":        "clib/test/ladder_tcp.c on 127.0.0.1, no preload library",
}

func writeMD(w io.Writer, modes []*mode) {
	fmt.Fprintln(w, "# E6: the ladder")
	fmt.Fprintln(w)
	fmt.Fprintln(w, "Every way a program reaches a vconn, and the engine called directly and TCP on loopback, between two")
	fmt.Fprintln(w, "agents (internal/agent/agenttest: node-a and node-b, soft provider on UDP, transport auto), both ends of")
	fmt.Fprintln(w, "each connection on the same path (test/ladder, hack/bench-e6.sh). Round trips: 64-byte messages echoed,")
	fmt.Fprintln(w, "1 and 16 in flight, every echo checked. Rate: round trips per second at 16 in flight. Streams: one way,")
	fmt.Fprintln(w, "4 KiB and 64 KiB messages (a fixed-size write on byte-stream paths), timed until the server has counted")
	fmt.Fprintln(w, "every byte; MB/s is 10⁶ bytes/s. Rounds rotate through the paths; every figure is the median over the")
	fmt.Fprintln(w, "rounds, and a ratio the median of the rounds' ratios (each round's two figures from that round).")
	fmt.Fprintln(w, "Busy: the same run with two CPU-bound processes (`sh -c 'while :; do :; done'`) at normal priority beside it.")
	fmt.Fprintln(w, "Figure: e6-ladder.svg (p50 and p99 round trip at 1 in flight, quiet and busy).")
	fmt.Fprintln(w)
	for _, m := range modes {
		h := m.header
		fmt.Fprintf(w, "## %s\n\n", m.name)
		fmt.Fprintf(w, "%s rounds on %s CPUs, %s, started %s, took %s; the machine's load average %s at the start, %s at the end. Work per round and path: %s and %s round trips, %s × 4 KiB and %s × 64 KiB.\n\n",
			h["rounds"], h["cpus"], h["go"], h["date"], h["took"], h["load.start"], h["load.end"], h["pp1"], h["pp16"], h["s4k"], h["s64k"])
		fmt.Fprintln(w, "| path | p50 µs | p99 µs | p99.9 µs | p50 µs, 16 in flight | p99 µs, 16 | p99.9 µs, 16 | round trips/s, 16 | MB/s, 4 KiB | MB/s, 64 KiB | p50 ÷ engine p50 | p99 / p50 |")
		fmt.Fprintln(w, "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
		_, haveEngine := m.rounds["engine"]
		for _, p := range m.paths {
			vsEngine := math.NaN()
			if haveEngine {
				vsEngine = m.ratio(p, "pp1.p50", "engine", "pp1.p50")
			}
			fmt.Fprintf(w, "| %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s |\n", p,
				num(m.med(p, "pp1.p50"), 1), num(m.med(p, "pp1.p99"), 1), num(m.med(p, "pp1.p999"), 1),
				num(m.med(p, "pp16.p50"), 1), num(m.med(p, "pp16.p99"), 1), num(m.med(p, "pp16.p999"), 1),
				num(m.med(p, "rate"), 0), num(m.med(p, "s4k"), 0), num(m.med(p, "s64k"), 0),
				num(vsEngine, 2), num(m.ratio(p, "pp1.p99", p, "pp1.p50"), 2))
		}
		fmt.Fprintln(w)
	}
	fmt.Fprintln(w, "The paths:")
	fmt.Fprintln(w)
	for _, p := range modes[0].paths {
		if a, ok := about[p]; ok {
			fmt.Fprintf(w, "- %s: %s.\n", p, a)
		}
	}
}

// chart is the figure: per path, p50 and p99 at 1 in flight, per mode.
func chart(modes []*mode) plot.Bars {
	b := plot.Bars{Title: "E6: round trip by path (64 B, 1 in flight; medians over rounds)", YLabel: "round trip (µs, log scale)", LogY: true,
		Groups: modes[0].paths, Notes: []string{"both ends on the path, between two agents; busy: two CPU-bound processes beside"}}
	colors := map[string][2]string{"quiet": {"#1f77b4", "#aec7e8"}, "busy": {"#d62728", "#ff9896"}}
	for _, m := range modes {
		c, ok := colors[m.name]
		if !ok {
			c = [2]string{"#2ca02c", "#98df8a"}
		}
		for i, q := range []string{"p50", "p99"} {
			s := plot.Series{Name: q + " " + m.name, Color: c[i]}
			for _, p := range b.Groups {
				s.Y = append(s.Y, m.med(p, "pp1."+q))
			}
			b.Series = append(b.Series, s)
		}
	}
	return b
}

func run(in, md, svg string) error {
	f, err := os.Open(in)
	if err != nil {
		return err
	}
	defer f.Close()
	modes, err := parse(f)
	if err != nil {
		return fmt.Errorf("%s: %w", in, err)
	}
	for _, x := range []struct {
		path  string
		write func(io.Writer) error
	}{
		{md, func(w io.Writer) error { writeMD(w, modes); return nil }},
		{svg, chart(modes).SVG},
	} {
		w, err := os.Create(x.path)
		if err != nil {
			return err
		}
		if err := x.write(w); err != nil {
			_ = w.Close()
			return fmt.Errorf("%s: %w", x.path, err)
		}
		if err := w.Close(); err != nil {
			return err
		}
		fmt.Println(x.path)
	}
	return nil
}
