//go:build race

package naive

// raceEnabled: the race detector allocates on synchronisation, so
// allocation counts mean nothing under it.
const raceEnabled = true
