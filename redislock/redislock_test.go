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

func harness(t testing.TB, srv *testserver.Redis) drivertest.Harness {
	rdb := rawClient(t, srv)
	keyer, err := redislock.New(rdb)
	if err != nil {
		t.Fatal(err)
	}
	return drivertest.Harness{
		Open: func(t testing.TB) driver.Backend { return open(t, srv.URL()) },
		Expire: func(t testing.TB, key string) {
			if err := rdb.Del(context.Background(), keyer.LockKey(key)).Err(); err != nil {
				t.Fatal(err)
			}
		},
		Fencing:   true,
		FIFO:      true,
		RoundTrip: func(ctx context.Context) error { return rdb.Ping(ctx).Err() },
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
	if n, err := rawClient(t, srv).Exists(ctx, "app1:lock:k").Result(); err != nil || n != 1 {
		t.Fatalf("app1:lock:k exists = %d, %v", n, err)
	}
	_ = la.Release(ctx)
	_ = lb.Release(ctx)
}

// One handoff costs the same number of Redis commands with 1 or 16 waiters: the
// release wakes one waiter, which makes one attempt.
func TestHandoffCostFlat(t *testing.T) {
	srv := testserver.StartRedis(t)
	h := harness(t, srv)
	ops := func(t testing.TB) (calls, scripts int64) {
		s, err := rawClient(t, srv).Info(context.Background(), "commandstats").Result()
		if err != nil {
			t.Fatal(err)
		}
		for line := range strings.SplitSeq(s, "\n") {
			name, rest, ok := strings.Cut(line, ":calls=")
			if !ok || name == "cmdstat_info" {
				continue
			}
			n, _ := strconv.ParseInt(rest[:strings.IndexByte(rest, ',')], 10, 64)
			calls += n
			if name == "cmdstat_evalsha" || name == "cmdstat_eval" {
				scripts += n
			}
		}
		return calls, scripts
	}
	ctx := context.Background()
	perHandoff := func(waiters int) (float64, float64) {
		key := drivertest.Key(t, "k")
		holder := h.Client(t)
		l, err := holder.Lock(ctx, key)
		if err != nil {
			t.Fatal(err)
		}
		got := make(chan *dlock.Lease, waiters)
		for range waiters {
			c := h.Client(t)
			go func() {
				l, err := c.Lock(ctx, key)
				if err != nil {
					t.Error(err)
					got <- nil
					return
				}
				got <- l
			}()
		}
		in := holder.Backend().(driver.Inspector)
		for {
			info, err := in.Inspect(ctx, key)
			if err == nil && info.Waiters == waiters {
				break
			}
			time.Sleep(5 * time.Millisecond)
		}
		// Count the commands of a chain of handoffs through every waiter.
		calls0, scripts0 := ops(t)
		if err := l.Release(ctx); err != nil {
			t.Fatal(err)
		}
		for range waiters {
			nl := <-got
			if nl == nil {
				t.FailNow()
			}
			if err := nl.Release(ctx); err != nil {
				t.Fatal(err)
			}
		}
		// The last waiter's release hands off to nobody: take it out.
		calls1, scripts1 := ops(t)
		return float64(calls1-calls0-3) / float64(waiters), float64(scripts1-scripts0-1) / float64(waiters)
	}
	perHandoff(2) // load the scripts into the server's cache (a first EVALSHA costs an EVAL too)
	one, rt1 := perHandoff(1)
	many, rt16 := perHandoff(16)
	t.Logf("per handoff: %.2f client requests and %.2f server commands (inside scripts included) with 1 waiter; %.2f and %.2f with 16",
		rt1, one, rt16, many)
	// A handoff is two requests (the release script, which publishes one wake-up,
	// and the woken waiter's acquire); never one per waiter.
	if rt1 != 2 || rt16 != 2 {
		t.Fatalf("client requests per handoff: %.2f with 1 waiter, %.2f with 16; want 2", rt1, rt16)
	}
	if many > one+1 {
		t.Fatalf("server commands per handoff grow with waiters: %.2f with 1, %.2f with 16", one, many)
	}
}

func BenchmarkCycle(b *testing.B) {
	srv := testserver.StartRedis(b)
	drivertest.BenchCycle(b, harness(b, srv))
}

func BenchmarkHandoff(b *testing.B) {
	srv := testserver.StartRedis(b)
	drivertest.BenchHandoff(b, harness(b, srv), nil)
}

func BenchmarkContended(b *testing.B) {
	srv := testserver.StartRedis(b)
	for _, w := range []int{2, 16} {
		drivertest.BenchContended(b, harness(b, srv), w, nil)
	}
}
