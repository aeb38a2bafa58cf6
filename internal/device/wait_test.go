package device

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/rdmavisor/rdmavisor/internal/config"
	"github.com/rdmavisor/rdmavisor/internal/verbs"
)

// ibv.Open's errors, as it words them, get the reason a condition shows.
func TestClassifyIBVerbs(t *testing.T) {
	for _, c := range []struct{ msg, want string }{
		{`ibv: no RDMA device matches names ["mlx5_9"], GUIDs [], vendors []; devices present: none (/sys/class/infiniband is empty or absent)`, ReasonNotFound},
		{"ibv: port 1 of rxe0 is DOWN, not ACTIVE (link down, or no netdev up under it)", ReasonPortDown},
		{"ibv: GID index 99 out of range: port 1 of rxe0 has 16 entries: invalid argument", ReasonInvalidGID},
		{"ibv: GID index 5 of port 1 of rxe0 is empty: invalid argument", ReasonInvalidGID},
		{"ibv: rxe0 has 1 port(s), not port 2: invalid argument", ReasonInvalidPort},
		{"ibv: open rxe0: permission denied", ReasonOpenFailed},
	} {
		err := classifyIBVerbs(errors.New(c.msg))
		if got := Reason(fmt.Errorf("agent: %w", err)); got != c.want {
			t.Errorf("%q: reason %s, want %s", c.msg, got, c.want)
		}
		if err.Error() != c.msg {
			t.Errorf("the message changed: %q", err)
		}
	}
	if got := Reason(errors.New("other")); got != ReasonOpenFailed {
		t.Errorf("an error of no class: %s", got)
	}
}

// Wait retries a device that does not open, with growing waits, reporting
// each failure, until it opens; or gives up when its context ends.
func TestWait(t *testing.T) {
	cfg := config.Default()
	dev := &struct{ verbs.Device }{} // only compared
	tries := 0
	open := func(*config.AgentConfig) (verbs.Device, error) {
		if tries++; tries < 4 {
			return nil, &OpenError{reason: ReasonPortDown, Err: fmt.Errorf("try %d: port down", tries)}
		}
		return dev, nil
	}
	var waits []time.Duration
	var reasons []string
	got, err := Wait(context.Background(), cfg, open, Backoff{Min: time.Millisecond, Max: 3 * time.Millisecond}, func(err error, retry time.Duration) {
		waits = append(waits, retry)
		reasons = append(reasons, Reason(err))
	})
	if err != nil || got != dev {
		t.Fatalf("Wait: %v, %v", got, err)
	}
	if want := []time.Duration{time.Millisecond, 2 * time.Millisecond, 3 * time.Millisecond}; fmt.Sprint(waits) != fmt.Sprint(want) {
		t.Errorf("waits %v, want %v", waits, want)
	}
	if fmt.Sprint(reasons) != fmt.Sprint([]string{ReasonPortDown, ReasonPortDown, ReasonPortDown}) {
		t.Errorf("reasons %v", reasons)
	}

	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Millisecond)
	defer cancel()
	never := func(*config.AgentConfig) (verbs.Device, error) { return nil, errors.New("no device") }
	n := 0
	if _, err := Wait(ctx, cfg, never, Backoff{Min: time.Millisecond, Max: 2 * time.Millisecond}, func(error, time.Duration) { n++ }); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Wait until the context ends: %v", err)
	}
	if n < 2 {
		t.Errorf("%d tries in 20 ms, want several", n)
	}
}
