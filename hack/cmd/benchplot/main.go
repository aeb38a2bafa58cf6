// Command benchplot draws the benchmark figures of a `make bench` run as SVG
// (package plot, standard library only): E1 messages/s and CPU per message
// against connections with the NIC model off and on, E2 bytes per vconn,
// E5 by message size, E4 by path. hack/bench.sh runs it.
package main

import (
	"flag"
	"fmt"
	"os"
	"path/filepath"

	"github.com/rdmavisor/rdmavisor/internal/bench"
)

func main() {
	jsonl := flag.String("jsonl", "bench/results/engine.jsonl", "records of `rdmavisor bench` (JSON lines)")
	e4 := flag.String("e4", "bench/results/e4.txt", "go test -bench output of BenchmarkE4 (empty or missing: no E4 figures)")
	out := flag.String("out", "bench/results", "directory to write the SVG files to")
	flag.Parse()
	if err := run(*jsonl, *e4, *out); err != nil {
		fmt.Fprintln(os.Stderr, "benchplot:", err)
		os.Exit(1)
	}
}

func run(jsonl, e4, out string) error {
	f, err := os.Open(jsonl)
	if err != nil {
		return err
	}
	defer f.Close()
	recs, err := bench.ReadRecords(f)
	if err != nil {
		return fmt.Errorf("%s: %w", jsonl, err)
	}
	var lines []bench.GoBench
	if e4 != "" {
		g, err := os.Open(e4)
		switch {
		case os.IsNotExist(err):
		case err != nil:
			return err
		default:
			defer g.Close()
			if lines, err = bench.ParseGoBench(g); err != nil {
				return fmt.Errorf("%s: %w", e4, err)
			}
		}
	}
	for _, fig := range bench.Figures(recs, lines) {
		path := filepath.Join(out, fig.File)
		w, err := os.Create(path)
		if err != nil {
			return err
		}
		if err := fig.Chart.SVG(w); err != nil {
			_ = w.Close()
			return fmt.Errorf("%s: %w", path, err)
		}
		if err := w.Close(); err != nil {
			return err
		}
		fmt.Println(path)
	}
	return nil
}
