package etcdlock_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/dlockio/dlock"
	"github.com/dlockio/dlock/driver"
	"github.com/dlockio/dlock/drivertest"
	"github.com/dlockio/dlock/etcdlock"
	"github.com/dlockio/dlock/internal/testserver"
)

// members returns the number of member keys of key.
func members(t *testing.T, cli *clientv3.Client, b *etcdlock.Backend, key string) int64 {
	t.Helper()
	resp, err := cli.Get(context.Background(), b.LockPrefix(key), clientv3.WithPrefix(), clientv3.WithCountOnly())
	if err != nil {
		t.Fatal(err)
	}
	return resp.Count
}

// limitKeyOf is the name of key's limit key (see limitSep).
func limitKeyOf(b *etcdlock.Backend, key string) string {
	return strings.TrimSuffix(b.LockPrefix(key), "\x1f") + "\x1d"
}

func client(t *testing.T, srv *testserver.Etcd) *dlock.Client {
	t.Helper()
	c, err := dlock.Open(context.Background(), srv.URL("dlock"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

type lockResult struct {
	l   *dlock.Lease
	err error
	at  time.Time
}

func lockAsync(ctx context.Context, c *dlock.Client, key string, opts ...dlock.Option) <-chan lockResult {
	ch := make(chan lockResult, 1)
	go func() {
		l, err := c.Lock(ctx, key, opts...)
		ch <- lockResult{l, err, time.Now()}
	}()
	return ch
}

// waitMembers waits until key has n member keys.
func waitMembers(t *testing.T, cli *clientv3.Client, b *etcdlock.Backend, key string, n int64) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for members(t, cli, b, key) != n {
		if time.Now().After(deadline) {
			t.Fatalf("%q has %d members, want %d", key, members(t, cli, b, key), n)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// A key whose permits are all held and that has a queued place refuses an attempt
// with another limit, waiting or not, semaphore or mutex, and writes nothing; the
// queued place gets the permit when one is freed, and once the key is free another
// limit applies.
func TestSemaphoreLimitMismatchQueued(t *testing.T) {
	srv := testserver.StartEtcd(t)
	cli := rawClient(t, srv.Endpoint())
	b := open(t, srv.URL("dlock"))
	defer b.Close()
	ctx := context.Background()
	key := drivertest.Key(t, "k")
	for _, o := range []string{"a", "b"} {
		if _, err := b.Acquire(ctx, driver.Request{Key: key, Owner: o, TTL: 10 * time.Second, Limit: 2}); err != nil {
			t.Fatalf("Acquire %s: %v", o, err)
		}
	}
	w, err := b.Watch(ctx, key, "w")
	if err != nil {
		t.Fatal(err)
	}
	wreq := driver.Request{Key: key, Owner: "w", TTL: 10 * time.Second, Wait: true, Patience: 10 * time.Second, Limit: 2}
	var held *driver.HeldError
	if _, err := b.Acquire(ctx, wreq); !errors.As(err, &held) || !held.Queued || held.Ahead != 0 {
		t.Fatalf("a third of 2 = %v (%+v), want queued next in line", err, held)
	}
	waitMembers(t, cli, b, key, 3)
	for _, req := range []driver.Request{
		{Key: key, Owner: "x", TTL: time.Second, Limit: 3},
		{Key: key, Owner: "x", TTL: time.Second, Limit: 3, Wait: true, Patience: time.Second},
		{Key: key, Owner: "x", TTL: time.Second},
		{Key: key, Owner: "x", TTL: time.Second, Wait: true, Patience: time.Second},
	} {
		_, err := b.Acquire(ctx, req)
		if !errors.Is(err, driver.ErrLimitMismatch) || !strings.Contains(err.Error(), "limit 2") || !strings.Contains(err.Error(), key) {
			t.Fatalf("Acquire with limit %d (wait %v) = %v, want ErrLimitMismatch naming the key and limit 2", req.Limit, req.Wait, err)
		}
		if n := members(t, cli, b, key); n != 3 {
			t.Fatalf("a refused attempt left %d members, want 3", n)
		}
	}
	if err := b.Release(ctx, key, "a"); err != nil {
		t.Fatal(err)
	}
	select {
	case <-w.C():
	case <-time.After(5 * time.Second):
		t.Fatal("the queued place was not woken when a permit was freed")
	}
	if _, err := b.Acquire(ctx, wreq); err != nil {
		t.Fatalf("the queued place's attempt after a release: %v", err)
	}
	if err := w.Stop(ctx, true); err != nil {
		t.Fatal(err)
	}
	limit, hs, err := b.Holders(ctx, key)
	if err != nil || limit != 2 || len(hs) != 2 || hs[0].Owner != "b" || hs[1].Owner != "w" {
		t.Fatalf("Holders = %d, %+v, %v; want 2, [b w]", limit, hs, err)
	}
	for _, o := range []string{"b", "w"} {
		if err := b.Release(ctx, key, o); err != nil {
			t.Fatal(err)
		}
	}
	// Free: the limit key is stale, and the next attempt sets another limit.
	if _, err := b.Acquire(ctx, driver.Request{Key: key, Owner: "m", TTL: time.Second}); err != nil {
		t.Fatalf("a mutex on the freed semaphore: %v", err)
	}
	if err := b.Release(ctx, key, "m"); err != nil {
		t.Fatal(err)
	}
}

// Several permits freed at once go to as many queued places, oldest first, and a
// place queued behind the holders gets the first permit freed, whichever holder
// frees it, promptly (from its watch, not a fallback retry); a newcomer does not
// take a permit while a place is queued ahead of it.
func TestSemaphoreHandoff(t *testing.T) {
	srv := testserver.StartEtcd(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	cli := rawClient(t, srv.Endpoint())
	b := open(t, srv.URL("dlock"))
	defer b.Close()
	key := drivertest.Key(t, "k")
	const n = 3
	var holders []*dlock.Lease
	for range n {
		holders = append(holders, mustLockLimit(t, ctx, client(t, srv), key, n))
	}
	// A waiter behind the holders gets the permit of the youngest one.
	w1 := lockAsync(ctx, client(t, srv), key, dlock.WithLimit(n))
	waitMembers(t, cli, b, key, n+1)
	released := time.Now()
	if err := holders[n-1].Release(ctx); err != nil {
		t.Fatal(err)
	}
	r := <-w1
	if r.err != nil {
		t.Fatalf("waiter: %v", r.err)
	}
	if d := r.at.Sub(released); d > time.Second {
		t.Fatalf("the waiter got the freed permit %v after the release", d)
	}
	holders[n-1] = r.l
	// Two waiters, two permits freed at once.
	w2 := lockAsync(ctx, client(t, srv), key, dlock.WithLimit(n))
	waitMembers(t, cli, b, key, n+1)
	w3 := lockAsync(ctx, client(t, srv), key, dlock.WithLimit(n))
	waitMembers(t, cli, b, key, n+2)
	if _, err := client(t, srv).TryLock(ctx, key, dlock.WithLimit(n)); !errors.Is(err, dlock.ErrLocked) {
		t.Fatalf("a newcomer's TryLock with places queued: %v, want ErrLocked", err)
	}
	released = time.Now()
	done := make(chan error, 2)
	for _, l := range holders[:2] {
		go func() { done <- l.Release(ctx) }()
	}
	for range 2 {
		if err := <-done; err != nil {
			t.Fatal(err)
		}
	}
	var last dlock.Token
	for _, ch := range []<-chan lockResult{w2, w3} {
		r := <-ch
		if r.err != nil {
			t.Fatalf("waiter: %v", r.err)
		}
		if d := r.at.Sub(released); d > time.Second {
			t.Fatalf("a waiter got its permit %v after the releases", d)
		}
		if r.l.Token() <= last {
			t.Fatalf("token %d not above %d", r.l.Token(), last)
		}
		last = r.l.Token()
		defer r.l.Release(ctx)
	}
	if _, hs, err := b.Holders(ctx, key); err != nil || len(hs) != n || hs[0].Token != uint64(holders[n-1].Token()) {
		t.Fatalf("Holders = %+v, %v", hs, err)
	}
	holders[n-1].Release(ctx)
}

func mustLockLimit(t *testing.T, ctx context.Context, c *dlock.Client, key string, n int) *dlock.Lease {
	t.Helper()
	l, err := c.Lock(ctx, key, dlock.WithLimit(n))
	if err != nil {
		t.Fatalf("Lock with limit %d: %v", n, err)
	}
	return l
}

// State left by older clients or by a semaphore that is gone: a member key written
// without a limit (the layout before semaphores) makes the key a mutex to a
// semaphore attempt; a limit key or a tail left on a key without members does not
// block anyone.
func TestSemaphoreOldState(t *testing.T) {
	srv := testserver.StartEtcd(t)
	cli := rawClient(t, srv.Endpoint())
	b := open(t, srv.URL("dlock"))
	defer b.Close()
	ctx := context.Background()
	key := drivertest.Key(t, "k")
	lease, err := cli.Grant(ctx, 30)
	if err != nil {
		t.Fatal(err)
	}
	defer cli.Revoke(ctx, lease.ID)
	old := b.LockPrefix(key) + "older.0"
	if _, err := cli.Put(ctx, old, "old-owner", clientv3.WithLease(lease.ID)); err != nil {
		t.Fatal(err)
	}
	if _, err := b.Acquire(ctx, driver.Request{Key: key, Owner: "s", TTL: time.Second, Limit: 2}); !errors.Is(err, driver.ErrLimitMismatch) {
		t.Fatalf("a semaphore on an old mutex holder: %v, want ErrLimitMismatch", err)
	}
	if _, err := b.Acquire(ctx, driver.Request{Key: key, Owner: "m", TTL: time.Second}); !errors.Is(err, driver.ErrLocked) {
		t.Fatalf("a mutex on an old mutex holder: %v, want ErrLocked", err)
	}
	if limit, hs, err := b.Holders(ctx, key); err != nil || limit != 1 || len(hs) != 1 || hs[0].Owner != "old-owner" {
		t.Fatalf("Holders = %d, %+v, %v", limit, hs, err)
	}
	if _, err := cli.Delete(ctx, old); err != nil {
		t.Fatal(err)
	}
	// Stale limit key and tail, no members: every kind of attempt goes through.
	for _, req := range []driver.Request{
		{Key: key, Owner: "m", TTL: time.Second},
		{Key: key, Owner: "m", TTL: time.Second, Wait: true, Patience: time.Second},
		{Key: key, Owner: "s", TTL: time.Second, Limit: 2},
		{Key: key, Owner: "s", TTL: time.Second, Limit: 2, Wait: true, Patience: time.Second},
	} {
		for k, v := range map[string]string{limitKeyOf(b, key): "3", strings.TrimSuffix(b.LockPrefix(key), "\x1f") + "\x1e": "gone"} {
			if _, err := cli.Put(ctx, k, v); err != nil {
				t.Fatal(err)
			}
		}
		if _, err := b.Acquire(ctx, req); err != nil {
			t.Fatalf("Acquire %+v on stale keys: %v", req, err)
		}
		if err := b.Release(ctx, key, req.Owner); err != nil {
			t.Fatal(err)
		}
	}
}

// Each holder of a semaphore has its own value, which SetValue changes alone;
// Holders and Inspect return them; a holder watch sees a holder other than the
// first leave.
func TestSemaphoreValues(t *testing.T) {
	srv := testserver.StartEtcd(t)
	b := open(t, srv.URL("dlock"))
	defer b.Close()
	ctx := context.Background()
	key := drivertest.Key(t, "k")
	for _, o := range []string{"a", "b"} {
		if _, err := b.Acquire(ctx, driver.Request{Key: key, Owner: o, TTL: 10 * time.Second, Limit: 2, Value: []byte("v-" + o)}); err != nil {
			t.Fatal(err)
		}
	}
	if err := b.SetValue(ctx, key, "b", []byte("new")); err != nil {
		t.Fatal(err)
	}
	b2 := open(t, srv.URL("dlock")) // no record of the grants: reads the holders
	defer b2.Close()
	if err := b2.SetValue(ctx, key, "a", []byte("A")); err != nil {
		t.Fatal(err)
	}
	limit, hs, err := b.Holders(ctx, key)
	if err != nil || limit != 2 || len(hs) != 2 || string(hs[0].Value) != "A" || string(hs[1].Value) != "new" {
		t.Fatalf("Holders = %d, %+v, %v", limit, hs, err)
	}
	if info, err := b.Inspect(ctx, key); err != nil || info.Owner != "a" || string(info.Value) != "A" || info.Waiters != 0 {
		t.Fatalf("Inspect = %+v, %v", info, err)
	}
	// The semaphore's limit stays with the value: a refresh finds the grant.
	if err := b.Refresh(ctx, key, "b", 10*time.Second); err != nil {
		t.Fatalf("Refresh after SetValue: %v", err)
	}
	hw, err := b.WatchHolder(ctx, key)
	if err != nil {
		t.Fatal(err)
	}
	defer hw.Stop()
	if err := b.Release(ctx, key, "b"); err != nil {
		t.Fatal(err)
	}
	select {
	case <-hw.C():
	case <-time.After(5 * time.Second):
		t.Fatal("no holder notification when the second holder left")
	}
	if err := b.ForceRelease(ctx, key); err != nil {
		t.Fatal(err)
	}
	if limit, hs, err := b.Holders(ctx, key); err != nil || limit != 0 || len(hs) != 0 {
		t.Fatalf("Holders after ForceRelease = %d, %+v, %v", limit, hs, err)
	}
}

// A waiter ahead that gives up counts as a place freed: the waiter behind it gets
// the next permit promptly, and no permit stays reserved for the one that left.
func TestSemaphoreWaiterGivesUp(t *testing.T) {
	srv := testserver.StartEtcd(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	cli := rawClient(t, srv.Endpoint())
	b := open(t, srv.URL("dlock"))
	defer b.Close()
	key := drivertest.Key(t, "k")
	a := mustLockLimit(t, ctx, client(t, srv), key, 2)
	h := mustLockLimit(t, ctx, client(t, srv), key, 2)
	defer h.Release(ctx)
	wctx, wcancel := context.WithCancel(ctx)
	w1 := lockAsync(wctx, client(t, srv), key, dlock.WithLimit(2))
	waitMembers(t, cli, b, key, 3)
	w2 := lockAsync(ctx, client(t, srv), key, dlock.WithLimit(2))
	waitMembers(t, cli, b, key, 4)
	wcancel()
	if r := <-w1; !errors.Is(r.err, dlock.ErrLocked) {
		t.Fatalf("cancelled waiter: %v, want ErrLocked", r.err)
	}
	waitMembers(t, cli, b, key, 3)
	released := time.Now()
	if err := a.Release(ctx); err != nil {
		t.Fatal(err)
	}
	r := <-w2
	if r.err != nil {
		t.Fatalf("waiter: %v", r.err)
	}
	defer r.l.Release(ctx)
	if d := r.at.Sub(released); d > time.Second {
		t.Fatalf("the waiter got the freed permit %v after the release", d)
	}
}

// Queue lists the members behind the N holders of a semaphore, and behind the
// readers at the front of a read-write lock (a reader behind a writer waits).
func TestQueueSemaphoreAndReaders(t *testing.T) {
	srv := testserver.StartEtcd(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	cli := rawClient(t, srv.Endpoint())
	b := open(t, srv.URL("dlock"))
	defer b.Close()
	key := drivertest.Key(t, "sem")
	for _, o := range []string{"a", "b"} {
		if _, err := b.Acquire(ctx, driver.Request{Key: key, Owner: o, TTL: 10 * time.Second, Limit: 2}); err != nil {
			t.Fatal(err)
		}
	}
	if q, err := b.Queue(ctx, key); err != nil || len(q) != 0 {
		t.Fatalf("Queue of a full semaphore without waiters = %+v, %v", q, err)
	}
	w1 := lockAsync(ctx, client(t, srv), key, dlock.WithLimit(2), dlock.WithValue([]byte("x")))
	waitMembers(t, cli, b, key, 3)
	w2 := lockAsync(ctx, client(t, srv), key, dlock.WithLimit(2), dlock.WithValue([]byte("y")))
	waitMembers(t, cli, b, key, 4)
	q, err := b.Queue(ctx, key)
	if err != nil || len(q) != 2 || string(q[0].Value) != "x" || string(q[1].Value) != "y" || q[0].Shared || q[0].Waiters != -1 || q[0].Token != 0 {
		t.Fatalf("Queue of a semaphore = %+v, %v; want x, y", q, err)
	}
	if err := b.Release(ctx, key, "a"); err != nil {
		t.Fatal(err)
	}
	r := <-w1
	if r.err != nil {
		t.Fatal(r.err)
	}
	if q, err := b.Queue(ctx, key); err != nil || len(q) != 1 || string(q[0].Value) != "y" {
		t.Fatalf("Queue after a release = %+v, %v; want y", q, err)
	}
	r.l.Release(ctx)
	if r = <-w2; r.err != nil {
		t.Fatal(r.err)
	}
	r.l.Release(ctx)
	b.Release(ctx, key, "b")

	rw := drivertest.Key(t, "rw")
	for _, o := range []string{"r1", "r2"} {
		if _, err := b.Acquire(ctx, driver.Request{Key: rw, Owner: o, TTL: 10 * time.Second, Shared: true}); err != nil {
			t.Fatal(err)
		}
	}
	ww := lockAsync(ctx, client(t, srv), rw, dlock.WithValue([]byte("w")))
	waitMembers(t, cli, b, rw, 3)
	wr := lockAsync(ctx, client(t, srv), rw, dlock.WithShared(), dlock.WithValue([]byte("r")))
	waitMembers(t, cli, b, rw, 4)
	q, err = b.Queue(ctx, rw)
	if err != nil || len(q) != 2 || string(q[0].Value) != "w" || q[0].Shared || string(q[1].Value) != "r" || !q[1].Shared {
		t.Fatalf("Queue behind readers = %+v, %v; want writer w, reader r", q, err)
	}
	b.Release(ctx, rw, "r1")
	b.Release(ctx, rw, "r2")
	r = <-ww
	if r.err != nil {
		t.Fatal(r.err)
	}
	if q, err := b.Queue(ctx, rw); err != nil || len(q) != 1 || !q[0].Shared {
		t.Fatalf("Queue behind a writer = %+v, %v; want reader r", q, err)
	}
	r.l.Release(ctx)
	if r = <-wr; r.err != nil {
		t.Fatal(r.err)
	}
	r.l.Release(ctx)
	if q, err := b.Queue(ctx, rw); err != nil || len(q) != 0 {
		t.Fatalf("Queue of a free key = %+v, %v", q, err)
	}
}
