package dlock_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/dlockio/dlock"
	"github.com/dlockio/dlock/clock"
	"github.com/dlockio/dlock/memlock"
)

// FuzzOptions gives the options fuzzed values: a client is made or the error is
// ErrInvalid, never a panic; a client made takes a lock with a key that passes
// validation, and refuses one that does not with ErrInvalid.
func FuzzOptions(f *testing.F) {
	f.Add(int64(10*time.Second), int64(3*time.Second), 0.01, int64(2*time.Millisecond), int64(50*time.Millisecond), int64(time.Second), "owner-1", "k")
	f.Add(int64(time.Millisecond), int64(0), 0.99, int64(0), int64(0), int64(0), "", "a\x00b")
	f.Add(int64(-1), int64(-1), -0.5, int64(-1), int64(-1), int64(-1), "bad owner", "")
	f.Add(int64(1<<62), int64(1<<62), 1e308, int64(1<<62), int64(1<<62), int64(1<<62), "o", "\xff")
	f.Fuzz(func(t *testing.T, ttl, renew int64, drift float64, fixed, rmin, rmax int64, owner, key string) {
		clk := clock.NewFake(time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)) // nothing expires while it runs
		opts := []dlock.Option{dlock.WithClock(clk), dlock.WithTTL(time.Duration(ttl)), dlock.WithDrift(drift, time.Duration(fixed)),
			dlock.WithRetry(time.Duration(rmin), time.Duration(rmax))}
		if renew != 0 {
			opts = append(opts, dlock.WithRenewInterval(time.Duration(renew)))
		}
		if owner != "" {
			opts = append(opts, dlock.WithOwner(owner))
		}
		c, err := dlock.New(memlock.NewStore(clk).Backend(), opts...)
		if err != nil {
			if !errors.Is(err, dlock.ErrInvalid) {
				t.Fatalf("New = %v, not ErrInvalid", err)
			}
			return
		}
		defer c.Close()
		ctx := context.Background()
		l, err := c.TryLock(ctx, key)
		if err != nil {
			if !errors.Is(err, dlock.ErrInvalid) {
				t.Fatalf("TryLock(%q) = %v", key, err)
			}
			return
		}
		if l.TTL() <= 0 {
			t.Fatalf("TTL = %v", l.TTL())
		}
		if err := l.Release(ctx); err != nil {
			t.Fatalf("Release = %v", err)
		}
	})
}
