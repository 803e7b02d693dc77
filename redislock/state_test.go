package redislock_test

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/dlockio/dlock"
	"github.com/dlockio/dlock/driver"
	"github.com/dlockio/dlock/internal/testserver"
	"github.com/dlockio/dlock/redislock"
)

// cycleDistinct locks and releases n distinct keys once each on b (kind: "mutex",
// "value" for a mutex with a value, "sem" for a permit of a semaphore of 3,
// "reader" for a read-write lock's reader), 8 at a time.
func cycleDistinct(t testing.TB, b *redislock.Backend, n int, kind string, ttl time.Duration) {
	t.Helper()
	ctx := context.Background()
	var wg sync.WaitGroup
	errs := make(chan error, 8)
	for w := range 8 {
		wg.Go(func() {
			for i := w; i < n; i += 8 {
				req := driver.Request{Key: fmt.Sprintf("order:%s:%d", kind, i), Owner: "o" + strconv.Itoa(i), TTL: ttl}
				switch kind {
				case "value":
					req.Value = []byte("v")
				case "sem":
					req.Limit = 3
				case "reader":
					req.Shared = true
				}
				if _, err := b.Acquire(ctx, req); err != nil {
					errs <- err
					return
				}
				if err := b.Release(ctx, req.Key, req.Owner); err != nil {
					errs <- err
					return
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
}

// serverState returns the server's key count and used_memory.
func serverState(t testing.TB, rdb *redis.Client) (keys, mem int64) {
	t.Helper()
	ctx := context.Background()
	keys, err := rdb.DBSize(ctx).Result()
	if err != nil {
		t.Fatal(err)
	}
	info, err := rdb.Info(ctx, "memory").Result()
	if err != nil {
		t.Fatal(err)
	}
	for line := range strings.Lines(info) {
		if v, ok := strings.CutPrefix(strings.TrimSpace(line), "used_memory:"); ok {
			mem, _ = strconv.ParseInt(v, 10, 64)
		}
	}
	return keys, mem
}

// waitKeys waits until the server has at most max keys, and returns the count and
// used_memory then; it fails the test if that takes more than 30s.
func waitKeys(t testing.TB, rdb *redis.Client, max int64) (keys, mem int64) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		keys, mem = serverState(t, rdb)
		if keys <= max {
			return keys, mem
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d keys left on the server after 30s, want at most %d", keys, max)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// stateBounded locks and releases the given numbers of distinct keys of each kind
// with a short retention, while a few locks stay held, and checks that the server
// then keeps at most a constant plus the live locks' keys.
func stateBounded(t *testing.T, kinds map[string]int) {
	redislock.SetTokenRetention(t, 100*time.Millisecond)
	srv := testserver.StartRedis(t)
	rdb := rawClient(t, srv)
	b := open(t, srv.URL())
	defer b.Close()
	ctx := context.Background()
	// Live locks: mutexes (one with a value), a semaphore's permit, a reader.
	live := []driver.Request{
		{Key: "live:1", Owner: "l1", TTL: time.Minute},
		{Key: "live:2", Owner: "l2", TTL: time.Minute, Value: []byte("x")},
		{Key: "live:3", Owner: "l3", TTL: time.Minute, Limit: 3},
		{Key: "live:4", Owner: "l4", TTL: time.Minute, Shared: true},
	}
	for _, req := range live {
		if _, err := b.Acquire(ctx, req); err != nil {
			t.Fatal(err)
		}
	}
	k0, m0 := serverState(t, rdb)
	n := 0
	start := time.Now()
	for kind, k := range kinds {
		if kind == "contended" {
			n += k
			continue
		}
		cycleDistinct(t, b, k, kind, 5*time.Second)
		n += k
	}
	if kinds["contended"] > 0 {
		contend(t, srv.URL(), kinds["contended"])
	}
	k1, m1 := serverState(t, rdb)
	took := time.Since(start)
	// Each live lock has at most its lock, token and value keys; a few keys more
	// are allowed for whatever the server keeps of its own.
	max := int64(3*len(live) + 4)
	k2, m2 := waitKeys(t, rdb, max)
	waited := time.Since(start) - took
	t.Logf("%d distinct keys locked once in %v: keys %d before, %d right after, %d once the retention passed (%v later); used_memory %d, %d, %d",
		n, took, k0, k1, k2, waited, m0, m1, m2)
	// The live locks are still held, each with its token.
	for _, req := range live {
		if err := b.Refresh(ctx, req.Key, req.Owner, time.Minute); err != nil {
			t.Fatalf("refresh %s: %v", req.Key, err)
		}
	}
}

// contend has three clients lock and release each of n distinct keys twice at
// once, so that they queue and hand the keys over (queue and waiter keys).
func contend(t *testing.T, rawURL string, n int) {
	t.Helper()
	ctx := context.Background()
	var wg sync.WaitGroup
	errs := make(chan error, 3)
	for range 3 {
		c, err := dlock.Open(ctx, rawURL)
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		wg.Go(func() {
			for i := range n {
				for range 2 {
					l, err := c.Lock(ctx, "busy:"+strconv.Itoa(i), dlock.WithTTL(5*time.Second))
					if err != nil {
						errs <- err
						return
					}
					if err := l.Release(ctx); err != nil {
						errs <- err
						return
					}
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
}

func TestStateBounded(t *testing.T) {
	stateBounded(t, map[string]int{"mutex": 4000, "value": 2000, "sem": 2000, "reader": 2000, "contended": 300})
}

// TestStateBounded100k is TestStateBounded for 100,000 mutexes (about 15s).
func TestStateBounded100k(t *testing.T) {
	if testing.Short() {
		t.Skip("100,000 keys: skipped with -short")
	}
	stateBounded(t, map[string]int{"mutex": 100_000})
}

// waitGone waits until key no longer exists on the server (at most 10s).
func waitGone(t testing.TB, rdb *redis.Client, key string) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for rdb.Exists(context.Background(), key).Val() != 0 {
		if time.Now().After(deadline) {
			t.Fatalf("%q still exists after 10s (PTTL %v)", key, rdb.PTTL(context.Background(), key).Val())
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// A released key's token counter expires after the lease and the retention, and
// the next grant's token is still larger than every earlier one: from the clock
// term, and, when the counter had run ahead of the clock, because the counter
// lives until the clock has passed it.
func TestTokenAfterStateExpires(t *testing.T) {
	const retain, ttl = 100 * time.Millisecond, 200 * time.Millisecond
	redislock.SetTokenRetention(t, retain)
	srv := testserver.StartRedis(t)
	rdb := rawClient(t, srv)
	b := open(t, srv.URL())
	defer b.Close()
	ctx := context.Background()
	for _, kind := range []string{"mutex", "value", "sem", "reader"} {
		t.Run(kind, func(t *testing.T) {
			req := driver.Request{Key: "k-" + kind, Owner: "o", TTL: ttl}
			switch kind {
			case "value":
				req.Value = []byte("v")
			case "sem":
				req.Limit = 3
			case "reader":
				req.Shared = true
			}
			tk := b.TokenKey(req.Key)
			cycle := func() uint64 {
				t.Helper()
				g, err := b.Acquire(ctx, req)
				if err != nil {
					t.Fatal(err)
				}
				if err := b.Release(ctx, req.Key, req.Owner); err != nil {
					t.Fatal(err)
				}
				return g.Token
			}
			first := cycle()
			if pttl := rdb.PTTL(ctx, tk).Val(); pttl <= 0 || pttl > ttl+retain {
				t.Fatalf("token counter PTTL %v after a grant, want in (0, %v]", pttl, ttl+retain)
			}
			waitGone(t, rdb, tk)
			second := cycle()
			if second <= first {
				t.Fatalf("token after the counter expired %d, not above %d", second, first)
			}

			// A counter 2s ahead of the clock (set back, say): it lives until the
			// clock has passed it, however short the retention.
			now, err := rdb.Time(ctx).Result()
			if err != nil {
				t.Fatal(err)
			}
			ahead := uint64(now.Add(2*time.Second).UnixMilli()) * 1000
			if err := rdb.Set(ctx, tk, strconv.FormatUint(ahead, 10), 0).Err(); err != nil {
				t.Fatal(err)
			}
			third := cycle()
			if third != ahead+1 {
				t.Fatalf("token with the counter ahead of the clock %d, want %d", third, ahead+1)
			}
			if pttl := rdb.PTTL(ctx, tk).Val(); pttl < 2*time.Second {
				t.Fatalf("counter ahead of the clock by 2s expires in %v", pttl)
			}
			time.Sleep(ttl + 2*retain)
			if got, err := rdb.Get(ctx, tk).Uint64(); err != nil || got != third {
				t.Fatalf("counter ahead of the clock after the retention: %d, %v; want %d", got, err, third)
			}
			waitGone(t, rdb, tk)
			if fourth := cycle(); fourth <= third {
				t.Fatalf("token after a counter ahead of the clock expired %d, not above %d", fourth, third)
			}
		})
	}
}

// A mutex's counter lives as long as its lease, however often the lease is
// renewed or re-entered: re-entry and Inspect read the token there.
func TestTokenCounterFollowsLease(t *testing.T) {
	const retain, ttl = 100 * time.Millisecond, 200 * time.Millisecond
	redislock.SetTokenRetention(t, retain)
	srv := testserver.StartRedis(t)
	rdb := rawClient(t, srv)
	b := open(t, srv.URL())
	defer b.Close()
	ctx := context.Background()
	for _, val := range [][]byte{nil, []byte("v")} {
		req := driver.Request{Key: "k" + string(val), Owner: "o", TTL: ttl, Value: val}
		g, err := b.Acquire(ctx, req)
		if err != nil {
			t.Fatal(err)
		}
		for range 4 {
			if err := b.Refresh(ctx, req.Key, req.Owner, 4*ttl); err != nil {
				t.Fatal(err)
			}
			time.Sleep(2 * ttl)
		}
		if lk, tk := rdb.PTTL(ctx, b.LockKey(req.Key)).Val(), rdb.PTTL(ctx, b.TokenKey(req.Key)).Val(); tk < lk+retain/2 {
			t.Fatalf("token counter PTTL %v, lock PTTL %v: the counter would not outlive the lease by the retention", tk, lk)
		}
		info, err := b.Inspect(ctx, req.Key)
		if err != nil || info.Token != g.Token {
			t.Fatalf("Inspect: %+v, %v; want token %d", info, err, g.Token)
		}
		// Re-entry with a long lease pushes the counter out too.
		req.Reenter, req.TTL = true, 2*time.Second
		g2, err := b.Acquire(ctx, req)
		if err != nil || g2.Token != g.Token {
			t.Fatalf("re-entry: %+v, %v; want token %d", g2, err, g.Token)
		}
		if tk := rdb.PTTL(ctx, b.TokenKey(req.Key)).Val(); tk < 2*time.Second {
			t.Fatalf("token counter PTTL %v after a re-entry for 2s", tk)
		}
		if err := b.Release(ctx, req.Key, req.Owner); err != nil {
			t.Fatal(err)
		}
	}
}

// With the default retention, a grant's counter expires TokenRetention after its lease.
func TestTokenCounterDefaultRetention(t *testing.T) {
	rdb, c := serverAndClient(t)
	ctx := context.Background()
	l, err := c.Lock(ctx, "k", dlock.WithTTL(10*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	defer l.Release(ctx)
	tk := c.Backend().(*redislock.Backend).TokenKey("k")
	if pttl := rdb.PTTL(ctx, tk).Val(); pttl <= redislock.TokenRetention || pttl > redislock.TokenRetention+10*time.Second {
		t.Fatalf("token counter PTTL %v, want in (%v, %v]", pttl, redislock.TokenRetention, redislock.TokenRetention+10*time.Second)
	}
}
