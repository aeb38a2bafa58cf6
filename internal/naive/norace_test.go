//go:build !race

package naive

const raceEnabled = false
