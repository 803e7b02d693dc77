package etcdlock_test

import (
	"bytes"
	"context"
	"errors"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
	"google.golang.org/grpc"

	"github.com/dlockio/dlock"
	"github.com/dlockio/dlock/driver"
	"github.com/dlockio/dlock/drivertest"
	"github.com/dlockio/dlock/etcdlock"
	"github.com/dlockio/dlock/internal/testserver"
)

// pending fails the test if ch has delivered.
func pending(t *testing.T, what string, ch <-chan lockResult) {
	t.Helper()
	select {
	case r := <-ch:
		t.Fatalf("%s got the key too early: %v", what, r.err)
	case <-time.After(200 * time.Millisecond):
	}
}

// got waits for ch and fails the test unless it delivered a lease within a second
// of since.
func got(t *testing.T, what string, ch <-chan lockResult, since time.Time) *dlock.Lease {
	t.Helper()
	r := <-ch
	if r.err != nil {
		t.Fatalf("%s: %v", what, r.err)
	}
	if d := r.at.Sub(since); d > time.Second {
		t.Fatalf("%s got the key %v after the release", what, d)
	}
	return r.l
}

// A writer's release hands the key to the whole run of readers queued behind it at
// once, and to none queued behind the next writer; a reader TryLock does not pass
// the queued writer; the writer gets the key when the last reader of the run
// releases, and the reader behind it when it releases. Holders, Inspect, SetValue
// and Refresh work per reader.
func TestRWHandoff(t *testing.T) {
	srv := testserver.StartEtcd(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	cli := rawClient(t, srv.Endpoint())
	b := open(t, srv.URL("dlock"))
	defer b.Close()
	c := client(t, srv)
	key := drivertest.Key(t, "k")
	shared := dlock.WithShared()

	w1, err := c.Lock(ctx, key)
	if err != nil {
		t.Fatal(err)
	}
	var readers []<-chan lockResult
	for i := range 3 {
		readers = append(readers, lockAsync(ctx, client(t, srv), key, shared))
		waitMembers(t, cli, b, key, int64(i+2))
	}
	w2ch := lockAsync(ctx, client(t, srv), key)
	waitMembers(t, cli, b, key, 5)
	r4ch := lockAsync(ctx, client(t, srv), key, shared)
	waitMembers(t, cli, b, key, 6)
	for _, ch := range readers {
		pending(t, "a reader behind the writer", ch)
	}

	released := time.Now()
	if err := w1.Release(ctx); err != nil {
		t.Fatal(err)
	}
	var run []*dlock.Lease
	for _, ch := range readers {
		l := got(t, "a reader of the run", ch, released)
		if l.Token() <= w1.Token() {
			t.Fatalf("reader's token %d not above the writer's %d", l.Token(), w1.Token())
		}
		run = append(run, l)
	}
	pending(t, "the second writer", w2ch)
	pending(t, "the reader behind the second writer", r4ch)
	if _, err := client(t, srv).TryLock(ctx, key, shared); !errors.Is(err, dlock.ErrLocked) {
		t.Fatalf("a reader's TryLock with a writer queued: %v, want ErrLocked", err)
	}
	limit, hs, err := b.Holders(ctx, key)
	if err != nil || limit != 1 || len(hs) != 3 {
		t.Fatalf("Holders = %d, %+v, %v; want the three readers", limit, hs, err)
	}
	for i, h := range hs {
		if !h.Shared || h.Token != uint64(run[i].Token()) || h.Waiters != 2 {
			t.Fatalf("Holders[%d] = %+v, want reader %d with 2 waiters", i, h, run[i].Token())
		}
	}
	if info, err := b.Inspect(ctx, key); err != nil || !info.Shared || info.Token != uint64(run[0].Token()) || info.Waiters != 2 {
		t.Fatalf("Inspect = %+v, %v; want the oldest reader, 2 waiters", info, err)
	}
	// SetValue of a reader that holds through another client.
	if err := b.SetValue(ctx, key, run[1].Owner(), []byte("v1")); err != nil {
		t.Fatal(err)
	}
	if _, hs, err := b.Holders(ctx, key); err != nil || !hs[1].Shared || !bytes.Equal(hs[1].Value, []byte("v1")) {
		t.Fatalf("Holders after SetValue = %+v, %v", hs, err)
	}

	for _, l := range run[:2] {
		if err := l.Release(ctx); err != nil {
			t.Fatal(err)
		}
	}
	pending(t, "the second writer, a reader still holding", w2ch)
	released = time.Now()
	if err := run[2].Release(ctx); err != nil {
		t.Fatal(err)
	}
	w2 := got(t, "the second writer", w2ch, released)
	if info, err := b.Inspect(ctx, key); err != nil || info.Shared || info.Token != uint64(w2.Token()) || info.Waiters != 1 {
		t.Fatalf("Inspect = %+v, %v; want the writer, 1 waiter", info, err)
	}
	pending(t, "the reader behind the second writer", r4ch)
	released = time.Now()
	if err := w2.Release(ctx); err != nil {
		t.Fatal(err)
	}
	r4 := got(t, "the reader behind the second writer", r4ch, released)
	if r4.Token() <= w2.Token() {
		t.Fatalf("reader's token %d not above the writer's %d", r4.Token(), w2.Token())
	}
	if err := r4.Release(ctx); err != nil {
		t.Fatal(err)
	}
}

// Readers and a semaphore exclude each other by limit: a semaphore attempt on a key
// held by readers, and a reader's attempt, waiting or not, on a key held as a
// semaphore, fail with ErrLimitMismatch and write nothing. Readers refresh and set
// their values each.
func TestRWLimitMismatch(t *testing.T) {
	srv := testserver.StartEtcd(t)
	cli := rawClient(t, srv.Endpoint())
	b := open(t, srv.URL("dlock"))
	defer b.Close()
	ctx := context.Background()
	key := drivertest.Key(t, "k")
	for _, o := range []string{"r", "r2"} {
		if _, err := b.Acquire(ctx, driver.Request{Key: key, Owner: o, TTL: 10 * time.Second, Shared: true}); err != nil {
			t.Fatal(err)
		}
		if err := b.Refresh(ctx, key, o, 10*time.Second); err != nil {
			t.Fatalf("Refresh of reader %s: %v", o, err)
		}
	}
	if err := b.SetValue(ctx, key, "r2", []byte("v")); err != nil {
		t.Fatal(err)
	}
	if _, hs, err := b.Holders(ctx, key); err != nil || len(hs) != 2 || !hs[1].Shared || string(hs[1].Value) != "v" || hs[0].Value != nil {
		t.Fatalf("Holders = %+v, %v", hs, err)
	}
	if err := b.Release(ctx, key, "r2"); err != nil {
		t.Fatal(err)
	}
	for _, wait := range []bool{false, true} {
		req := driver.Request{Key: key, Owner: "s", TTL: 10 * time.Second, Limit: 2, Wait: wait}
		if wait {
			req.Patience = time.Second
		}
		if _, err := b.Acquire(ctx, req); !errors.Is(err, driver.ErrLimitMismatch) {
			t.Fatalf("a semaphore on readers (wait %v): %v, want ErrLimitMismatch", wait, err)
		}
	}
	waitMembers(t, cli, b, key, 1)
	if err := b.Release(ctx, key, "r"); err != nil {
		t.Fatal(err)
	}
	if _, err := b.Acquire(ctx, driver.Request{Key: key, Owner: "s", TTL: 10 * time.Second, Limit: 2}); err != nil {
		t.Fatal(err)
	}
	for _, wait := range []bool{false, true} {
		req := driver.Request{Key: key, Owner: "r", TTL: 10 * time.Second, Shared: true, Wait: wait}
		if wait {
			req.Patience = time.Second
		}
		if _, err := b.Acquire(ctx, req); !errors.Is(err, driver.ErrLimitMismatch) {
			t.Fatalf("a reader on a semaphore (wait %v): %v, want ErrLimitMismatch", wait, err)
		}
	}
	waitMembers(t, cli, b, key, 1)
	if err := b.Release(ctx, key, "s"); err != nil {
		t.Fatal(err)
	}
}

// State left by older clients: a member key written without a tag (the layout
// before read-write locks) is a writer's, which a reader waits for; a reader's
// member is listed as shared; a limit key or a tail left on a key without members
// does not block a reader.
func TestRWOldState(t *testing.T) {
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
	if _, err := b.Acquire(ctx, driver.Request{Key: key, Owner: "r", TTL: time.Second, Shared: true}); !errors.Is(err, driver.ErrLocked) {
		t.Fatalf("a reader's TryLock on an old holder: %v, want ErrLocked", err)
	}
	c := client(t, srv)
	rch := lockAsync(ctx, c, key, dlock.WithShared())
	waitMembers(t, cli, b, key, 2)
	pending(t, "a reader behind an old holder", rch)
	released := time.Now()
	if _, err := cli.Delete(ctx, old); err != nil {
		t.Fatal(err)
	}
	r := got(t, "a reader behind an old holder", rch, released)
	// A reader's member written by hand is listed as shared.
	other := b.LockPrefix(key) + "other.0"
	if _, err := cli.Put(ctx, other, "other-owner\x02\x00val", clientv3.WithLease(lease.ID)); err != nil {
		t.Fatal(err)
	}
	_, hs, err := b.Holders(ctx, key)
	if err != nil || len(hs) != 2 || hs[1].Owner != "other-owner" || !hs[1].Shared || string(hs[1].Value) != "val" {
		t.Fatalf("Holders = %+v, %v", hs, err)
	}
	if err := r.Release(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := cli.Delete(ctx, other); err != nil {
		t.Fatal(err)
	}
	for _, req := range []driver.Request{
		{Key: key, Owner: "r", TTL: time.Second, Shared: true},
		{Key: key, Owner: "r", TTL: time.Second, Shared: true, Wait: true, Patience: time.Second},
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

// countingClient is an etcd client that counts the requests it sends to the KV
// service (Range, Txn, Put, DeleteRange).
func countingClient(t *testing.T, endpoint string, n *atomic.Int64) *clientv3.Client {
	t.Helper()
	count := func(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
		if strings.HasPrefix(method, "/etcdserverpb.KV/") {
			n.Add(1)
		}
		return invoker(ctx, method, req, reply, cc, opts...)
	}
	cli, err := clientv3.New(clientv3.Config{Endpoints: []string{endpoint}, DialTimeout: 5 * time.Second, Logger: zap.NewNop(),
		DialOptions: []grpc.DialOption{grpc.WithUnaryInterceptor(count)}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cli.Close() })
	return cli
}

// A waiting reader that finds only readers ahead holds after one request: the
// members ahead are read with its write. When that read cannot hold them all (cut
// to one member here), the reader reads those ahead in a request of its own, and
// still holds beside readers and queues behind a writer.
func TestReaderReadsAheadWithWrite(t *testing.T) {
	srv := testserver.StartEtcd(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	shared := dlock.WithShared()
	key := drivertest.Key(t, "k")
	first, err := client(t, srv).Lock(ctx, key, shared)
	if err != nil {
		t.Fatal(err)
	}
	var requests atomic.Int64
	b, err := etcdlock.New(ctx, countingClient(t, srv.Endpoint(), &requests))
	if err != nil {
		t.Fatal(err)
	}
	c, err := dlock.New(b)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	warm, err := c.Lock(ctx, key+"-warm", shared) // the client's session
	if err != nil {
		t.Fatal(err)
	}
	if err := warm.Release(ctx); err != nil {
		t.Fatal(err)
	}

	requests.Store(0)
	second, err := c.Lock(ctx, key, shared)
	if err != nil {
		t.Fatal(err)
	}
	if n := requests.Load(); n != 1 {
		t.Fatalf("a reader beside a reader took %d requests, want 1", n)
	}
	if err := second.Release(ctx); err != nil {
		t.Fatal(err)
	}

	defer etcdlock.SetReadersInTxn(1)()
	requests.Store(0)
	second, err = c.Lock(ctx, key, shared)
	if err != nil {
		t.Fatal(err)
	}
	if n := requests.Load(); n != 2 {
		t.Fatalf("a reader beside a reader, its write's read cut short, took %d requests, want 2", n)
	}
	if err := second.Release(ctx); err != nil {
		t.Fatal(err)
	}
	w := lockAsync(ctx, client(t, srv), key)
	waitMembers(t, rawClient(t, srv.Endpoint()), b, key, 2)
	r := lockAsync(ctx, c, key, shared)
	pending(t, "a reader behind a queued writer", r)
	released := time.Now()
	if err := first.Release(ctx); err != nil {
		t.Fatal(err)
	}
	wl := got(t, "the writer", w, released)
	pending(t, "a reader behind the writer", r)
	released = time.Now()
	if err := wl.Release(ctx); err != nil {
		t.Fatal(err)
	}
	rl := got(t, "the reader", r, released)
	if rl.Token() <= wl.Token() {
		t.Fatalf("reader's token %d not above the writer's %d", rl.Token(), wl.Token())
	}
	if err := rl.Release(ctx); err != nil {
		t.Fatal(err)
	}
}
