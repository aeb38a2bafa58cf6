package device

import (
	"context"
	"time"

	"github.com/rdmavisor/rdmavisor/internal/config"
	"github.com/rdmavisor/rdmavisor/internal/verbs"
)

// Backoff is how long Wait waits between tries: Min after the first
// failure, doubling up to Max.
type Backoff struct{ Min, Max time.Duration }

// DefaultBackoff retries within a second at first, then once a minute: a
// device that comes up later (a driver loaded, a link brought up) is found
// within a minute, and a wrong configuration costs a log line a minute.
var DefaultBackoff = Backoff{Min: time.Second, Max: time.Minute}

// Wait opens the device with open until it opens or ctx ends, waiting
// between tries as b says. Each failure goes to failed, with the wait
// before the next try, so the caller logs it and reports it (the agent's
// RDMANode says why it is not ready) rather than exiting into a crash
// loop that says nothing. It returns ctx's error when ctx ends first.
func Wait(ctx context.Context, cfg *config.AgentConfig, open func(*config.AgentConfig) (verbs.Device, error), b Backoff, failed func(err error, retry time.Duration)) (verbs.Device, error) {
	if b.Min <= 0 {
		b = DefaultBackoff
	}
	wait := b.Min
	for {
		dev, err := open(cfg)
		if err == nil {
			return dev, nil
		}
		failed(err, wait)
		t := time.NewTimer(wait)
		select {
		case <-ctx.Done():
			t.Stop()
			return nil, ctx.Err()
		case <-t.C:
		}
		wait = min(2*wait, max(b.Max, b.Min))
	}
}
