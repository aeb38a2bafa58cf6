package agent

import (
	"context"
	"math"
	"sync"
	"time"
)

// rateLimiter holds one allocation to its limits.messageRate and
// limits.byteRate: a token bucket each, consulted by forward before every
// message the allocation sends, on any of its vconns. A sender past the
// rate waits for tokens; it is slowed, never failed. Each allocation has
// its own, so no lock is shared across allocations; an allocation
// without rates has none (nil), and take costs nothing.
type rateLimiter struct {
	mu    sync.Mutex
	last  time.Time // of the last refill; guarded by mu
	msgs  bucket    // guarded by mu
	bytes bucket    // guarded by mu
}

// bucket is one rate's tokens. A bucket of rate 0 is unlimited.
type bucket struct {
	rate  float64 // tokens a second
	burst float64 // the most it holds: a tenth of a second's worth, at least 1
	level float64 // tokens held; below zero after a take larger than burst
}

// rateBurstPerSecond: a bucket holds a tenth of a second's worth of its
// rate, so a pod idle a while sends a short burst at full speed, and
// past it no faster than its rate over any tenth of a second.
const rateBurstPerSecond = 10

func newBucket(rate int64) bucket {
	if rate <= 0 {
		return bucket{}
	}
	burst := max(math.Ceil(float64(rate)/rateBurstPerSecond), 1)
	return bucket{rate: float64(rate), burst: burst, level: burst}
}

// rateBurst is the bucket size newRateLimiter gives a rate: what an idle
// allocation may send at once.
func rateBurst(rate int64) int64 { return int64(newBucket(rate).burst) }

// newRateLimiter is the limiter of an allocation with the given rates
// (0: unlimited); nil when both are unlimited.
func newRateLimiter(messageRate int, byteRate int64) *rateLimiter {
	if messageRate <= 0 && byteRate <= 0 {
		return nil
	}
	return &rateLimiter{last: time.Now(), msgs: newBucket(int64(messageRate)), bytes: newBucket(byteRate)}
}

// take waits until the allocation may send a message of n bytes, and
// counts it. The error is ctx's, if it ends first. It allocates nothing
// unless it waits.
func (r *rateLimiter) take(ctx context.Context, n int) error {
	if r == nil {
		return nil
	}
	for {
		wait := r.tryTake(n, time.Now())
		if wait <= 0 {
			return nil
		}
		t := time.NewTimer(wait)
		select {
		case <-t.C:
		case <-ctx.Done():
			t.Stop()
			return ctx.Err()
		}
	}
}

// owe counts n more bytes of a message take already counted, without
// waiting: the bucket may go below zero, and the next take waits.
func (r *rateLimiter) owe(n int) {
	if r == nil || n <= 0 {
		return
	}
	r.mu.Lock()
	r.bytes.spend(float64(n))
	r.mu.Unlock()
}

// tryTake counts a message of n bytes if both buckets have its tokens,
// else returns how long until they will (taking nothing meanwhile).
func (r *rateLimiter) tryTake(n int, now time.Time) time.Duration {
	r.mu.Lock()
	defer r.mu.Unlock()
	if dt := now.Sub(r.last).Seconds(); dt > 0 {
		r.last = now
		r.msgs.refill(dt)
		r.bytes.refill(dt)
	}
	if w := max(r.msgs.wait(1), r.bytes.wait(float64(n))); w > 0 {
		return w
	}
	r.msgs.spend(1)
	r.bytes.spend(float64(n))
	return 0
}

func (b *bucket) refill(seconds float64) {
	if b.rate > 0 {
		b.level = min(b.level+b.rate*seconds, b.burst)
	}
}

// wait is how long until the bucket holds n tokens, or all it can hold
// when n is more than that: a message larger than the burst goes once
// the bucket is full, and leaves it owing the rest.
func (b *bucket) wait(n float64) time.Duration {
	need := min(n, b.burst)
	if b.rate == 0 || b.level >= need {
		return 0
	}
	return max(time.Duration(math.Ceil((need-b.level)/b.rate*float64(time.Second))), 1)
}

func (b *bucket) spend(n float64) {
	if b.rate > 0 {
		b.level -= n
	}
}

// Each source's rate is its vconn's allocation's limiter, shared by all
// the allocation's vconns.
func (s *opSource) rate() *rateLimiter { return s.h.s.al.rate }
func (t shmTX) rate() *rateLimiter     { return t.x.h.s.al.rate }
func (t *bridgeTX) rate() *rateLimiter { return t.b.al.rate }
