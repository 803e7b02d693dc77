package dlock_test

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/dlockio/dlock"
	"github.com/dlockio/dlock/driver"
)

// nopBackend grants every attempt at once: with it, a benchmark measures what the
// core itself costs per lock cycle, which every backend's cycle pays on top of its
// round trips.
type nopBackend struct{ n atomic.Uint64 }

func (b *nopBackend) Acquire(context.Context, driver.Request) (driver.Grant, error) {
	return driver.Grant{Token: b.n.Add(1)}, nil
}
func (b *nopBackend) Refresh(context.Context, string, string, time.Duration) error { return nil }
func (b *nopBackend) Release(context.Context, string, string) error                { return nil }
func (b *nopBackend) Close() error                                                 { return nil }

// BenchmarkCoreCycle measures the core's own cost of an uncontended Lock+Release:
// owner id, bookkeeping, renewal scheduling and lease, without any server; with no
// observer, and with one that does nothing (what the events themselves cost).
func BenchmarkCoreCycle(b *testing.B) {
	for _, tc := range []struct {
		name string
		opts []dlock.Option
	}{
		{"observer=none", nil},
		{"observer=nop", []dlock.Option{dlock.WithObserver(dlock.ObserverFunc(func(context.Context, dlock.Event) {}))}},
	} {
		b.Run(tc.name, func(b *testing.B) {
			c, err := dlock.New(&nopBackend{}, tc.opts...)
			if err != nil {
				b.Fatal(err)
			}
			defer c.Close()
			ctx := context.Background()
			b.ReportAllocs()
			for b.Loop() {
				l, err := c.Lock(ctx, "key")
				if err != nil {
					b.Fatal(err)
				}
				if err := l.Release(ctx); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
