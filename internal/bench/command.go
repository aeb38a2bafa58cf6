package bench

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"
)

// The parts of `rdmavisor bench` that are more than flags.

// ParseCounts parses a comma-separated list of connection counts, each at
// least 1 (`rdmavisor bench --vconns`).
func ParseCounts(s string) ([]int, error) {
	var ns []int
	for _, f := range strings.Split(s, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(f))
		if err != nil || n < 1 {
			return nil, fmt.Errorf("bad count %q", f)
		}
		ns = append(ns, n)
	}
	return ns, nil
}

// SummarizeFile writes the Markdown summary of the JSON lines file path to
// w (Summarize).
func SummarizeFile(path string, w io.Writer) error {
	f, err := os.Open(path)
	if err != nil {
		return err
	}
	defer f.Close()
	return Summarize(f, w)
}

// RunToDir runs the benchmarks as Run does and logs how long they took.
// When dir is set it also writes dir/engine.jsonl, every record as a JSON
// line, and dir/engine-summary.md, their summary, also after a failed run.
func RunToDir(ctx context.Context, o Options, dir string) error {
	var jsonl bytes.Buffer
	if dir != "" {
		if err := os.MkdirAll(dir, 0o755); err != nil {
			return err
		}
		o.JSONCopy = &jsonl
	}
	start := time.Now()
	err := Run(ctx, o)
	o.Log.Info("Benchmarks done", "seconds", time.Since(start).Seconds())
	if dir == "" {
		return err
	}
	var sum bytes.Buffer
	errs := []error{err, os.WriteFile(filepath.Join(dir, "engine.jsonl"), jsonl.Bytes(), 0o644)}
	if serr := Summarize(bytes.NewReader(jsonl.Bytes()), &sum); serr != nil {
		errs = append(errs, serr)
	} else {
		errs = append(errs, os.WriteFile(filepath.Join(dir, "engine-summary.md"), sum.Bytes(), 0o644))
	}
	return errors.Join(errs...)
}
