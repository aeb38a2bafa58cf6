// Command benchpair compares two builds of RDMAvisor on this machine in one
// run: it alternates them round by round (before, after, before, ...) on
// the engine suites (`rdmavisor bench`) and on the engine's Go benchmark
// BenchmarkTransport, and prints each measurement's after/before ratio as
// the median of the rounds' ratios. A round's two runs are seconds apart,
// so they see the same machine; this machine's speed drifts by up to 2×
// over tens of seconds, which separate medians would not cancel.
//
// Each build is a directory holding `rdmavisor` and `engine.test`
// (hack/bench-pair.sh builds them from two git revisions).
package main

import (
	"bufio"
	"bytes"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"

	"github.com/rdmavisor/rdmavisor/internal/bench"
)

func main() {
	before := flag.String("before", "", "directory of the baseline build (rdmavisor, engine.test)")
	after := flag.String("after", "", "directory of the build compared with it")
	rounds := flag.Int("rounds", 5, "rounds; each runs both builds once, in alternating order")
	suites := flag.String("suites", "e1,e3,e5", "rdmavisor bench suites (empty: none)")
	transport := flag.String("bench", "^BenchmarkTransport$", "engine.test benchmarks (empty: none)")
	benchtime := flag.String("benchtime", "0.3s", "-test.benchtime of the engine benchmarks")
	flag.Parse()
	if *before == "" || *after == "" || *rounds < 1 {
		fmt.Fprintln(os.Stderr, "usage: benchpair -before DIR -after DIR [-rounds N] [-suites LIST] [-bench REGEXP]")
		os.Exit(2)
	}
	p := pairs{}
	for r := range *rounds {
		order := []string{*before, *after}
		if r%2 == 1 {
			order = []string{*after, *before} // neither build always goes first
		}
		for _, dir := range order {
			side := 0
			if dir == *after {
				side = 1
			}
			fmt.Fprintf(os.Stderr, "round %d/%d: %s\n", r+1, *rounds, dir)
			if *suites != "" {
				out, err := run(filepath.Join(dir, "rdmavisor"), "bench", "--suite", *suites, "--quick", "--format", "json")
				if err != nil {
					fail(err)
				}
				if err := p.addSuites(r, side, out); err != nil {
					fail(err)
				}
			}
			if *transport != "" {
				out, err := run(filepath.Join(dir, "engine.test"), "-test.run", "^$", "-test.bench", *transport, "-test.benchtime", *benchtime)
				if err != nil {
					fail(err)
				}
				p.addGoBench(r, side, out)
			}
		}
	}
	p.print(os.Stdout, *rounds)
}

func fail(err error) {
	fmt.Fprintln(os.Stderr, "benchpair:", err)
	os.Exit(1)
}

func run(bin string, args ...string) ([]byte, error) {
	cmd := exec.Command(bin, args...)
	cmd.Dir = os.TempDir()
	var out, errs bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errs
	if err := cmd.Run(); err != nil {
		// Its first lines past the log say why (a panic's, a fatal
		// error's); the whole of it is kept.
		kept := "not kept"
		if f, ferr := os.CreateTemp("", "benchpair-stderr-*.txt"); ferr == nil {
			_, _ = f.Write(errs.Bytes())
			_ = f.Close()
			kept = f.Name()
		}
		why := errs.String()
		if i := strings.Index(why, "\npanic:"); i >= 0 {
			why = why[i+1:]
		} else if i := strings.Index(why, "\nfatal error:"); i >= 0 {
			why = why[i+1:]
		}
		why = why[:min(len(why), 3000)]
		return nil, fmt.Errorf("%s %s: %w (stderr: %s)\n%s", bin, strings.Join(args, " "), err, kept, why)
	}
	return out.Bytes(), nil
}

// pairs holds each measurement's value per round and side (0 before, 1 after).
type pairs struct {
	keys []string
	vals map[string]map[int]*[2]float64
	unit map[string]string
}

func (p *pairs) add(key, unit string, round, side int, v float64) {
	if p.vals == nil {
		p.vals, p.unit = map[string]map[int]*[2]float64{}, map[string]string{}
	}
	if p.vals[key] == nil {
		p.vals[key] = map[int]*[2]float64{}
		p.keys = append(p.keys, key)
		p.unit[key] = unit
	}
	if p.vals[key][round] == nil {
		p.vals[key][round] = &[2]float64{}
	}
	p.vals[key][round][side] = v
}

// record is the part of a bench.Record benchpair compares.
type record struct {
	Suite      string   `json:"suite"`
	Design     string   `json:"design"`
	Mode       string   `json:"mode"`
	Transport  string   `json:"transport"`
	VConns     int      `json:"vconns"`
	QPs        int      `json:"qps"`
	Producers  int      `json:"producers"`
	MsgBytes   int      `json:"msg_bytes"`
	NICModel   bool     `json:"nic_model"`
	MsgsPerSec *float64 `json:"msgs_per_sec"`
	Error      string   `json:"error"`
}

func (p *pairs) addSuites(round, side int, out []byte) error {
	sc := bufio.NewScanner(bytes.NewReader(out))
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		var r record
		if err := json.Unmarshal(sc.Bytes(), &r); err != nil {
			return fmt.Errorf("a line of rdmavisor bench: %w", err)
		}
		if r.MsgsPerSec == nil || r.Error != "" {
			continue
		}
		if r.NICModel {
			k := []string{r.Suite, r.Design, "nic-model", "vconns=" + strconv.Itoa(r.VConns)}
			p.add(strings.Join(k, " "), "msgs/s", round, side, *r.MsgsPerSec)
			continue
		}
		var k []string
		k = append(k, r.Suite)
		for _, s := range []string{r.Design, r.Mode, r.Transport} {
			if s != "" {
				k = append(k, s)
			}
		}
		qps := r.QPs
		if r.Suite != "e3" {
			// Elsewhere the QPs are the engine's default, which a
			// change may move: the measurement is the same one.
			qps = 0
		}
		for _, f := range []struct {
			n string
			v int
		}{{"vconns", r.VConns}, {"qps", qps}, {"producers", r.Producers}, {"bytes", r.MsgBytes}} {
			if f.v != 0 {
				k = append(k, f.n+"="+strconv.Itoa(f.v))
			}
		}
		p.add(strings.Join(k, " "), "msgs/s", round, side, *r.MsgsPerSec)
	}
	return sc.Err()
}

var benchLine = regexp.MustCompile(`^(Benchmark\S+?)(?:-\d+)?\s+\d+\s+.*?([\d.]+) MB/s`)

func (p *pairs) addGoBench(round, side int, out []byte) {
	for _, l := range strings.Split(string(out), "\n") {
		if m := benchLine.FindStringSubmatch(l); m != nil {
			v, err := strconv.ParseFloat(m[2], 64)
			if err == nil {
				p.add(m[1], "MB/s", round, side, v)
			}
		}
	}
}

func (p *pairs) print(w io.Writer, rounds int) {
	fmt.Fprintf(w, "| measurement | before (median) | after (median) | after/before (median of %d rounds' ratios) | rounds' ratios |\n", rounds)
	fmt.Fprintln(w, "|---|---:|---:|---:|---|")
	var all []float64
	for _, k := range p.keys {
		var b, a, ratios []float64
		for r := range rounds {
			v := p.vals[k][r]
			if v == nil || v[0] == 0 || v[1] == 0 {
				continue
			}
			b, a, ratios = append(b, v[0]), append(a, v[1]), append(ratios, v[1]/v[0])
		}
		if len(ratios) == 0 {
			continue
		}
		rs := make([]string, len(ratios))
		for i, r := range ratios {
			rs[i] = fmt.Sprintf("%.2f", r)
		}
		m := bench.Median(ratios)
		all = append(all, m)
		fmt.Fprintf(w, "| %s | %.4g %s | %.4g %s | %.3f | %s |\n", k, bench.Median(b), p.unit[k], bench.Median(a), p.unit[k], m, strings.Join(rs, " "))
	}
	if len(all) > 0 {
		fmt.Fprintf(w, "\nMedian of the %d measurements' ratios: %.3f (min %.3f, max %.3f).\n", len(all), bench.Median(all), slices.Min(all), slices.Max(all))
	}
}
