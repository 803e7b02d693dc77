package redislock_test

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/dlockio/dlock"
	"github.com/dlockio/dlock/driver"
	"github.com/dlockio/dlock/drivertest"
	"github.com/dlockio/dlock/internal/testserver"
	"github.com/dlockio/dlock/redislock"
)

// sentinelHarness runs the conformance suite through the sentinels: every client
// the suite opens finds the master with a redis+sentinel:// URL.
func sentinelHarness(t testing.TB, s *testserver.Sentinel, query string) drivertest.Harness {
	h := harness(t, s.Master)
	raw := s.URL("")
	if query != "" {
		raw += "?" + query
	}
	h.Open = func(t testing.TB) driver.Backend { return open(t, raw) }
	h.Namespace = func(t testing.TB, ns string) (driver.Backend, error) {
		u, err := url.Parse(raw)
		if err != nil {
			t.Fatal(err)
		}
		return redislock.Open(context.Background(), u, redislock.WithPrefix(ns))
	}
	return h
}

// The conformance suite on a master with one replica, found through one sentinel,
// each grant acknowledged by the replica (replicas=1).
func TestSentinelConformance(t *testing.T) {
	s := testserver.StartSentinel(t, 1, 1)
	drivertest.Run(t, sentinelHarness(t, s, "replicas=1&replica_timeout=1s"))
}

func openSentinelClient(t *testing.T, raw string) *dlock.Client {
	t.Helper()
	c, err := dlock.Open(context.Background(), raw)
	if err != nil {
		t.Fatalf("Open(%s): %v", raw, err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// With replicas=1, a grant the replica acknowledged survives a failover to that
// replica: the lease is still held on the new master (another client is refused),
// and the next token after release is larger.
func TestSentinelFailoverKeepsLockWithReplicas(t *testing.T) {
	s := testserver.StartSentinel(t, 1, 1)
	ctx := context.Background()
	raw := s.URL("") + "?replicas=1&replica_timeout=1s&ttl=30s"
	a := openSentinelClient(t, raw)
	b := openSentinelClient(t, raw)
	l, err := a.TryLock(ctx, "job")
	if err != nil {
		t.Fatal(err)
	}
	old := s.Master
	start := time.Now()
	nm := s.Failover()
	t.Logf("failover %s -> %s in %v", old.Addr(), nm.Addr(), time.Since(start))
	if nm == old {
		t.Fatal("the master did not change")
	}
	// b has not talked to any master since its Open; a talks to it now. Both
	// must reach the new master (after the switch go-redis drops the old one's
	// connections) and see the lock held.
	deadline := time.Now().Add(10 * time.Second)
	for {
		_, err := b.TryLock(ctx, "job")
		if errors.Is(err, dlock.ErrLocked) {
			break
		}
		if err == nil {
			t.Fatal("another client took the lock after the failover")
		}
		if time.Now().After(deadline) {
			t.Fatalf("TryLock after the failover: %v", err)
		}
		t.Logf("TryLock after the failover: %v (retrying)", err)
		time.Sleep(100 * time.Millisecond)
	}
	// The grant is on the new master itself, and a client that first connects
	// after the failover is refused too.
	if n, err := rawClient(t, nm).Exists(ctx, a.Backend().(*redislock.Backend).LockKey("job")).Result(); err != nil || n != 1 {
		t.Fatalf("the lock key on the new master: %d, %v", n, err)
	}
	if _, err := openSentinelClient(t, raw).TryLock(ctx, "job"); !errors.Is(err, dlock.ErrLocked) {
		t.Fatalf("a new client's TryLock after the failover = %v, want ErrLocked", err)
	}
	if l.Err() != nil {
		t.Fatalf("the lease was lost across the failover: %v", l.Err())
	}
	before := l.Token()
	if err := l.Release(ctx); err != nil {
		t.Fatalf("Release on the new master: %v", err)
	}
	l2, err := b.TryLock(ctx, "job")
	if err != nil {
		t.Fatalf("TryLock after release: %v", err)
	}
	if l2.Token() <= before {
		t.Fatalf("token %d after the failover is not above %d", l2.Token(), before)
	}
	if err := l2.Release(ctx); err != nil {
		t.Fatal(err)
	}
}

// Without replicas, a client follows a failover after a crash of the master,
// decided by three sentinels (quorum 2): new locks work on the new master, with
// larger tokens.
func TestSentinelClientFollowsFailover(t *testing.T) {
	s := testserver.StartSentinel(t, 1, 3)
	ctx := context.Background()
	c := openSentinelClient(t, s.URL(""))
	l, err := c.TryLock(ctx, "before")
	if err != nil {
		t.Fatal(err)
	}
	tok := l.Token()
	if err := l.Release(ctx); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	nm := s.KillMaster()
	t.Logf("failover after a crash to %s in %v", nm.Addr(), time.Since(start))
	deadline := time.Now().Add(10 * time.Second)
	for {
		l, err = c.TryLock(ctx, "after")
		if err == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("TryLock after the failover: %v", err)
		}
		t.Logf("TryLock after the failover: %v (retrying)", err)
		time.Sleep(100 * time.Millisecond)
	}
	if l.Token() <= tok {
		t.Fatalf("token %d after the failover is not above %d", l.Token(), tok)
	}
	if err := l.Release(ctx); err != nil {
		t.Fatal(err)
	}
}

// Malformed sentinel URLs fail Open with a one-line error matching ErrInvalid that
// shows no password, before any dial.
func TestSentinelURLErrors(t *testing.T) {
	const pw = "alice:topsecret@"
	for _, raw := range []string{
		"redis+sentinel://" + pw + "h1:26379,h2:26379",                           // no master name
		"redis+sentinel://" + pw + "h1:26379,h2:26379/",                          // empty master name
		"redis+sentinel://" + pw + "/mymaster",                                   // no sentinel
		"redis+sentinel://" + pw + "h1:26379,h2:0/mymaster",                      // bad port
		"redis+sentinel://" + pw + "h1:99999/mymaster",                           // bad port
		"redis+sentinel://" + pw + "h1,h1:26379/mymaster",                        // listed twice
		"redis+sentinel://" + pw + "h1/mymaster/0",                               // database in the path
		"redis+sentinel://" + pw + "h1/my%20master",                              // a space in the name
		"redis+sentinel://" + pw + "h1/mymaster?nope=1&sentinel_password=secret", // unknown parameter
		"redis+sentinel://" + pw + "h1/mymaster?db=x&sentinel_password=secret",   // bad db
		"redis+sentinel://" + pw + "h1/mymaster?pool_size=-1",                    // go-redis would panic
		"redis+sentinel://" + pw + "h1/mymaster?replicas=x",                      // bad replicas
		"redis+sentinel://" + pw + "h1/mymaster?skip_verify=1",                   // no TLS
		"rediss+sentinel://" + pw + "h1/mymaster?tls=false",                      // TLS scheme without TLS
		"redis+sentinel://" + pw + "h1/m?sentinel_username=u",                    // a user without a password
		"redis+sentinel://" + pw + "h1/m?sentinel_password=secret1&sentinel_password=secret2",
	} {
		b, err := openURL(raw)
		if err == nil {
			b.Close()
			t.Errorf("Open(%s) succeeded", raw)
			continue
		}
		if !errors.Is(err, driver.ErrInvalid) {
			t.Errorf("Open(%s) = %v, want ErrInvalid", raw, err)
		}
		if msg := err.Error(); strings.Contains(msg, "secret") || strings.Contains(msg, "\n") {
			t.Errorf("Open(%s): error shows a password or spans lines: %v", raw, err)
		}
	}
	// Unreachable sentinels: the error names them, not the passwords.
	_, err := openURL("redis+sentinel://" + pw + "127.0.0.1:1/mymaster?sentinel_password=alsosecret&dial_timeout=1s&max_retries=-1")
	if err == nil || strings.Contains(err.Error(), "secret") || !strings.Contains(err.Error(), "127.0.0.1:1") {
		t.Fatalf("Open with no sentinel up = %v", err)
	}
	t.Log(err)
}

// The URL's userinfo authenticates to the data nodes, sentinel_username and
// sentinel_password to the sentinels; a refused password of either is ErrAuth and
// is not shown.
func TestSentinelAuth(t *testing.T) {
	s := testserver.StartSentinel(t, 1, 1)
	ctx := context.Background()
	for _, n := range append([]*testserver.Redis{s.Master}, s.Replicas...) {
		if err := rawClient(t, n).Do(ctx, "ACL", "SETUSER", "alice", "on", ">datapw", "~*", "&*", "+@all").Err(); err != nil {
			t.Fatal(err)
		}
	}
	sc := redis.NewClient(&redis.Options{Addr: s.Sentinels[0].Addr()})
	defer sc.Close()
	if err := sc.Do(ctx, "ACL", "SETUSER", "watcher", "on", ">sentpw", "+@all").Err(); err != nil {
		t.Fatal(err)
	}
	if err := sc.Do(ctx, "ACL", "SETUSER", "default", "resetpass", ">defaultpw").Err(); err != nil {
		t.Fatal(err)
	}
	base := "redis+sentinel://alice:%s@" + s.Hosts() + "/" + s.Name + "?sentinel_username=watcher&sentinel_password=%s"
	b, err := openURL(fmt.Sprintf(base, "datapw", "sentpw"))
	if err != nil {
		t.Fatalf("Open with both passwords right: %v", err)
	}
	if _, err := b.Acquire(ctx, driver.Request{Key: "k", Owner: "o", TTL: time.Second}); err != nil {
		t.Fatal(err)
	}
	b.Close()
	for _, pws := range [][2]string{{"wrongdata", "sentpw"}, {"datapw", "wrongsent"}} {
		_, err := openURL(fmt.Sprintf(base, pws[0], pws[1]))
		if !errors.Is(err, dlock.ErrAuth) {
			t.Errorf("Open with %s/%s = %v, want ErrAuth", pws[0], pws[1], err)
		}
		if err != nil && strings.Contains(err.Error(), "wrong") {
			t.Errorf("the error shows the password: %v", err)
		}
	}
}

// rediss+sentinel:// speaks TLS to the sentinels and to the master they name,
// checking each certificate against the host dialled, and follows a failover.
func TestSentinelTLS(t *testing.T) {
	files := testserver.NewTLSFiles(t)
	s := testserver.StartSentinelTLS(t, files, 1, 1)
	ctx := context.Background()
	raw := s.URL("rediss+sentinel") + "?tls_ca=" + url.QueryEscape(files.CA)
	b, err := openURL(raw)
	if err != nil {
		t.Fatalf("Open(%s): %v", raw, err)
	}
	defer b.Close()
	g, err := b.Acquire(ctx, driver.Request{Key: "k", Owner: "o", TTL: time.Second})
	if err != nil {
		t.Fatalf("Acquire: %v", err)
	}
	if err := b.Release(ctx, "k", "o"); err != nil {
		t.Fatal(err)
	}
	s.Failover()
	deadline := time.Now().Add(10 * time.Second)
	for {
		g2, err := b.Acquire(ctx, driver.Request{Key: "k", Owner: "o", TTL: time.Second})
		if err == nil {
			if g2.Token <= g.Token {
				t.Fatalf("token %d after the failover is not above %d", g2.Token, g.Token)
			}
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("Acquire after the failover: %v", err)
		}
		time.Sleep(100 * time.Millisecond)
	}
	if b, err := openURL(s.URL("rediss+sentinel") + "?dial_timeout=1s"); err == nil {
		b.Close()
		t.Fatal("Open without the CA succeeded")
	} else if !strings.Contains(err.Error(), "certificate") {
		t.Fatalf("Open without the CA = %v, want a certificate error", err)
	}
}
