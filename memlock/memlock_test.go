package memlock_test

import (
	"context"
	"errors"
	"net/url"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/dlockio/dlock/clock"
	"github.com/dlockio/dlock/driver"
	"github.com/dlockio/dlock/drivertest"
	"github.com/dlockio/dlock/memlock"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func harness() drivertest.Harness {
	s := memlock.NewStore(clock.Real)
	return drivertest.Harness{
		Open:    func(testing.TB) driver.Backend { return s.Backend() },
		Expire:  func(_ testing.TB, key string) { s.Expire(key) },
		Fencing: true,
		FIFO:    true,
	}
}

func TestConformance(t *testing.T) { drivertest.Run(t, harness()) }

func BenchmarkCycle(b *testing.B)   { drivertest.BenchCycle(b, harness()) }
func BenchmarkHandoff(b *testing.B) { drivertest.BenchHandoff(b, harness()) }
func BenchmarkContended(b *testing.B) {
	for _, w := range []int{2, 16} {
		drivertest.BenchContended(b, harness(), w)
	}
}

// Open and New have the shape of every backend's: options after the URL or the
// store, a bad option an error matching ErrInvalid.
func TestOpenNew(t *testing.T) {
	ctx := context.Background()
	fake := clock.NewFake(time.Unix(0, 0))
	u := &url.URL{Scheme: memlock.Scheme, Host: "opennew"}
	a, err := memlock.Open(ctx, u, memlock.WithClock(fake))
	if err != nil {
		t.Fatal(err)
	}
	b, err := memlock.Open(ctx, u, memlock.WithClock(fake))
	if err != nil {
		t.Fatalf("Open of the same store with the same clock: %v", err)
	}
	if a.Store() != b.Store() {
		t.Fatal("two Opens of one name have different stores")
	}
	if _, err := memlock.Open(ctx, u, memlock.WithClock(clock.Real)); !errors.Is(err, driver.ErrInvalid) {
		t.Fatalf("Open with another clock: %v, want ErrInvalid", err)
	}
	if _, err := memlock.Open(ctx, &url.URL{Scheme: "redis", Host: "x"}); !errors.Is(err, driver.ErrInvalid) {
		t.Fatalf("Open of another scheme: %v, want ErrInvalid", err)
	}
	s := memlock.NewStore(fake)
	n, err := memlock.New(ctx, s)
	if err != nil || n.Store() != s {
		t.Fatalf("New: %v", err)
	}
	for _, opts := range [][]memlock.Option{{nil}, {memlock.WithClock(nil)}, {memlock.WithClock(fake)}} {
		if _, err := memlock.New(ctx, s, opts...); !errors.Is(err, driver.ErrInvalid) {
			t.Fatalf("New with a bad option: %v, want ErrInvalid", err)
		}
	}
	if _, err := memlock.New(ctx, nil); !errors.Is(err, driver.ErrInvalid) {
		t.Fatalf("New(nil): %v, want ErrInvalid", err)
	}
	for _, bk := range []*memlock.Backend{a, b, n} {
		if err := bk.Close(); err != nil {
			t.Fatal(err)
		}
	}
}

// BenchmarkSemaphore: acquisitions/s of a semaphore of 4 permits and of a mutex,
// with 1, 4, 16 and 64 workers.
func BenchmarkSemaphore(b *testing.B) {
	for _, w := range []int{1, 4, 16, 64} {
		for _, limit := range []int{1, 4} {
			drivertest.BenchSemaphore(b, harness(), limit, w)
		}
	}
}

// BenchmarkMultiKey: a set of 2, 4 and 8 keys taken in one step beside one lock per
// key.
func BenchmarkMultiKey(b *testing.B) {
	for _, n := range []int{2, 4, 8} {
		drivertest.BenchMultiKey(b, harness(), n)
	}
}
