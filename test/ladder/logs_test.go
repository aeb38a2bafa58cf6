package ladder_test

import (
	"fmt"
	"strings"
	"sync"
	"testing"

	"github.com/go-logr/logr"
	"github.com/go-logr/logr/funcr"
)

// logTail keeps the last lines the agents logged (their V(1) lines
// too), for a failing run to show: a failure seen once in many rounds
// (E6's busy phase once read EOF midway through a stream) is only
// explainable from what the agents said around it. The programs' own
// output is kept by reap.
type logTail struct {
	mu    sync.Mutex
	lines []string
	next  int // where the next line goes once lines is full
	lost  int // lines overwritten
}

// logTailLines bounds what a failing run prints.
const logTailLines = 2000

func (l *logTail) add(line string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if len(l.lines) < logTailLines {
		l.lines = append(l.lines, line)
		return
	}
	l.lines[l.next] = line
	l.next = (l.next + 1) % logTailLines
	l.lost++
}

func (l *logTail) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	var b strings.Builder
	if l.lost > 0 {
		fmt.Fprintf(&b, "(%d earlier lines not kept)\n", l.lost)
	}
	for i := range l.lines {
		b.WriteString(l.lines[(l.next+i)%len(l.lines)])
		b.WriteByte('\n')
	}
	return b.String()
}

// logger is the agents' logger, writing into l.
func (l *logTail) logger() logr.Logger {
	return funcr.New(func(prefix, args string) { l.add(prefix + " " + args) }, funcr.Options{Verbosity: 1, LogTimestamp: true})
}

// keepLogs has a failing test print what the agents logged, and each
// engine's counters at its end (retransmissions, malformed and stale
// messages, credit stalls: what a lost or cut-short stream leaves).
func (h *harness) keepLogs(t *testing.T, l *logTail) {
	t.Cleanup(func() {
		if !t.Failed() {
			return
		}
		for _, n := range h.cl.Nodes {
			e := n.Agent.Engine()
			t.Logf("%s's engine at the failure: %+v; refused by reason: %v", n.Name, e.Stats(), e.RejectStats())
		}
		t.Logf("the agents' log:\n%s", l.String())
	})
}
