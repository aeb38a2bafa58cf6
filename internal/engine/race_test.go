//go:build race

package engine

// raceEnabled: the race detector slows every goroutine down enough that
// timing-based expectations (no spurious retransmission) do not hold.
const raceEnabled = true
