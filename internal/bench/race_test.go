//go:build race

package bench

// raceEnabled: the race detector maps shadow memory for the heap outside
// the runtime's accounting, which shows as Mapped.
const raceEnabled = true
