package mysqllock_test

import (
	"context"
	"errors"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/dlockio/dlock"
	"github.com/dlockio/dlock/internal/testserver"
)

// Readers and writers (whose key readers keep converting from a mutex's) and a
// semaphore's holders, under waits of moderate length: a writer never beside
// anyone, never more permits than the limit, nothing left at the end.
func testStress(t *testing.T, srv *testserver.MariaDB) {
	var readers, writers, permits, grants atomic.Int64
	var wg sync.WaitGroup
	end := time.Now().Add(3 * time.Second)
	for i := range 6 {
		c, err := dlock.New(open(t, srv.URL()), dlock.WithTTL(3*time.Second))
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		wg.Go(func() {
			for time.Now().Before(end) {
				key, opts, count := "stress", []dlock.Option(nil), &writers
				switch {
				case i == 5:
					key, opts, count = "stress-sem", []dlock.Option{dlock.WithLimit(2)}, &permits
				case i < 2 || rand.IntN(2) == 0:
					opts, count = []dlock.Option{dlock.WithShared()}, &readers
				}
				ctx, cancel := context.WithTimeout(context.Background(), time.Duration(100+rand.IntN(400))*time.Millisecond)
				l, err := c.Lock(ctx, key, opts...)
				cancel()
				if err != nil {
					if !errors.Is(err, dlock.ErrLocked) && !errors.Is(err, context.DeadlineExceeded) {
						t.Errorf("Lock: %v", err)
					}
					continue
				}
				grants.Add(1)
				n := count.Add(1)
				if count == &readers && writers.Load() != 0 {
					t.Error("a reader beside a writer")
				}
				if count == &permits && n > 2 {
					t.Errorf("%d permits of 2", n)
				}
				if count == &writers && (n != 1 || readers.Load() != 0) {
					t.Error("a writer beside others")
				}
				time.Sleep(time.Duration(rand.IntN(10)) * time.Millisecond)
				count.Add(-1)
				if err := l.Release(context.Background()); err != nil {
					t.Errorf("Release: %v", err)
				}
			}
		})
	}
	wg.Wait()
	b := open(t, srv.URL())
	defer b.Close()
	ctx := semCtx(t)
	t.Logf("%d grants", grants.Load())
	for _, k := range []string{"stress", "stress-sem"} {
		places, err := b.Queue(ctx, k)
		_, hs, err2 := b.Holders(ctx, k)
		if err != nil || err2 != nil || len(places) != 0 || len(hs) != 0 {
			t.Errorf("%s left: %+v (%v), %+v (%v)", k, places, err, hs, err2)
		}
	}
}
