package zklock_test

import (
	"context"
	"errors"
	"log/slog"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/go-zookeeper/zk"

	"github.com/dlockio/dlock"
	"github.com/dlockio/dlock/driver"
	"github.com/dlockio/dlock/internal/testserver"
	"github.com/dlockio/dlock/zklock"
)

// captured is a slog handler that keeps messages, to check that a code path ran.
type captured struct {
	mu   sync.Mutex
	msgs []string
}

func (c *captured) Enabled(context.Context, slog.Level) bool { return true }
func (c *captured) Handle(_ context.Context, r slog.Record) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.msgs = append(c.msgs, r.Message)
	return nil
}
func (c *captured) WithAttrs([]slog.Attr) slog.Handler { return c }
func (c *captured) WithGroup(string) slog.Handler      { return c }

func (c *captured) count(substr string) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	n := 0
	for _, m := range c.msgs {
		if strings.Contains(m, substr) {
			n++
		}
	}
	return n
}

func ctxT(t testing.TB, d time.Duration) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	t.Cleanup(cancel)
	return ctx
}

func newClient(t testing.TB, b driver.Backend, opts ...dlock.Option) *dlock.Client {
	t.Helper()
	c, err := dlock.New(b, opts...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() })
	return c
}

// eventually polls cond until it holds; the bound is a safety net against a hang.
func eventually(t testing.TB, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(45 * time.Second) // a JVM election under a loaded -race run
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting until %s", what)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func children(t testing.TB, raw *zk.Conn, key string) []string {
	t.Helper()
	names, _, err := raw.Children(lockPath(key))
	if errors.Is(err, zk.ErrNoNode) {
		return nil
	}
	if err != nil {
		t.Fatalf("children of %q: %v", key, err)
	}
	return names
}

// A holder whose session is closed from outside (the ensemble ends it) loses its
// lease at once, not at its TTL, and the next holder gets a larger token.
func TestSessionClosedFromOutside(t *testing.T) {
	srv := testserver.StartZooKeeper(t)
	px := newProxy(t, srv.Addr())
	ctx := ctxT(t, 30*time.Second)
	hb := open(t, "zk://"+px.Addr()+"/dlock")
	holder := newClient(t, hb, dlock.WithTTL(time.Minute))
	waiter := newClient(t, open(t, srv.URL("/dlock")))
	key := "session-closed"
	l, err := holder.Lock(ctx, key)
	if err != nil {
		t.Fatal(err)
	}
	sid, pw := px.Session()
	if sid != hb.Conn().SessionID() {
		t.Fatalf("proxy saw session %x, backend has %x", sid, hb.Conn().SessionID())
	}
	got := make(chan *dlock.Lease, 1)
	go func() {
		l2, err := waiter.Lock(ctx, key)
		if err != nil {
			t.Error(err)
		}
		got <- l2
	}()
	if err := closeSessionFromOutside(srv.Addr(), sid, pw); err != nil {
		t.Fatal(err)
	}
	select {
	case <-l.Done():
	case <-ctx.Done():
		t.Fatal("the holder's lease did not end when its session was closed")
	}
	if !errors.Is(l.Err(), dlock.ErrLeaseLost) {
		t.Fatalf("Err = %v, want ErrLeaseLost", l.Err())
	}
	l2 := <-got
	if l2 == nil {
		t.FailNow()
	}
	if l2.Token() <= l.Token() {
		t.Fatalf("token after the session ended %d, not above %d", l2.Token(), l.Token())
	}
	if err := l.Release(ctx); !errors.Is(err, dlock.ErrLeaseLost) {
		t.Fatalf("Release of the lost lease = %v, want ErrLeaseLost", err)
	}
	// The backend carries on with a new session.
	l3, err := holder.TryLock(ctx, key+"-2")
	if err != nil {
		t.Fatalf("lock on the new session: %v", err)
	}
	if err := l3.Release(ctx); err != nil {
		t.Fatal(err)
	}
	if err := l2.Release(ctx); err != nil {
		t.Fatal(err)
	}
}

// A holder cut off from the ensemble longer than the session timeout loses its lease
// before the ensemble expires its session and grants the lock to anyone else, even
// with a TTL far longer than the session timeout.
func TestPartitionEndsLeaseBeforeTakeover(t *testing.T) {
	srv := testserver.StartZooKeeper(t)
	px := newProxy(t, srv.Addr())
	ctx := ctxT(t, 30*time.Second)
	hb := open(t, "zk://"+px.Addr()+"/dlock?session_timeout=2s")
	if got := hb.SessionTimeout(); got != 2*time.Second {
		t.Fatalf("negotiated session timeout %v, want 2s", got)
	}
	holder := newClient(t, hb, dlock.WithTTL(time.Minute))
	waiter := newClient(t, open(t, srv.URL("/dlock")))
	key := "partition"
	l, err := holder.Lock(ctx, key)
	if err != nil {
		t.Fatal(err)
	}
	px.Partition()
	l2, err := waiter.Lock(ctx, key) // granted once the ensemble expires the holder's session
	if err != nil {
		t.Fatal(err)
	}
	select {
	case <-l.Done():
	default:
		t.Fatal("a second holder was granted while the first lease still looked valid")
	}
	if !errors.Is(l.Err(), dlock.ErrLeaseLost) {
		t.Fatalf("Err = %v, want ErrLeaseLost", l.Err())
	}
	if l2.Token() <= l.Token() {
		t.Fatalf("token after the partition %d, not above %d", l2.Token(), l.Token())
	}
	px.Heal()
	if err := l.Release(ctx); !errors.Is(err, dlock.ErrLeaseLost) {
		t.Fatalf("Release of the lost lease = %v, want ErrLeaseLost", err)
	}
	if err := l2.Release(ctx); err != nil {
		t.Fatal(err)
	}
	// Once healed, the holder's backend learns its session expired and works again.
	eventually(t, "the cut-off backend has a new session", func() bool {
		return hb.Conn().State() == zk.StateHasSession && hb.Conn().SessionID() != 0
	})
	l3, err := holder.Lock(ctx, key)
	if err != nil {
		t.Fatal(err)
	}
	if l3.Token() <= l2.Token() {
		t.Fatalf("token %d not above %d", l3.Token(), l2.Token())
	}
	if err := l3.Release(ctx); err != nil {
		t.Fatal(err)
	}
}

// A connection that drops and comes back within the session keeps the lease.
func TestReconnectKeepsLease(t *testing.T) {
	srv := testserver.StartZooKeeper(t)
	px := newProxy(t, srv.Addr())
	ctx := ctxT(t, 30*time.Second)
	hb := open(t, "zk://"+px.Addr()+"/dlock?session_timeout=6s")
	holder := newClient(t, hb, dlock.WithTTL(time.Minute))
	key := "blip"
	l, err := holder.Lock(ctx, key)
	if err != nil {
		t.Fatal(err)
	}
	sid := hb.Conn().SessionID()
	px.Cut()
	eventually(t, "the backend reconnects", func() bool {
		return px.Accepted() >= 2 && hb.Conn().State() == zk.StateHasSession
	})
	if hb.Conn().SessionID() != sid {
		t.Fatalf("session changed from %x to %x", sid, hb.Conn().SessionID())
	}
	if err := hb.Refresh(ctx, key, l.Owner(), time.Minute); err != nil {
		t.Fatalf("Refresh after reconnecting: %v", err)
	}
	if l.Err() != nil {
		t.Fatalf("lease ended by a short disconnection: %v", l.Err())
	}
	if _, err := newClient(t, open(t, srv.URL("/dlock"))).TryLock(ctx, key); !errors.Is(err, dlock.ErrLocked) {
		t.Fatalf("TryLock by another client after the blip = %v, want ErrLocked", err)
	}
	if err := l.Release(ctx); err != nil {
		t.Fatal(err)
	}
}

// A create whose reply is lost (the server applied it, the connection dropped before
// the reply arrived) is found again by its GUID and adopted: no second contender
// node, and no orphan left behind.
func TestLostCreateReply(t *testing.T) {
	srv := testserver.StartZooKeeper(t)
	px := newProxy(t, srv.Addr())
	raw := rawConn(t, srv.Addr())
	ctx := ctxT(t, 30*time.Second)
	logs := &captured{}
	b := open(t, "zk://"+px.Addr()+"/dlock", zklock.WithLogger(slog.New(logs)))
	defer b.Close()
	key := "lost-reply"
	ttl := 30 * time.Second

	px.LoseNextCreateReply("/lock-", false)
	g, err := b.Acquire(ctx, driver.Request{Key: key, Owner: "alice", TTL: ttl})
	if err != nil {
		t.Fatalf("Acquire with a lost create reply: %v", err)
	}
	if px.Lost() != 1 || logs.count("adopted a contender") != 1 {
		t.Fatalf("the proxy dropped %d create replies and the backend adopted %d, want 1 and 1", px.Lost(), logs.count("adopted a contender"))
	}
	if names := children(t, raw, key); len(names) != 1 || !strings.Contains(names[0], "-alice-") {
		t.Fatalf("contenders after the lost reply: %v, want alice's one", names)
	}
	info, err := b.Inspect(ctx, key)
	if err != nil || info.Owner != "alice" || info.Token != g.Token {
		t.Fatalf("Inspect = %+v, %v; want alice with token %d", info, err, g.Token)
	}

	// The same on a held key: the would-be contender withdraws, leaving nothing.
	px.LoseNextCreateReply("/lock-", false)
	if _, err := b.Acquire(ctx, driver.Request{Key: key, Owner: "bob", TTL: ttl}); !errors.Is(err, driver.ErrLocked) {
		t.Fatalf("Acquire of a held key with a lost create reply = %v, want ErrLocked", err)
	}
	if px.Lost() != 2 || logs.count("adopted a contender") != 2 {
		t.Fatalf("the proxy dropped %d create replies and the backend adopted %d, want 2 and 2", px.Lost(), logs.count("adopted a contender"))
	}
	if names := children(t, raw, key); len(names) != 1 || !strings.Contains(names[0], "-alice-") {
		t.Fatalf("contenders after bob's lost reply: %v, want alice's only", names)
	}
	if err := b.Release(ctx, key, "alice"); err != nil {
		t.Fatal(err)
	}
	if names := children(t, raw, key); len(names) != 0 {
		t.Fatalf("contenders left after release: %v", names)
	}
}

// A create whose outcome cannot be settled before ctx ends (reply lost, then the
// ensemble unreachable) leaves a node on the server for the moment; once the backend
// is back, it deletes it within the TTL, on the same session, without a Release.
func TestUnsettledCreateIsCleanedUp(t *testing.T) {
	srv := testserver.StartZooKeeper(t)
	px := newProxy(t, srv.Addr())
	raw := rawConn(t, srv.Addr())
	b := open(t, "zk://"+px.Addr()+"/dlock?session_timeout=30s")
	defer b.Close()
	sid := b.Conn().SessionID()
	key := "unsettled"
	px.LoseNextCreateReply("/lock-", true)
	actx, cancel := context.WithTimeout(context.Background(), time.Second)
	_, err := b.Acquire(actx, driver.Request{Key: key, Owner: "carol", TTL: time.Second})
	cancel()
	if err == nil || errors.Is(err, driver.ErrLocked) || !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Acquire cut off mid-create = %v, want a wrapped deadline error", err)
	}
	if !strings.Contains(err.Error(), "zklock") || !strings.Contains(err.Error(), key) {
		t.Fatalf("error does not say what failed: %v", err)
	}
	if names := children(t, raw, key); len(names) != 1 {
		t.Fatalf("contenders on the server while cut off: %v, want the unsettled one", names)
	}
	px.Heal()
	eventually(t, "the unsettled contender is deleted", func() bool { return len(children(t, raw, key)) == 0 })
	if b.Conn().SessionID() != sid {
		t.Fatalf("the session changed (%x to %x): the node went with the session, not by clean-up", sid, b.Conn().SessionID())
	}
}

// An ensemble that cannot be reached: Open fails within the ctx bound with an error
// that says what failed and hides the password.
func TestUnreachable(t *testing.T) {
	port := testserver.FreePort(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	_, err := dlock.Open(ctx, "zk://app:secretpw@127.0.0.1:"+strconv.Itoa(port)+"/dlock")
	if err == nil {
		t.Fatal("Open of a closed port succeeded")
	}
	if strings.Contains(err.Error(), "secretpw") {
		t.Fatalf("error shows the password: %v", err)
	}
	if !strings.Contains(err.Error(), "connect") || !strings.Contains(err.Error(), "refused") || !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("error does not say what failed: %v", err)
	}

	// Without a ctx deadline, the session timeout bounds the wait.
	start := time.Now()
	if _, err := dlock.Open(context.Background(), "zk://127.0.0.1:"+strconv.Itoa(port)+"/dlock?session_timeout=1s"); err == nil {
		t.Fatal("Open of a closed port succeeded")
	} else if time.Since(start) > 10*time.Second {
		t.Fatalf("Open took %v with a 1s session timeout", time.Since(start))
	}

	// The server dies after Open: Lock fails within its ctx, wrapped.
	srv := testserver.StartZooKeeper(t)
	c, err := dlock.Open(ctxT(t, 20*time.Second), srv.URL("/dlock"))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	srv.Kill()
	lctx, lcancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer lcancel()
	if _, err := c.Lock(lctx, "k"); err == nil {
		t.Fatal("Lock succeeded on a dead server")
	} else if !errors.Is(err, context.DeadlineExceeded) || !strings.Contains(err.Error(), `"k"`) {
		t.Fatalf("Lock on a dead server = %v", err)
	}
}

// Bad roots and credentials fail Open with a clear error and leave nothing behind.
func TestBadRootAndAuth(t *testing.T) {
	srv := testserver.StartZooKeeper(t)
	raw := rawConn(t, srv.Addr())
	ctx := ctxT(t, 30*time.Second)
	if err := raw.AddAuth("digest", []byte("admin:adminpw")); err != nil {
		t.Fatal(err)
	}
	if _, err := raw.Create("/secure", nil, 0, zk.DigestACL(zk.PermAll, "app", "rightpw")); err != nil {
		t.Fatal(err)
	}
	if _, err := raw.Create("/eph", nil, zk.FlagEphemeral, zk.WorldACL(zk.PermAll)); err != nil {
		t.Fatal(err)
	}
	// An existing root inside a tree the application may not create in.
	if _, err := raw.Create("/admin", nil, 0, zk.DigestACL(zk.PermAll, "admin", "adminpw")); err != nil {
		t.Fatal(err)
	}
	if _, err := raw.Create("/admin/app", nil, 0, zk.DigestACL(zk.PermAll, "app", "rightpw")); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		path    string
		invalid bool   // fails with ErrInvalid
		is      error  // or wraps this
		says    string // and mentions this
	}{
		{path: "/a//b", invalid: true, says: "component"},
		{path: "/a/", invalid: true, says: "end"},
		{path: "/a/../b", invalid: true, says: "'..'"},
		{path: "/zookeeper/x", invalid: true, says: "reserved"},
		{path: "/missing?create_root=false", invalid: true, says: "does not exist"},
		{path: "/secure/dlock", is: zk.ErrNoAuth, says: "credentials"},
		{path: "/eph/dlock", is: zk.ErrNoChildrenForEphemerals, says: "/eph/dlock"},
	} {
		c, err := dlock.Open(ctx, srv.URL(tc.path))
		if err == nil {
			c.Close()
			t.Errorf("Open(%s) succeeded", tc.path)
			continue
		}
		if tc.invalid && !errors.Is(err, dlock.ErrInvalid) || tc.is != nil && !errors.Is(err, tc.is) || !strings.Contains(err.Error(), tc.says) {
			t.Errorf("Open(%s) = %v", tc.path, err)
		}
	}

	// Wrong password: refused, the password not shown.
	_, err := dlock.Open(ctx, "zk://app:wrongpw@"+srv.Addr()+"/secure")
	if !errors.Is(err, zk.ErrNoAuth) || strings.Contains(err.Error(), "wrongpw") {
		t.Fatalf("Open with a wrong password = %v", err)
	}
	// Right password (URL and Go option): works, and the nodes it makes are closed
	// to other identities.
	c, err := dlock.Open(ctx, "zk://app:rightpw@"+srv.Addr()+"/secure")
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	l, err := c.Lock(ctx, "k")
	if err != nil {
		t.Fatal(err)
	}
	anon := rawConn(t, srv.Addr())
	if _, _, err := anon.Children("/secure/k-k"); !errors.Is(err, zk.ErrNoAuth) {
		t.Fatalf("anonymous read of the lock node = %v, want ErrNoAuth", err)
	}
	u := mustURL(t, srv.URL("/secure"))
	b2, err := zklock.Open(ctx, u, zklock.WithDigestAuth("app", "rightpw"))
	if err != nil {
		t.Fatal(err)
	}
	defer b2.Close()
	if info, err := b2.Inspect(ctx, "k"); err != nil || info.Owner != l.Owner() {
		t.Fatalf("Inspect with WithDigestAuth = %+v, %v", info, err)
	}
	c3, err := dlock.Open(ctx, "zk://app:rightpw@"+srv.Addr()+"/admin/app")
	if err != nil {
		t.Fatalf("Open of an existing root under a parent closed to the app: %v", err)
	}
	if l3, err := c3.TryLock(ctx, "k"); err != nil {
		t.Fatal(err)
	} else if err := l3.Release(ctx); err != nil {
		t.Fatal(err)
	}
	c3.Close()
	if err := l.Release(ctx); err != nil {
		t.Fatal(err)
	}
	// Nothing was left under the roots that failed.
	for _, p := range []string{"/a", "/missing", "/secure/dlock"} {
		if ok, _, err := raw.Exists(p); err != nil || ok {
			t.Errorf("%s exists after a failed Open (%v)", p, err)
		}
	}
}

func TestURLParameters(t *testing.T) {
	srv := testserver.StartZooKeeper(t)
	ctx := ctxT(t, 30*time.Second)
	a := srv.Addr()
	for _, u := range []string{
		"zk://" + a + "/dlock?bogus=1",
		"zk://" + a + "/dlock?session_timeout=x",
		"zk://" + a + "/dlock?session_timeout=10ms",
		"zk://" + a + "/dlock?create_root=maybe",
		"zk://" + a + "/dlock?tls_cert=c.pem",
		"zk://" + a + "/dlock?tls_ca=/nonexistent",
		"zk://" + a + "/dlock?tls=x",
		"zk:///dlock",
		"zk://" + a + ",," + a + "/dlock",
		"zk://:pw@" + a + "/dlock",
	} {
		c, err := dlock.Open(ctx, u)
		if err == nil {
			c.Close()
			t.Errorf("Open(%q) succeeded", u)
		} else if !errors.Is(err, dlock.ErrInvalid) {
			t.Errorf("Open(%q) = %v, want ErrInvalid", u, err)
		}
	}
	raw := rawConn(t, a)
	// No path: the default root; "/": the ZooKeeper root; ttl is the core's.
	for _, tc := range []struct{ url, parent string }{
		{"zk://" + a + "?ttl=5s", "/dlock/k-x"},
		{"zk://" + a + "/?session_timeout=3s", "/k-x"},
		{"zk://" + a + "/apps/one", "/apps/one/k-x"},
	} {
		c, err := dlock.Open(ctx, tc.url)
		if err != nil {
			t.Fatalf("Open(%q): %v", tc.url, err)
		}
		l, err := c.Lock(ctx, "x")
		if err != nil {
			t.Fatal(err)
		}
		if names, _, err := raw.Children(tc.parent); err != nil || len(names) != 1 {
			t.Errorf("%s: children of %s = %v, %v", tc.url, tc.parent, names, err)
		}
		if strings.Contains(tc.url, "ttl=5s") && l.TTL() != 5*time.Second {
			t.Errorf("ttl from the URL not applied: %v", l.TTL())
		}
		_ = l.Release(ctx)
		c.Close()
	}
}

// On a 3-member ensemble, losing the leader keeps mutual exclusion and rising
// tokens: the lease either survives (the holder reconnected within its session) and
// still excludes others, or it ends; the next grant's token is larger either way.
func TestEnsembleLeaderLoss(t *testing.T) {
	ens := testserver.StartZooKeeperEnsemble(t, 3)
	ctx := ctxT(t, time.Minute)
	hb := open(t, ens.URL("/dlock")+"?session_timeout=6s")
	holder := newClient(t, hb, dlock.WithTTL(time.Minute))
	other := newClient(t, open(t, ens.URL("/dlock")))
	key := "ensemble"
	l, err := holder.Lock(ctx, key)
	if err != nil {
		t.Fatal(err)
	}
	leader := ens.Leader()
	if leader == nil {
		t.Fatal("no leader")
	}
	leader.Kill()
	eventually(t, "a new leader is elected", func() bool { return ens.Leader() != nil })
	t.Logf("leader %s killed; the holder's lease: %v", leader.Addr(), l.Err())
	if l.Err() == nil {
		if err := hb.Refresh(ctx, key, l.Owner(), time.Minute); err != nil {
			if l.Err() == nil {
				t.Logf("renewal after the election: %v (the lease ends at its deadline)", err)
			}
		} else if _, err := other.TryLock(ctx, key); !errors.Is(err, dlock.ErrLocked) {
			t.Fatalf("TryLock while the lease survived the election = %v, want ErrLocked", err)
		}
		_ = l.Release(ctx)
	}
	l2, err := other.Lock(ctx, key)
	if err != nil {
		t.Fatal(err)
	}
	if l2.Token() <= l.Token() {
		t.Fatalf("token after the leader change %d, not above %d", l2.Token(), l.Token())
	}
	if err := l2.Release(ctx); err != nil {
		t.Fatal(err)
	}
}
