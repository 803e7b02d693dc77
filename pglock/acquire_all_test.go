package pglock_test

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/dlockio/dlock/driver"
	"github.com/dlockio/dlock/drivertest"
	"github.com/dlockio/dlock/internal/testserver"
	"github.com/dlockio/dlock/pglock"
)

// TestAcquireAll runs the AcquireAll cases the conformance suite cannot reach, on
// one server.
func TestAcquireAll(t *testing.T) {
	srv := testserver.StartPostgres(t)
	t.Run("ExpiredRows", func(t *testing.T) { testAcquireAllExpired(t, srv) })
	t.Run("Semaphore", func(t *testing.T) { testAcquireAllSemaphore(t, srv) })
	t.Run("Race", func(t *testing.T) { testAcquireAllRace(t, srv) })
}

func set(owner string, ttl time.Duration, keys ...string) []driver.Request {
	reqs := make([]driver.Request, len(keys))
	for i, k := range keys {
		reqs[i] = driver.Request{Key: k, Owner: owner, TTL: ttl}
	}
	return reqs
}

// Rows of expired grants are taken with new tokens (and notify the keys' watches),
// past a lapsed place (its client gone) but not past a live one.
func testAcquireAllExpired(t *testing.T, srv *testserver.Postgres) {
	ctx, cancel := context.WithTimeout(context.Background(), drivertest.Wait)
	defer cancel()
	pool := admin(t, srv)
	h := harness(t, srv)
	be, wb := h.Open(t).(*pglock.Backend), h.Open(t).(*pglock.Backend)
	defer be.Close()
	defer wb.Close()
	a, b, c, d := drivertest.Key(t, "a"), drivertest.Key(t, "b"), drivertest.Key(t, "c"), drivertest.Key(t, "d")
	var old []uint64
	for _, k := range []string{a, b, c} {
		g, err := be.Acquire(ctx, driver.Request{Key: k, Owner: "x", TTL: time.Minute})
		if err != nil {
			t.Fatal(err)
		}
		old = append(old, g.Token)
		h.Expire(t, k)
	}
	// A place on b whose client is gone (no one holds its channel's advisory lock)
	// and whose expiry passed: lapsed. One on c that has not expired: live.
	place := func(key string, n int, expires string) {
		exec(t, pool, `INSERT INTO `+pglock.DefaultTable+` (key, owner, token, expires_at, queue_channel)
			VALUES ($1 || chr(2) || lpad($2::int::text, 20, '0'), 'ghost', 1000000, now() + $3::interval, ARRAY['dlock_0123456789abcdef'])`, key, n, expires)
		exec(t, pool, `UPDATE `+pglock.DefaultTable+` SET queue_owner = '{+}' WHERE key = $1`, key)
	}
	place(b, 1, "-1 second")
	place(c, 2, "1 minute")
	w, err := wb.WatchHolder(ctx, a) // a row taken
	if err != nil {
		t.Fatal(err)
	}
	defer w.Stop()
	wd, err := wb.WatchHolder(ctx, d) // a row inserted
	if err != nil {
		t.Fatal(err)
	}
	defer wd.Stop()
	if _, err := be.AcquireAll(ctx, set("y", time.Minute, a, b, c)); !errors.Is(err, driver.ErrLocked) || !strings.Contains(err.Error(), c) {
		t.Fatalf("AcquireAll with a live place on %q: %v, want ErrLocked naming it", c, err)
	}
	quiet(t, w.C(), "a refused AcquireAll")
	quiet(t, wd.C(), "a refused AcquireAll")
	gs, err := be.AcquireAll(ctx, set("y", time.Minute, a, b, d))
	if err != nil {
		t.Fatalf("AcquireAll of expired rows, one with a lapsed place: %v", err)
	}
	recv(t, w.C(), "an AcquireAll that took the key")
	recv(t, wd.C(), "an AcquireAll that inserted the key")
	for i, k := range []string{a, b} {
		if gs[i].Token <= old[i] {
			t.Fatalf("token of %q: %d, not above the expired grant's %d", k, gs[i].Token, old[i])
		}
	}
	for i, k := range []string{a, b, d} {
		info, err := be.Inspect(ctx, k)
		if err != nil || info.Owner != "y" || info.Token != gs[i].Token {
			t.Fatalf("Inspect(%q) = %+v, %v; want owner y, token %d", k, info, err, gs[i].Token)
		}
		if err := be.Release(ctx, k, "y"); err != nil {
			t.Fatalf("Release(%q): %v", k, err)
		}
	}
	exec(t, pool, `DELETE FROM `+pglock.DefaultTable+` WHERE key >= $1 AND key < $1 || chr(3)`, c)
}

// A semaphore's key in the set is a limit mismatch, as it is for Acquire, and
// nothing is taken.
func testAcquireAllSemaphore(t *testing.T, srv *testserver.Postgres) {
	ctx, cancel := context.WithTimeout(context.Background(), drivertest.Wait)
	defer cancel()
	be := harness(t, srv).Open(t).(*pglock.Backend)
	defer be.Close()
	a, s := drivertest.Key(t, "a"), drivertest.Key(t, "s")
	if _, err := be.Acquire(ctx, driver.Request{Key: s, Owner: "x", TTL: time.Minute, Limit: 3}); err != nil {
		t.Fatal(err)
	}
	if _, err := be.AcquireAll(ctx, set("y", time.Minute, a, s)); !errors.Is(err, driver.ErrLimitMismatch) || !strings.Contains(err.Error(), s) {
		t.Fatalf("AcquireAll with a semaphore's key: %v, want ErrLimitMismatch naming it", err)
	}
	if _, err := be.Inspect(ctx, a); !errors.Is(err, driver.ErrNotHeld) {
		t.Fatalf("Inspect(%q) after a refused AcquireAll: %v, want ErrNotHeld", a, err)
	}
	if err := be.Release(ctx, s, "x"); err != nil {
		t.Fatal(err)
	}
}

// Sets that overlap, taken by many clients at once beside single Acquires, never
// grant a key twice: rows inserted or taken meanwhile make the batch fail
// (unique_violation, deadlock_detected) and run again.
func testAcquireAllRace(t *testing.T, srv *testserver.Postgres) {
	ctx, cancel := context.WithTimeout(context.Background(), drivertest.Wait)
	defer cancel()
	h := harness(t, srv)
	keys := make([]string, 5)
	for i := range keys {
		keys[i] = drivertest.Key(t, fmt.Sprint(i))
	}
	var mu sync.Mutex
	holder := map[string]string{}
	take := func(owner string, ks ...string) {
		mu.Lock()
		defer mu.Unlock()
		for _, k := range ks {
			if o, ok := holder[k]; ok {
				t.Errorf("%q granted to %s while %s holds it", k, owner, o)
			}
			holder[k] = owner
		}
	}
	give := func(ks ...string) {
		mu.Lock()
		defer mu.Unlock()
		for _, k := range ks {
			delete(holder, k)
		}
	}
	var wg sync.WaitGroup
	var granted sync.Map
	for w := range 6 {
		be := h.Open(t).(*pglock.Backend)
		defer be.Close()
		wg.Go(func() {
			for i := range 40 {
				owner := fmt.Sprintf("w%d-%d", w, i)
				lo := rand.IntN(len(keys) - 1)
				ks := keys[lo : lo+1+rand.IntN(len(keys)-lo)]
				var err error
				if len(ks) == 1 {
					_, err = be.Acquire(ctx, driver.Request{Key: ks[0], Owner: owner, TTL: time.Minute})
				} else {
					_, err = be.AcquireAll(ctx, set(owner, time.Minute, ks...))
				}
				if errors.Is(err, driver.ErrLocked) {
					continue
				}
				if err != nil {
					t.Errorf("%s: %v", owner, err)
					return
				}
				granted.Store(len(ks), true)
				take(owner, ks...)
				time.Sleep(time.Millisecond)
				give(ks...)
				for _, k := range ks {
					if err := be.Release(ctx, k, owner); err != nil {
						t.Errorf("Release(%q, %s): %v", k, owner, err)
					}
				}
			}
		})
	}
	wg.Wait()
	if _, ok := granted.Load(2); !ok {
		t.Error("no set of two keys was ever granted")
	}
}
