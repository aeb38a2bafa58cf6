package agent

import (
	"context"
	"errors"
	"testing"
	"testing/synctest"
	"time"
)

// TestRateMessages: on the bubble's fake clock, a limiter of 100 messages
// a second lets a burst of 10 (a tenth of a second's worth) go at once,
// then one message every 10ms: 110 messages take exactly one second.
func TestRateMessages(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		r := newRateLimiter(100, 0)
		if b := rateBurst(100); b != 10 {
			t.Fatalf("burst of 100/s: %d, want 10", b)
		}
		ctx := context.Background()
		start := time.Now()
		for i := range 10 {
			if err := r.take(ctx, 1<<20); err != nil {
				t.Fatal(err)
			}
			if d := time.Since(start); d != 0 {
				t.Fatalf("message %d of the burst waited %v", i, d)
			}
		}
		if err := r.take(ctx, 1); err != nil {
			t.Fatal(err)
		}
		atT(t, start, 10*time.Millisecond) // the message past the burst
		for range 99 {
			if err := r.take(ctx, 1); err != nil {
				t.Fatal(err)
			}
		}
		atT(t, start, time.Second) // 110 messages at 100/s with a burst of 10
	})
}

// TestRateBytes: a byte rate of 1000/s holds 100 bytes; a message larger
// than that goes once the bucket is full and leaves it owing the rest,
// so the next waits for the debt too. The message rate is unlimited.
func TestRateBytes(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		r := newRateLimiter(0, 1000)
		ctx := context.Background()
		start := time.Now()
		for range 2 {
			if err := r.take(ctx, 50); err != nil {
				t.Fatal(err)
			}
		}
		if d := time.Since(start); d != 0 {
			t.Fatalf("100 bytes of burst waited %v", d)
		}
		if err := r.take(ctx, 500); err != nil {
			t.Fatal(err)
		}
		atT(t, start, 100*time.Millisecond) // a 500-byte message on an empty 100-byte bucket: until full
		if err := r.take(ctx, 1); err != nil {
			t.Fatal(err)
		}
		atT(t, start, 501*time.Millisecond) // the byte after it: the 400 owed and its own
	})
}

// TestRateBoth: with both rates, a message waits for the slower bucket:
// 10 messages a second (a burst of 1) and 100 bytes (a burst of 10), in
// messages of 20 bytes, then of 1.
func TestRateBoth(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		r := newRateLimiter(10, 100)
		ctx := context.Background()
		start := time.Now()
		for _, m := range []struct {
			n    int
			want time.Duration
		}{
			{20, 0},                      // the burst; owes 10 bytes
			{20, 200 * time.Millisecond}, // the bytes owed and a bucket's worth, not the 100ms of a message
			{1, 310 * time.Millisecond},  // the 10 bytes owed again and its own
			{1, 410 * time.Millisecond},  // now the message rate
		} {
			if err := r.take(ctx, m.n); err != nil {
				t.Fatal(err)
			}
			atT(t, start, m.want)
		}
	})
}

// atT fails unless the fake clock is want past start: within a
// microsecond, as a wait is rounded up to the nanosecond and the buckets
// are floating point.
func atT(t *testing.T, start time.Time, want time.Duration) {
	t.Helper()
	if d := time.Since(start); d < want || d > want+time.Microsecond {
		t.Fatalf("at %v, want %v", d, want)
	}
}

// TestRateCancel: a take waiting for tokens returns ctx's error when ctx
// ends, and takes none: the next take waits only for its own.
func TestRateCancel(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		r := newRateLimiter(1, 0) // one message a second
		_ = r.take(context.Background(), 1)
		ctx, cancel := context.WithCancel(context.Background())
		errc := make(chan error, 1)
		go func() { errc <- r.take(ctx, 1) }()
		time.Sleep(500 * time.Millisecond)
		synctest.Wait()
		select {
		case err := <-errc:
			t.Fatalf("take returned %v before its token", err)
		default:
		}
		cancel()
		if err := <-errc; !errors.Is(err, context.Canceled) {
			t.Fatalf("cancelled take: %v, want context.Canceled", err)
		}
		start := time.Now()
		_ = r.take(context.Background(), 1)
		atT(t, start, 500*time.Millisecond) // the rest of its own token: the cancelled one took none
	})
}

// TestRateUnlimited: no rates, no limiter, and a nil limiter never waits.
func TestRateUnlimited(t *testing.T) {
	var r *rateLimiter = newRateLimiter(0, 0)
	if r != nil {
		t.Fatalf("limiter %+v without rates, want nil", r)
	}
	if err := r.take(context.Background(), 1<<20); err != nil {
		t.Fatal(err)
	}
}

// TestRateTakeAllocs: a take that need not wait, and a nil limiter's,
// allocate nothing: forward calls one per message.
func TestRateTakeAllocs(t *testing.T) {
	ctx := context.Background()
	r := newRateLimiter(100_000_000, 1<<40) // never waits in this test
	var nilRate *rateLimiter
	if n := testing.AllocsPerRun(1000, func() {
		if err := r.take(ctx, 4096); err != nil {
			t.Fatal(err)
		}
		if err := nilRate.take(ctx, 4096); err != nil {
			t.Fatal(err)
		}
	}); n != 0 {
		t.Errorf("take allocates %v a message, want 0", n)
	}
}
