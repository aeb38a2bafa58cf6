//go:build e2e

package e2e

import (
	"fmt"
	"os"
	"os/exec"
	"runtime"
	"strings"
	"sync"
	"time"
)

// results are the figures the suite measures (outages, detection times,
// what an impaired link did), written to E2E_RESULTS (hack/e2e.sh:
// bench/results/e2e.md) after a run that passed, so that a document citing
// one cites a committed file, not a log line.
type results struct {
	mu   sync.Mutex
	rows [][3]string // step, figure, value
}

// measured records a figure of the current step.
func (e *env) measured(figure, format string, args ...any) {
	e.results.mu.Lock()
	defer e.results.mu.Unlock()
	e.results.rows = append(e.results.rows, [3]string{e.t.Name(), figure, fmt.Sprintf(format, args...)})
}

// write renders the figures as Markdown.
func (r *results) write(path, repo string, nodes int, took time.Duration) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	commit, _ := exec.Command("git", "-C", repo, "rev-parse", "--short", "HEAD").Output()
	var b strings.Builder
	fmt.Fprintf(&b, "# End-to-end figures\n\n")
	fmt.Fprintf(&b, "Written by `make e2e` (test/e2e, `E2E_RESULTS`) after a run that passed: %s, commit %s, "+
		"%d nodes of the local cluster on one machine of %d CPUs, suite %s.\n\n",
		time.Now().UTC().Format("2006-01-02"), strings.TrimSpace(string(commit)), nodes, runtime.NumCPU(), took.Round(time.Second))
	b.WriteString("| step | figure | value |\n|---|---|---|\n")
	for _, row := range r.rows {
		step := row[0][strings.LastIndex(row[0], "/")+1:]
		fmt.Fprintf(&b, "| %s | %s | %s |\n", strings.ReplaceAll(step, "_", " "), row[1], row[2])
	}
	return os.WriteFile(path, []byte(b.String()), 0o644)
}
