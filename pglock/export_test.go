package pglock

import (
	"context"
	"time"

	"github.com/dlockio/dlock/driver"
)

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

// Enqueue runs the statement a waiting Lock of a contended key tries first (see
// enqueue), with the request's TTL as the place's patience and no attempt number.
func (b *Backend) Enqueue(ctx context.Context, req driver.Request) (*driver.HeldError, error) {
	return b.enqueue(ctx, req, req.TTL, nil, 0)
}

// Listening reports whether b's listening goroutine was ever started (by a wait or
// a holder watch).
func (b *Backend) Listening() bool {
	b.lst.mu.Lock()
	defer b.lst.mu.Unlock()
	return b.lst.started
}
