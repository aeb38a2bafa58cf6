//go:build e2e

package e2e

import (
	"fmt"
	"strings"
	"testing"
)

// stepT is a step's *testing.T that remembers the step's failures, so
// that the suite can say them again after the state dump: the dump is
// long, and a log cut to its head and tail would hide them.
type stepT struct {
	*testing.T
	failures *[]string
}

func (s *stepT) record(msg string) {
	if s.failures != nil {
		*s.failures = append(*s.failures, msg)
	}
}

func (s *stepT) Fatalf(format string, args ...any) {
	s.T.Helper()
	s.record(fmt.Sprintf(format, args...))
	s.T.Fatalf(format, args...)
}

func (s *stepT) Fatal(args ...any) {
	s.T.Helper()
	s.record(fmt.Sprint(args...))
	s.T.Fatal(args...)
}

func (s *stepT) Errorf(format string, args ...any) {
	s.T.Helper()
	s.record(fmt.Sprintf(format, args...))
	s.T.Errorf(format, args...)
}

// step runs fn as the subtest name; if it fails, it dumps the cluster's
// state, repeats what failed, and ends the suite.
func (e *env) step(name string, fn func(*env)) {
	var failures []string
	if e.t.Run(name, func(t *testing.T) {
		sub := *e
		sub.t = &stepT{T: t, failures: &failures}
		fn(&sub)
	}) {
		return
	}
	e.dumpState()
	e.t.T.Fatalf("step %q failed (the cluster's state is above):\n%s", name, strings.Join(failures, "\n"))
}
