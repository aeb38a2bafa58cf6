//go:build race

package shm

// raceEnabled: the race detector's instrumentation makes buffers passed
// to system calls escape, so allocation counts do not hold.
const raceEnabled = true
