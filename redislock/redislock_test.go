package redislock_test

import (
	"context"
	"errors"
	"net/url"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"go.uber.org/goleak"

	"github.com/dlockio/dlock"
	"github.com/dlockio/dlock/driver"
	"github.com/dlockio/dlock/drivertest"
	"github.com/dlockio/dlock/internal/measure"
	"github.com/dlockio/dlock/internal/storeops"
	_ "github.com/dlockio/dlock/internal/storeops/redisops" // the store the harness measures with
	"github.com/dlockio/dlock/internal/testserver"
	"github.com/dlockio/dlock/redislock"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func open(t testing.TB, rawURL string) *redislock.Backend {
	t.Helper()
	u, err := url.Parse(rawURL)
	if err != nil {
		t.Fatal(err)
	}
	b, err := redislock.Open(context.Background(), u)
	if err != nil {
		t.Fatalf("Open: %v", err)
	}
	return b
}

func rawClient(t testing.TB, srv *testserver.Redis) *redis.Client {
	rdb := redis.NewClient(&redis.Options{Addr: srv.Addr()})
	t.Cleanup(func() { rdb.Close() })
	return rdb
}

// serverAndClient starts a Redis server and returns a raw client to it and a dlock
// client on it, both closed when the test ends.
func serverAndClient(t *testing.T) (*redis.Client, *dlock.Client) {
	t.Helper()
	srv := testserver.StartRedis(t)
	c, err := dlock.Open(context.Background(), srv.URL())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return rawClient(t, srv), c
}

func harness(t testing.TB, srv *testserver.Redis) drivertest.Harness {
	rdb := rawClient(t, srv)
	keyer, err := redislock.New(context.Background(), rdb)
	if err != nil {
		t.Fatal(err)
	}
	ops, err := storeops.Open(context.Background(), srv.URL())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ops.Close() })
	return drivertest.Harness{
		Ops:   ops.Ops,
		Floor: ops.FloorCycle,
		Open:  func(t testing.TB) driver.Backend { return open(t, srv.URL()) },
		Expire: func(t testing.TB, key string) {
			if err := rdb.Del(context.Background(), keyer.LockKey(key)).Err(); err != nil {
				t.Fatal(err)
			}
		},
		Fencing:   true,
		FIFO:      true,
		RoundTrip: func(ctx context.Context) error { return rdb.Ping(ctx).Err() },
		Namespace: func(t testing.TB, ns string) (driver.Backend, error) {
			u, err := url.Parse(srv.URL())
			if err != nil {
				t.Fatal(err)
			}
			b, err := redislock.Open(context.Background(), u, redislock.WithPrefix(ns))
			if err != nil {
				return nil, err
			}
			return b, nil
		},
	}
}

func TestConformance(t *testing.T) {
	srv := testserver.StartRedis(t)
	drivertest.Run(t, harness(t, srv))
}

// Tokens keep rising after a restart that lost every key (no persistence).
func TestTokensRiseAcrossDataLoss(t *testing.T) {
	srv := testserver.StartRedis(t)
	ctx := context.Background()
	c, err := dlock.Open(ctx, srv.URL())
	if err != nil {
		t.Fatal(err)
	}
	l, err := c.Lock(ctx, "k")
	if err != nil {
		t.Fatal(err)
	}
	before := l.Token()
	c.Close()
	srv.Kill()
	if err := srv.Restart(); err != nil {
		t.Fatal(err)
	}
	c2, err := dlock.Open(ctx, srv.URL())
	if err != nil {
		t.Fatal(err)
	}
	defer c2.Close()
	l2, err := c2.Lock(ctx, "k")
	if err != nil {
		t.Fatal(err)
	}
	if l2.Token() <= before {
		t.Fatalf("token after data loss %d not above %d", l2.Token(), before)
	}
	_ = l2.Release(ctx)
}

// Tokens keep rising when the counter goes back without being lost, as on a promoted
// replica that had not received the last increments: a grant's token is above every
// token issued before (at least a millisecond before), whatever the counter says, and
// a counter ahead of the clock is still followed by one more.
func TestTokensRiseWhenCounterGoesBack(t *testing.T) {
	ctx := context.Background()
	rdb, c := serverAndClient(t)
	tk := c.Backend().(*redislock.Backend).TokenKey("k")
	if want := redislock.DefaultPrefix + ":lock\x1fk\x1ftoken"; tk != want {
		t.Fatalf("token key %q, want %q", tk, want)
	}
	token := func() dlock.Token {
		t.Helper()
		l, err := c.Lock(ctx, "k")
		if err != nil {
			t.Fatal(err)
		}
		if err := l.Release(ctx); err != nil {
			t.Fatal(err)
		}
		return l.Token()
	}
	first := token()
	second := token()
	if second <= first {
		t.Fatalf("second token %d not above first %d", second, first)
	}
	// The lagging replica's counter: the value it had before both grants.
	if err := rdb.Set(ctx, tk, strconv.FormatUint(uint64(first)-1000, 10), 0).Err(); err != nil {
		t.Fatal(err)
	}
	// A failover or a restart takes far longer than the clock term's millisecond.
	time.Sleep(2 * time.Millisecond)
	if third := token(); third <= second {
		t.Fatalf("token after the counter went back %d, not above %d issued before", third, second)
	}
	// A counter far ahead of the clock (a clock set back): still one more.
	ahead := uint64(second) + 1<<40
	if err := rdb.Set(ctx, tk, strconv.FormatUint(ahead, 10), 0).Err(); err != nil {
		t.Fatal(err)
	}
	if got := token(); uint64(got) != ahead+1 {
		t.Fatalf("token with the counter ahead of the clock = %d, want %d", got, ahead+1)
	}
}

// Plain attempts with many TTLs: the key gets the TTL asked for, the tokens keep
// rising, and Redis is not left with a script per TTL.
func TestPlainAttemptsAcrossManyTTLs(t *testing.T) {
	ctx := context.Background()
	rdb, c := serverAndClient(t)
	lk := c.Backend().(*redislock.Backend).LockKey("k")
	var last dlock.Token
	const ttls = 40
	for i := range ttls {
		ttl := 10*time.Second + time.Duration(i)*time.Second
		for range 2 { // the second time, a TTL that has its script (or not) already
			l, err := c.TryLock(ctx, "k", dlock.WithTTL(ttl))
			if err != nil {
				t.Fatal(err)
			}
			left, err := rdb.PTTL(ctx, lk).Result()
			if err != nil {
				t.Fatal(err)
			}
			if left <= ttl-time.Second || left > ttl {
				t.Fatalf("TTL %v: the key's PTTL is %v", ttl, left)
			}
			if l.Token() <= last {
				t.Fatalf("TTL %v: token %d not above %d", ttl, l.Token(), last)
			}
			last = l.Token()
			if err := l.Release(ctx); err != nil {
				t.Fatal(err)
			}
		}
	}
	info, err := rdb.Info(ctx, "memory").Result()
	if err != nil {
		t.Fatal(err)
	}
	_, rest, ok := strings.Cut(info, "number_of_cached_scripts:")
	if !ok {
		t.Fatalf("no number_of_cached_scripts in INFO memory")
	}
	n, err := strconv.Atoi(strings.TrimSpace(strings.SplitN(rest, "\n", 2)[0]))
	if err != nil {
		t.Fatal(err)
	}
	if n >= ttls {
		t.Fatalf("Redis caches %d scripts after %d TTLs: a script per TTL", n, ttls)
	}
}

// A server that lost its scripts (SCRIPT FLUSH, a restart) is sent them again.
func TestScriptsAfterFlush(t *testing.T) {
	ctx := context.Background()
	rdb, c := serverAndClient(t)
	var last dlock.Token
	for i := range 3 {
		if i > 0 {
			if err := rdb.ScriptFlush(ctx).Err(); err != nil {
				t.Fatal(err)
			}
		}
		l, err := c.Lock(ctx, "k")
		if err != nil {
			t.Fatalf("lock after %d flushes: %v", i, err)
		}
		if l.Token() <= last {
			t.Fatalf("token %d not above %d", l.Token(), last)
		}
		last = l.Token()
		if err := rdb.ScriptFlush(ctx).Err(); err != nil {
			t.Fatal(err)
		}
		if err := l.Release(ctx); err != nil {
			t.Fatalf("release after a flush: %v", err)
		}
	}
}

// A Redis that is down: Lock fails promptly with a wrapped connection error, bounded
// by ctx, and leaves nothing held.
func TestServerDown(t *testing.T) {
	port := testserver.FreePort(t)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
	defer cancel()
	_, err := dlock.Open(ctx, "redis://:secretpw@127.0.0.1:"+strconv.Itoa(port)+"/0")
	if err == nil {
		t.Fatal("Open of a closed port succeeded")
	}
	if strings.Contains(err.Error(), "secretpw") {
		t.Fatalf("error shows the password: %v", err)
	}
	if !strings.Contains(err.Error(), "connect") {
		t.Fatalf("error does not say what failed: %v", err)
	}

	// The server dies after Open.
	srv := testserver.StartRedis(t)
	c, err := dlock.Open(ctx, srv.URL())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	srv.Kill()
	lctx, lcancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer lcancel()
	if _, err := c.Lock(lctx, "k"); err == nil {
		t.Fatal("Lock succeeded on a dead server")
	} else if errors.Is(err, dlock.ErrLocked) && !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Lock on a dead server = %v", err)
	}
}

func TestURLParameters(t *testing.T) {
	srv := testserver.StartRedis(t)
	ctx := context.Background()
	for _, u := range []string{
		srv.URL() + "?bogus=1",
		srv.URL() + "?prefix=",
		srv.URL() + "?prefix=a%20b",
		srv.URL() + "?prefix=a%1Fb",
		srv.URL() + "?dial_timeout=x",
		srv.URL() + "?tls_ca=/nonexistent",
		"rediss://" + srv.Addr() + "?tls_cert=c.pem",
		"rediss://" + srv.Addr() + "?tls_ca=/nonexistent",
		"redis://" + srv.Addr() + "/notanumber",
	} {
		c, err := dlock.Open(ctx, u)
		if err == nil {
			c.Close()
			t.Errorf("Open(%q) succeeded", u)
		} else if !errors.Is(err, dlock.ErrInvalid) {
			t.Errorf("Open(%q) = %v, want ErrInvalid", u, err)
		}
	}
	// Prefixes separate namespaces.
	a, err := dlock.Open(ctx, srv.URL()+"?prefix=app1&ttl=5s")
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	b, err := dlock.Open(ctx, srv.URL()+"?prefix=app2")
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	la, err := a.TryLock(ctx, "k")
	if err != nil {
		t.Fatal(err)
	}
	lb, err := b.TryLock(ctx, "k")
	if err != nil {
		t.Fatalf("prefix app2 blocked by app1: %v", err)
	}
	if la.TTL() != 5*time.Second {
		t.Fatalf("ttl from URL not applied: %v", la.TTL())
	}
	if n, err := rawClient(t, srv).Exists(ctx, "app1:lock\x1fk").Result(); err != nil || n != 1 {
		t.Fatalf("%q exists = %d, %v", "app1:lock\x1fk", n, err)
	}
	_ = la.Release(ctx)
	_ = lb.Release(ctx)
}

// One handoff is exactly one request, whatever the number of waiters: the release
// script, which grants the key to the next waiter on the server and publishes the
// grant to that waiter's client only; the waiter's Lock returns without asking the
// server again. (The conformance suite checks that the cost is flat; this checks the
// number.)
func TestHandoffIsOneRequest(t *testing.T) {
	srv := testserver.StartRedis(t)
	h := harness(t, srv)
	rdb := rawClient(t, srv)
	scripts := func(ctx context.Context) (int64, error) {
		s, err := rdb.Info(ctx, "commandstats").Result()
		var n int64
		for line := range strings.SplitSeq(s, "\n") {
			name, rest, ok := strings.Cut(line, ":calls=")
			if ok && (name == "cmdstat_evalsha" || name == "cmdstat_eval") {
				c, _ := strconv.ParseInt(rest[:strings.IndexByte(rest, ',')], 10, 64)
				n += c
			}
		}
		return n, err
	}
	drivertest.HandoffCost(t, h, 2) // load the scripts into the server's cache
	for _, waiters := range []int{1, 16} {
		holder, pool := h.Client(t), make([]*dlock.Client, waiters)
		for i := range pool {
			pool[i] = h.Client(t)
		}
		run, err := measure.Growth(context.Background(), holder, pool, drivertest.Key(t, "k"), waiters,
			measure.GrowthOptions{Inspector: holder.Backend().(driver.Inspector), Ops: scripts})
		if err != nil {
			t.Fatal(err)
		}
		// The chain ends with the last waiter's release, which hands off to nobody.
		if per := float64(run.Ops-1) / float64(run.Handoffs); per != 1 {
			t.Fatalf("%d waiters: %.2f requests per handoff, want 1", waiters, per)
		}
	}
}

func BenchmarkCycle(b *testing.B) {
	srv := testserver.StartRedis(b)
	drivertest.BenchCycle(b, harness(b, srv))
}

func BenchmarkHandoff(b *testing.B) {
	srv := testserver.StartRedis(b)
	drivertest.BenchHandoff(b, harness(b, srv))
}

func BenchmarkContended(b *testing.B) {
	srv := testserver.StartRedis(b)
	for _, w := range []int{2, 16} {
		drivertest.BenchContended(b, harness(b, srv), w)
	}
}

// BenchmarkSemaphore: acquisitions/s of a semaphore of 4 permits and of a mutex,
// with 1, 4, 16 and 64 workers.
func BenchmarkSemaphore(b *testing.B) {
	srv := testserver.StartRedis(b)
	for _, w := range []int{1, 4, 16, 64} {
		for _, limit := range []int{1, 4} {
			drivertest.BenchSemaphore(b, harness(b, srv), limit, w)
		}
	}
}

// BenchmarkMultiKey: a set of 2, 4 and 8 keys taken with LockAll (one script call
// for the set) against each key locked and released in turn.
func BenchmarkMultiKey(b *testing.B) {
	srv := testserver.StartRedis(b)
	for _, n := range []int{2, 4, 8} {
		drivertest.BenchMultiKey(b, harness(b, srv), n)
	}
}

// BenchmarkReaders: reads/s of 1 and of 16 readers of a read-write lock, each
// holding for 5ms: readers hold together, so 16 should reach many times one.
func BenchmarkReaders(b *testing.B) {
	srv := testserver.StartRedis(b)
	for _, r := range []int{1, 16} {
		drivertest.BenchReaders(b, harness(b, srv), r, 5*time.Millisecond)
	}
}
