// Package poll is the tests' wait for something that happens in the
// background: a condition polled until it holds, or the test fails after a
// timeout the caller gives. It is for tests only (it takes a testing.TB);
// no shipped binary imports it.
package poll

import (
	"testing"
	"time"
)

// Interval is how long a poll sleeps between two checks.
const Interval = 20 * time.Millisecond

// Until checks cond every Interval until it holds, and fails t if it
// still does not after timeout, naming what it waited for.
func Until(t testing.TB, timeout time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("%s: not within %v", what, timeout)
			return
		}
		time.Sleep(Interval)
	}
}

// UntilNil is Until for a check that says why it does not hold yet: it
// polls check until it returns nil, and fails t with the last error after
// timeout.
func UntilNil(t testing.TB, timeout time.Duration, what string, check func() error) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		err := check()
		if err == nil {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: not within %v: %v", what, timeout, err)
			return
		}
		time.Sleep(Interval)
	}
}
