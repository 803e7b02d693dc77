package pglock

import "time"

// Contended reports whether b's next waiting Lock of key skips the plain INSERT
// (see contended).
func (b *Backend) Contended(key string) bool { return b.contended(key) }

// SetContendedFor sets contendedFor for the test and returns a function that puts
// it back.
func SetContendedFor(d time.Duration) (restore func()) {
	old := contendedFor
	contendedFor = d
	return func() { contendedFor = old }
}
