package mysqllock_test

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/dlockio/dlock/driver"
	"github.com/dlockio/dlock/drivertest"
	"github.com/dlockio/dlock/internal/testserver"
	"github.com/dlockio/dlock/mysqllock"
)

// TestKilledFullPool: calls cut short together while they hold every connection of
// the pool return at once. The KILL QUERY of each needs a connection of the pool;
// a call must not keep its own while it waits for its KILL (which would then wait
// for a free connection, up to its bound, while every call waits for its KILL).
func TestKilledFullPool(t *testing.T) {
	srv := testserver.StartMariaDB(t)
	db := admin(t, srv)
	b := open(t, withQuery(srv.URL(), "max_conns", "3"))
	defer b.Close()
	ctx, cancel := context.WithTimeout(context.Background(), drivertest.Wait)
	defer cancel()
	key := drivertest.Key(t, "k")
	sem := func(ctx context.Context, owner string) error {
		_, err := b.Acquire(ctx, driver.Request{Key: key, Owner: owner, TTL: 10 * time.Second, Limit: 5})
		return err
	}
	if err := sem(ctx, "first"); err != nil { // the key's row exists
		t.Fatal(err)
	}
	if err := b.Release(ctx, key, "first"); err != nil {
		t.Fatal(err)
	}
	// Another session holds the key's row.
	tx, err := db.BeginTx(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback()
	if _, err := tx.ExecContext(ctx, "SELECT token FROM `"+mysqllock.DefaultTable+"` WHERE lock_key = ? FOR UPDATE", key); err != nil {
		t.Fatal(err)
	}
	short, stop := context.WithTimeout(ctx, 300*time.Millisecond)
	defer stop()
	var wg sync.WaitGroup
	errs := make([]error, 3)
	took := make([]time.Duration, 3)
	for i := range errs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			start := time.Now()
			errs[i] = sem(short, "gone"+string(rune('a'+i)))
			took[i] = time.Since(start)
		}()
	}
	wg.Wait()
	for i, err := range errs {
		if !errors.Is(err, context.DeadlineExceeded) {
			t.Errorf("call %d cut short behind a held row: %v, want DeadlineExceeded", i, err)
		}
		if took[i] > 4*time.Second { // 5.3 s when each waits killWithin for a connection
			t.Errorf("call %d cut short after 300ms returned after %v", i, took[i].Round(time.Millisecond))
		}
	}
	if err := tx.Rollback(); err != nil {
		t.Fatal(err)
	}
	waitGone(ctx, t, db, "%`"+mysqllock.DefaultTable+"`%")
}
