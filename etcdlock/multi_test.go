package etcdlock_test

import (
	"context"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/dlockio/dlock/driver"
	"github.com/dlockio/dlock/drivertest"
	"github.com/dlockio/dlock/internal/testserver"
)

// TestFreeCmp checks on the server what AcquireAll's conditions rely on: a compare
// of the create revision with 0 over a range holds when the range is empty and
// fails when any key is in it.
func TestFreeCmp(t *testing.T) {
	srv := testserver.StartEtcd(t)
	cli := rawClient(t, srv.Endpoint())
	ctx := context.Background()
	free := func() bool {
		t.Helper()
		resp, err := cli.Txn(ctx).If(clientv3.Compare(clientv3.CreateRevision("r/a"), "=", 0).WithRange("r/c")).Commit()
		if err != nil {
			t.Fatal(err)
		}
		return resp.Succeeded
	}
	if !free() {
		t.Fatal("compare over an empty range failed")
	}
	if _, err := cli.Put(ctx, "r/b", "x"); err != nil {
		t.Fatal(err)
	}
	if free() {
		t.Fatal("compare over a range with a key held")
	}
	if _, err := cli.Put(ctx, "r/c", "x"); err != nil { // the range's end is outside it
		t.Fatal(err)
	}
	if _, err := cli.Delete(ctx, "r/b"); err != nil {
		t.Fatal(err)
	}
	if !free() {
		t.Fatal("compare failed on a key at the range's end")
	}
}

// TestAcquireAllStale: a limit key and a tail left behind on a lock without
// members (a semaphore whose last holder's session ended) do not refuse a set, as
// they do not refuse a TryLock: they are cleared and the set is taken.
func TestAcquireAllStale(t *testing.T) {
	srv := testserver.StartEtcd(t)
	h := harness(t, srv)
	be := h.Open(t)
	defer be.Close()
	cli := rawClient(t, srv.Endpoint())
	ctx := context.Background()
	a, b := drivertest.Key(t, "a"), drivertest.Key(t, "b")
	const ttl = 10 * time.Second
	sem, err := be.Acquire(ctx, driver.Request{Key: b, Owner: "s", TTL: ttl, Limit: 3})
	if err != nil {
		t.Fatal(err)
	}
	h.Expire(t, b) // the semaphore's holder crashes: its limit key stays
	prefix := be.(interface{ LockPrefix(string) string }).LockPrefix(b)
	deadline := time.Now().Add(5 * time.Second)
	for {
		resp, err := cli.Get(ctx, prefix, clientv3.WithPrefix(), clientv3.WithCountOnly())
		if err != nil {
			t.Fatal(err)
		}
		if resp.Count == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the expired holder's member key stays")
		}
		time.Sleep(20 * time.Millisecond)
	}
	limitKey := prefix[:len(prefix)-1] + "\x1d"
	if resp, err := cli.Get(ctx, limitKey); err != nil || resp.Count != 1 {
		t.Fatalf("no stale limit key to test with: %v %v", resp, err)
	}
	reqs := []driver.Request{{Key: a, Owner: "y", TTL: ttl}, {Key: b, Owner: "y", TTL: ttl}}
	gs, err := be.(driver.MultiAcquirer).AcquireAll(ctx, reqs)
	if err != nil || len(gs) != 2 {
		t.Fatalf("AcquireAll over a stale limit key: %v, %v", gs, err)
	}
	if gs[0].Token != gs[1].Token || gs[1].Token <= sem.Token {
		t.Fatalf("tokens %d, %d: want one revision above the semaphore's %d", gs[0].Token, gs[1].Token, sem.Token)
	}
	for _, r := range reqs {
		if err := be.Refresh(ctx, r.Key, "y", ttl); err != nil {
			t.Fatalf("Refresh(%q): %v", r.Key, err)
		}
		if err := be.Release(ctx, r.Key, "y"); err != nil {
			t.Fatalf("Release(%q): %v", r.Key, err)
		}
	}
}
