package poll

import (
	"errors"
	"fmt"
	"testing"
	"time"
)

// tb records a failure instead of ending the test.
type tb struct {
	testing.TB
	failed string
}

func (t *tb) Helper() {}

func (t *tb) Fatalf(format string, args ...any) { t.failed = fmt.Sprintf(format, args...) }

func TestUntil(t *testing.T) {
	n := 0
	rec := &tb{TB: t}
	Until(rec, time.Second, "the third check", func() bool { n++; return n == 3 })
	if rec.failed != "" || n != 3 {
		t.Errorf("held at the third check: failed %q after %d checks", rec.failed, n)
	}
	Until(rec, 50*time.Millisecond, "never", func() bool { return false })
	if rec.failed != "never: not within 50ms" {
		t.Errorf("never held: failed %q", rec.failed)
	}
}

func TestUntilNil(t *testing.T) {
	rec := &tb{TB: t}
	n := 0
	UntilNil(rec, time.Second, "the second check", func() error {
		if n++; n < 2 {
			return errors.New("not yet")
		}
		return nil
	})
	if rec.failed != "" || n != 2 {
		t.Errorf("nil at the second check: failed %q after %d checks", rec.failed, n)
	}
	UntilNil(rec, 50*time.Millisecond, "never", func() error { return errors.New("still not") })
	if rec.failed != "never: not within 50ms: still not" {
		t.Errorf("never nil: failed %q", rec.failed)
	}
}
