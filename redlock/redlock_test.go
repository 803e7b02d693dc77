package redlock_test

import (
	"context"
	"errors"
	"net/url"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"go.uber.org/goleak"

	"github.com/dlockio/dlock"
	"github.com/dlockio/dlock/driver"
	"github.com/dlockio/dlock/drivertest"
	"github.com/dlockio/dlock/internal/storeops"
	_ "github.com/dlockio/dlock/internal/storeops/redisops" // the store the harness measures with
	"github.com/dlockio/dlock/internal/testserver"
	"github.com/dlockio/dlock/redlock"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func open(t testing.TB, rawURL string) *redlock.Backend {
	t.Helper()
	u, err := url.Parse(rawURL)
	if err != nil {
		t.Fatal(err)
	}
	b, err := redlock.Open(context.Background(), u)
	if err != nil {
		t.Fatalf("Open: %v", err)
	}
	return b
}

func rawClients(t testing.TB, nodes []*testserver.Redis) []*redis.Client {
	cs := make([]*redis.Client, len(nodes))
	for i, n := range nodes {
		cs[i] = redis.NewClient(&redis.Options{Addr: n.Addr(), MaxRetries: -1})
		t.Cleanup(func() { cs[i].Close() })
	}
	return cs
}

// testQuery is the harness's URL query: a node timeout generous enough that a test
// binary slowed down by the race detector on a busy machine does not time out on
// healthy nodes (the suite is not about slow nodes; the tests below are).
const testQuery = "node_timeout=250ms"

func harness(t testing.TB, nodes []*testserver.Redis) drivertest.Harness {
	raw := rawClients(t, nodes)
	keyer, err := redlock.New(context.Background(), raw)
	if err != nil {
		t.Fatal(err)
	}
	ops := store(t, testserver.RedlockURL(nodes, testQuery))
	return drivertest.Harness{
		Open: func(t testing.TB) driver.Backend { return open(t, testserver.RedlockURL(nodes, testQuery)) },
		Expire: func(t testing.TB, key string) {
			for _, c := range raw {
				if err := c.Del(context.Background(), keyer.LockKey(key)).Err(); err != nil {
					t.Fatal(err)
				}
			}
		},
		Fencing:   true,
		FIFO:      false,
		RoundTrip: func(ctx context.Context) error { return raw[0].Ping(ctx).Err() },
		Namespace: func(t testing.TB, ns string) (driver.Backend, error) {
			u, err := url.Parse(testserver.RedlockURL(nodes, testQuery+"&prefix="+url.QueryEscape(ns)))
			if err != nil {
				t.Fatal(err)
			}
			b, err := redlock.Open(context.Background(), u)
			if err != nil {
				return nil, err
			}
			return b, nil
		},
		Ops:   ops.Ops,
		Floor: ops.FloorCycle,
	}
}

// store opens the direct connection to the nodes of rawURL that counts their
// operations and runs the floor, closed at the end of the test.
func store(t testing.TB, rawURL string) storeops.Store {
	t.Helper()
	s, err := storeops.Open(context.Background(), rawURL)
	if err != nil {
		t.Fatalf("storeops.Open: %v", err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

func ctxT(t testing.TB) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), drivertest.Wait)
	t.Cleanup(cancel)
	return ctx
}

func client(t testing.TB, rawURL string, opts ...dlock.Option) *dlock.Client {
	t.Helper()
	c, err := dlock.Open(context.Background(), rawURL, opts...)
	if err != nil {
		t.Fatalf("dlock.Open: %v", err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

func TestConformance(t *testing.T) {
	nodes := testserver.StartRedisNodes(t, 5)
	drivertest.Run(t, harness(t, nodes))
}

// Redlock keeps working with 2 of 5 nodes dead, refuses with 3 dead (with errors that
// name the nodes), and works again when one comes back.
func TestMinorityFailure(t *testing.T) {
	nodes := testserver.StartRedisNodes(t, 5)
	ctx := ctxT(t)
	c := client(t, testserver.RedlockURL(nodes, "node_timeout=100ms"))
	var last dlock.Token
	cycle := func() {
		t.Helper()
		l, err := c.TryLock(ctx, "k")
		if err != nil {
			t.Fatalf("TryLock: %v", err)
		}
		if l.Token() <= last {
			t.Fatalf("token %d not above %d", l.Token(), last)
		}
		last = l.Token()
		if err := l.Release(ctx); err != nil {
			t.Fatalf("Release: %v", err)
		}
	}
	cycle()
	nodes[0].Kill()
	nodes[3].Kill()
	cycle()
	cycle()

	nodes[4].Kill()
	_, err := c.TryLock(ctx, "k")
	if !errors.Is(err, dlock.ErrLocked) {
		t.Fatalf("TryLock with 3 of 5 nodes dead = %v, want ErrLocked (no majority)", err)
	}
	var qe *redlock.QuorumError
	if !errors.As(err, &qe) || qe.OK != 2 || qe.Need != 3 || qe.Nodes != 5 {
		t.Fatalf("error %v is not a QuorumError with 2 of 5 ok, need 3", err)
	}
	var ne *redlock.NodeError
	if !errors.As(err, &ne) || !errors.Is(err, syscall.ECONNREFUSED) {
		t.Fatalf("error %v does not carry the nodes' connection errors", err)
	}
	for _, n := range []*testserver.Redis{nodes[0], nodes[3], nodes[4]} {
		if !strings.Contains(err.Error(), n.Addr()) {
			t.Fatalf("error does not name dead node %s: %v", n.Addr(), err)
		}
	}
	lctx, cancel := context.WithTimeout(ctx, 300*time.Millisecond)
	_, err = c.Lock(lctx, "k")
	cancel()
	if !errors.Is(err, dlock.ErrLocked) || !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Lock with 3 of 5 nodes dead = %v, want ErrLocked and DeadlineExceeded", err)
	}

	if err := nodes[4].Restart(); err != nil {
		t.Fatal(err)
	}
	cycle()
}

// restartEmpty kills a node (SIGKILL) and starts it again; the test nodes run
// without persistence, so it comes back empty.
func restartEmpty(t *testing.T, n *testserver.Redis) {
	t.Helper()
	n.Kill()
	if err := n.Restart(); err != nil {
		t.Fatal(err)
	}
}

// A node that restarts empty while a client holds the lock does not let a second
// client in, because the holder still has a majority; the holder's next renewal
// closes the restarted nodes again, so restarts of other nodes are survived too.
func TestRestartedEmptyNode(t *testing.T) {
	nodes := testserver.StartRedisNodes(t, 5)
	raw := rawClients(t, nodes)
	ctx := ctxT(t)
	u := testserver.RedlockURL(nodes, "node_timeout=100ms")
	a := open(t, u) // driven by hand: no background renewal
	defer a.Close()
	b := client(t, u)
	const ttl = 10 * time.Second
	g, err := a.Acquire(ctx, driver.Request{Key: "k", Owner: "alice", TTL: ttl})
	if err != nil {
		t.Fatal(err)
	}
	restart := func(i int) {
		t.Helper()
		restartEmpty(t, nodes[i])
		if n, err := raw[i].Exists(ctx, a.LockKey("k")).Result(); err != nil || n != 0 {
			t.Fatalf("node %d after a restart without persistence: key exists %d, %v", i, n, err)
		}
	}
	restart(0)
	restart(1)
	if _, err := b.TryLock(ctx, "k"); !errors.Is(err, dlock.ErrLocked) {
		t.Fatalf("second client after 2 of 5 nodes restarted empty: %v, want ErrLocked", err)
	}
	// A renewal puts the lock back on the restarted nodes, with its token.
	if err := a.Refresh(ctx, "k", "alice", ttl); err != nil {
		t.Fatalf("Refresh with 3 of 5 nodes holding: %v", err)
	}
	want := "alice " + strconv.FormatUint(g.Token, 10)
	for _, i := range []int{0, 1} {
		if v, err := raw[i].Get(ctx, a.LockKey("k")).Result(); err != nil || v != want {
			t.Fatalf("node %d after the renewal = %q, %v; want %q", i, v, err, want)
		}
		if v, err := raw[i].Get(ctx, a.FenceKey("k")).Uint64(); err != nil || v < g.Token {
			t.Fatalf("node %d counter after the renewal = %d, %v; want at least %d", i, v, err, g.Token)
		}
	}
	restart(2)
	restart(3)
	if _, err := b.TryLock(ctx, "k"); !errors.Is(err, dlock.ErrLocked) {
		t.Fatalf("second client after 4 of 5 nodes restarted (2 at a time, renewal between): %v, want ErrLocked", err)
	}
	if err := a.Release(ctx, "k", "alice"); err != nil {
		t.Fatal(err)
	}
	l2, err := b.TryLock(ctx, "k")
	if err != nil {
		t.Fatal(err)
	}
	if uint64(l2.Token()) <= g.Token {
		t.Fatalf("token %d after restarts not above %d", l2.Token(), g.Token)
	}
	_ = l2.Release(ctx)
}

// A stopped (SIGSTOP) node delays each operation by about the node timeout, not by
// go-redis's 3s read timeout. The bound asserted is loose on purpose; the measured
// cost is reported by BenchmarkCyclePausedNode.
func TestPausedNode(t *testing.T) {
	nodes := testserver.StartRedisNodes(t, 5)
	ctx := ctxT(t)
	const nodeTimeout = 50 * time.Millisecond
	c := client(t, testserver.RedlockURL(nodes, "node_timeout="+nodeTimeout.String()))
	nodes[2].Pause()
	defer nodes[2].Resume()
	var worst time.Duration
	for range 5 {
		start := time.Now()
		l, err := c.TryLock(ctx, "k")
		if err != nil {
			t.Fatalf("TryLock with one node paused: %v", err)
		}
		if err := l.Release(ctx); err != nil {
			t.Fatalf("Release with one node paused: %v", err)
		}
		worst = max(worst, time.Since(start))
	}
	t.Logf("lock+release with one paused node: worst %v (node timeout %v)", worst, nodeTimeout)
	if worst > 20*nodeTimeout {
		t.Fatalf("a paused node cost %v per cycle, far above the node timeout %v", worst, nodeTimeout)
	}
}

func TestBadInput(t *testing.T) {
	nodes := testserver.StartRedisNodes(t, 3)
	ctx := ctxT(t)
	a0, a1, a2 := nodes[0].Addr(), nodes[1].Addr(), nodes[2].Addr()
	three := "redlock://" + a0 + "," + a1 + "," + a2
	for _, u := range []string{
		"redlock://" + a0 + "," + a1 + "," + a0,                        // duplicate
		"redlock://" + a0 + "," + a1,                                   // too few
		"redlock://" + a0,                                              // too few
		"redlock://" + a0 + ",," + a1 + "," + a2,                       // empty entry
		"redlock://" + a0 + "," + a1 + ",:6379",                        // empty host
		"redlock:///0",                                                 // no nodes
		three + "?bogus=1",                                             // unknown parameter
		three + "?node_timeout=0s",                                     // bad duration
		three + "?node_timeout=fast",                                   // bad duration
		three + "?prefix=",                                             // empty prefix
		three + "?tls=false&tls_ca=/etc/ssl/certs/ca-certificates.crt", // tls_* with tls=false
		three + "?prefix=a%zz",                                         // malformed escape
		three + "?prefix=a;b",                                          // semicolon
		three + "?tls=true&tls_ca=/nonexistent",                        // unreadable CA
		three + "?tls=true&tls_cert=c.pem",                             // cert without key
		three + "?allow_few_nodes=maybe",                               // bad bool
		three + "/notadb",                                              // bad database
		"redlock://localhost:" + strconv.Itoa(nodes[0].Port) + "," + a1 + "," + a2 + "," + strings.ToUpper("LOCALHOST:") + strconv.Itoa(nodes[0].Port), // same address, other case
	} {
		c, err := dlock.Open(ctx, u)
		if err == nil {
			c.Close()
			t.Errorf("Open(%q) succeeded", u)
		} else if !errors.Is(err, dlock.ErrInvalid) {
			t.Errorf("Open(%q) = %v, want ErrInvalid", u, err)
		}
	}
	// Two addresses of one server are found by run id.
	same := "redlock://localhost:" + strconv.Itoa(nodes[0].Port) + "," + a0 + "," + a1
	if c, err := dlock.Open(ctx, same); err == nil {
		c.Close()
		t.Errorf("Open(%q) with one server listed under two names succeeded", same)
	} else if !strings.Contains(err.Error(), "same server") {
		t.Errorf("Open(%q) = %v, want a same-server error", same, err)
	}
	// One or two nodes only when asked for.
	for _, u := range []string{"redlock://" + a0 + "?allow_few_nodes=true", "redlock://" + a0 + "," + a1 + "?allow_few_nodes=true"} {
		c := client(t, u)
		l, err := c.TryLock(ctx, "k-few-"+strconv.Itoa(strings.Count(u, ",")))
		if err != nil {
			t.Fatalf("%s: %v", u, err)
		}
		if err := l.Release(ctx); err != nil {
			t.Fatal(err)
		}
	}
	// A node that may evict keys, only when asked for.
	evicting := testserver.StartRedis(t, "--maxmemory", "64mb", "--maxmemory-policy", "volatile-ttl")
	withEvicting := "redlock://" + a0 + "," + a1 + "," + evicting.Addr()
	if c, err := dlock.Open(ctx, withEvicting); err == nil {
		c.Close()
		t.Errorf("Open with a node that may evict keys succeeded")
	} else if !errors.Is(err, dlock.ErrInvalid) || !strings.Contains(err.Error(), "volatile-ttl") {
		t.Errorf("Open with a node that may evict keys = %v, want ErrInvalid naming the policy", err)
	}
	client(t, withEvicting+"?allow_eviction=true")
	// A replica is not an independent master.
	replica := testserver.StartRedis(t, "--replicaof", "127.0.0.1", strconv.Itoa(nodes[0].Port))
	u := "redlock://" + replica.Addr() + "," + a1 + "," + a2
	if c, err := dlock.Open(ctx, u); err == nil {
		c.Close()
		t.Errorf("Open with a replica node succeeded")
	} else if !strings.Contains(err.Error(), "replica") && !strings.Contains(err.Error(), "slave") {
		t.Errorf("Open with a replica = %v, want an error naming the role", err)
	}
}

// Unreachable nodes: a minority is tolerated at Open (and reported by Ping); without
// a majority Open fails and says how many answered.
func TestUnreachableNodes(t *testing.T) {
	nodes := testserver.StartRedisNodes(t, 3)
	ctx := ctxT(t)
	dead1 := "127.0.0.1:" + strconv.Itoa(testserver.FreePort(t))
	dead2 := "127.0.0.1:" + strconv.Itoa(testserver.FreePort(t))
	u := "redlock://" + nodes[0].Addr() + "," + nodes[1].Addr() + "," + nodes[2].Addr() + "," + dead1 + "," + dead2 + "?node_timeout=100ms"
	c := client(t, u)
	b := c.Backend().(*redlock.Backend)
	err := b.Ping(ctx)
	var ne *redlock.NodeError
	if err == nil || !errors.As(err, &ne) || !strings.Contains(err.Error(), dead1) || !strings.Contains(err.Error(), dead2) {
		t.Fatalf("Ping = %v, want node errors for %s and %s", err, dead1, dead2)
	}
	l, err := c.TryLock(ctx, "k")
	if err != nil {
		t.Fatalf("TryLock with 3 of 5 nodes up: %v", err)
	}
	_ = l.Release(ctx)

	nodes[2].Kill()
	_, err = dlock.Open(ctx, u)
	if err == nil || !strings.Contains(err.Error(), "only 2 of 5 nodes answered") || !errors.Is(err, syscall.ECONNREFUSED) {
		t.Fatalf("Open with 2 of 5 nodes up = %v, want a count of the nodes that answered", err)
	}
}

// Mixed auth: the URL's credentials apply to every node, so nodes with different
// passwords are refused at Open with the nodes named; New with per-node clients works.
func TestMixedAuth(t *testing.T) {
	const pw = "s3cret-pw"
	const other = "other-pw"
	nodes := testserver.StartRedisNodes(t, 3)
	ctx := ctxT(t)
	// testserver checks readiness without a password, so set them afterwards.
	for i, r := range rawClients(t, nodes) {
		p := pw
		if i == 2 {
			p = other
		}
		if err := r.ConfigSet(ctx, "requirepass", p).Err(); err != nil {
			t.Fatal(err)
		}
	}
	hosts := nodes[0].Addr() + "," + nodes[1].Addr() + "," + nodes[2].Addr()
	_, err := dlock.Open(ctx, "redlock://:"+pw+"@"+hosts)
	if err == nil {
		t.Fatal("Open with a password that node 3 does not accept succeeded")
	}
	if strings.Contains(err.Error(), pw) {
		t.Fatalf("error shows the password: %v", err)
	}
	var ne *redlock.NodeError
	if !errors.As(err, &ne) || ne.Addr != nodes[2].Addr() {
		t.Fatalf("error %v does not name node %s", err, nodes[2].Addr())
	}
	_, err = dlock.Open(ctx, "redlock://"+hosts)
	if err == nil || strings.Count(err.Error(), "NOAUTH") != 3 {
		t.Fatalf("Open without a password = %v, want NOAUTH errors from all 3 nodes", err)
	}
	clients := []*redis.Client{
		redis.NewClient(&redis.Options{Addr: nodes[0].Addr(), Password: pw, ContextTimeoutEnabled: true, MaxRetries: -1}),
		redis.NewClient(&redis.Options{Addr: nodes[1].Addr(), Password: pw, ContextTimeoutEnabled: true, MaxRetries: -1}),
		redis.NewClient(&redis.Options{Addr: nodes[2].Addr(), Password: other, ContextTimeoutEnabled: true, MaxRetries: -1}),
	}
	for _, c := range clients {
		defer c.Close()
	}
	b, err := redlock.New(ctx, clients, redlock.WithNodeTimeout(100*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	c, err := dlock.New(b)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	l, err := c.TryLock(ctx, "k")
	if err != nil {
		t.Fatalf("TryLock with per-node credentials: %v", err)
	}
	if err := l.Release(ctx); err != nil {
		t.Fatal(err)
	}
}

func TestTLS(t *testing.T) {
	files := testserver.NewTLSFiles(t)
	var hosts []string
	for range 3 {
		_, port := testserver.StartRedisTLS(t, files)
		hosts = append(hosts, "127.0.0.1:"+strconv.Itoa(port))
	}
	ctx := ctxT(t)
	base := "redlock://" + strings.Join(hosts, ",") + "?node_timeout=250ms&tls=true"
	c := client(t, base+"&tls_ca="+url.QueryEscape(files.CA))
	l, err := c.TryLock(ctx, "k")
	if err != nil {
		t.Fatalf("TryLock over TLS: %v", err)
	}
	if err := l.Release(ctx); err != nil {
		t.Fatal(err)
	}
	// Without the CA the servers' certificates are not trusted.
	if c, err := dlock.Open(ctx, base); err == nil {
		c.Close()
		t.Fatal("Open without the CA succeeded")
	} else if !strings.Contains(err.Error(), "certificate") {
		t.Fatalf("Open without the CA = %v, want a certificate error", err)
	}
}

// Inspect reports the majority's view.
func TestInspectMajority(t *testing.T) {
	nodes := testserver.StartRedisNodes(t, 5)
	raw := rawClients(t, nodes)
	ctx := ctxT(t)
	c := client(t, testserver.RedlockURL(nodes, "node_timeout=100ms"))
	b := c.Backend().(*redlock.Backend)
	l, err := c.TryLock(ctx, "k")
	if err != nil {
		t.Fatal(err)
	}
	// A minority losing the key changes nothing.
	for _, r := range raw[:2] {
		r.Del(ctx, b.LockKey("k"))
	}
	info, err := b.Inspect(ctx, "k")
	if err != nil || info.Owner != l.Owner() || dlock.Token(info.Token) != l.Token() {
		t.Fatalf("Inspect = %+v, %v; want owner %s token %d", info, err, l.Owner(), l.Token())
	}
	// Without a majority nobody holds it.
	raw[2].Del(ctx, b.LockKey("k"))
	if _, err := b.Inspect(ctx, "k"); !errors.Is(err, driver.ErrNotHeld) {
		t.Fatalf("Inspect with the key on 2 of 5 nodes = %v, want ErrNotHeld", err)
	}
	// Release tells the owner it had lost its majority.
	if err := l.Release(ctx); !errors.Is(err, dlock.ErrLeaseLost) {
		t.Fatalf("Release after losing the majority = %v, want ErrLeaseLost", err)
	}
}

// A waiting Lock is woken by the release, not by its fallback timer: here the
// fallback is at least 15s and the holder's TTL 30s, and the waiter must get the key
// well before either.
func TestWakeByNotification(t *testing.T) {
	nodes := testserver.StartRedisNodes(t, 5)
	u := testserver.RedlockURL(nodes, testQuery)
	ctx := ctxT(t)
	a := client(t, u, dlock.WithTTL(30*time.Second))
	b := client(t, u, dlock.WithRetry(10*time.Millisecond, 30*time.Second))
	for round := range 3 { // the first round also covers the subscription start
		l, err := a.Lock(ctx, "k")
		if err != nil {
			t.Fatal(err)
		}
		got := make(chan error, 1)
		go func() {
			wctx, cancel := context.WithTimeout(ctx, 10*time.Second)
			defer cancel()
			l2, err := b.Lock(wctx, "k")
			if err == nil {
				err = l2.Release(ctx)
			}
			got <- err
		}()
		waitWaiters(t, ctx, a, "k", 1)
		if err := l.Release(ctx); err != nil {
			t.Fatal(err)
		}
		if err := <-got; err != nil {
			t.Fatalf("round %d: waiter not woken by the release: %v", round, err)
		}
	}
}

func waitWaiters(t *testing.T, ctx context.Context, c *dlock.Client, key string, n int) {
	t.Helper()
	in := c.Backend().(driver.Inspector)
	for {
		info, err := in.Inspect(ctx, key)
		if err == nil && info.Waiters >= n {
			return
		}
		select {
		case <-ctx.Done():
			t.Fatalf("%d waiters never recorded (last Inspect: %+v, %v)", n, info, err)
		case <-time.After(5 * time.Millisecond):
		}
	}
}

// Open applies the URL's parameters, then its options, which win; a bad option is
// an error matching ErrInvalid.
func TestOpenOptions(t *testing.T) {
	nodes := testserver.StartRedisNodes(t, 3)
	u, err := url.Parse(testserver.RedlockURL(nodes, "prefix=fromurl&dial_timeout=1s"))
	if err != nil {
		t.Fatal(err)
	}
	ctx := ctxT(t)
	b, err := redlock.Open(ctx, u, redlock.WithPrefix("fromopt"))
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	if k := b.LockKey("k"); !strings.HasPrefix(k, "fromopt:") {
		t.Fatalf("LockKey = %q, want the option's prefix", k)
	}
	for _, o := range []redlock.Option{nil, redlock.WithDialTimeout(0), redlock.WithPrefix("a b")} {
		if b, err := redlock.Open(ctx, u, o); !errors.Is(err, driver.ErrInvalid) {
			if err == nil {
				b.Close()
			}
			t.Errorf("Open with a bad option = %v, want ErrInvalid", err)
		}
	}
}
