//go:build race

package drivertest

// raceEnabled: the race detector is on (see ManyWaitersCount).
const raceEnabled = true
