package etcdlock_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/dlockio/dlock/driver"
	"github.com/dlockio/dlock/drivertest"
	"github.com/dlockio/dlock/internal/testserver"
)

// A waiting attempt that runs out of the request timeout reports the lock as taken
// (the core then waits and tries again), not a timeout that would end a Lock whose
// caller gave no deadline. With a request timeout of 1ns every request times out.
func TestWaitingAttemptTimeout(t *testing.T) {
	srv := testserver.StartEtcd(t)
	b := open(t, srv.URL("dlock")+"?timeout=1ns")
	defer b.Close()
	ctx := context.Background()
	key := drivertest.Key(t, "k")
	w, err := b.Watch(ctx, key, "waiter")
	if err != nil {
		t.Fatal(err)
	}
	_, err = b.Acquire(ctx, driver.Request{Key: key, Owner: "waiter", TTL: time.Minute, Wait: true, Patience: time.Minute})
	if !errors.Is(err, driver.ErrLocked) || !strings.Contains(err.Error(), "etcdlock") {
		t.Fatalf("waiting attempt past the request timeout = %v, want an etcdlock error matching ErrLocked", err)
	}
	_ = w.Stop(ctx, false) // times out too: nothing was written
	// An attempt that will not wait still fails with the timeout.
	if _, err := b.Acquire(ctx, driver.Request{Key: key, Owner: "other", TTL: time.Minute}); errors.Is(err, driver.ErrLocked) || !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("TryLock attempt past the request timeout = %v, want DeadlineExceeded", err)
	}
}

// A waiter that queues writes the lock's tail key, naming its member key, on its
// lease; the next waiter watches the member the tail names; the tail goes when the
// member it names is deleted. The chain still hands the lock over in order.
func TestQueueTail(t *testing.T) {
	srv := testserver.StartEtcd(t)
	cli := rawClient(t, srv.Endpoint())
	b := open(t, srv.URL("dlock"))
	defer b.Close()
	ctx := context.Background()
	key := drivertest.Key(t, "k")
	tail := strings.TrimSuffix(b.LockPrefix(key), "\x1f") + "\x1e"
	req := func(owner string) driver.Request {
		return driver.Request{Key: key, Owner: owner, TTL: time.Minute, Wait: true, Patience: time.Minute}
	}
	if _, err := b.Acquire(ctx, req("holder")); err != nil {
		t.Fatal(err)
	}
	tailValue := func() string {
		resp, err := cli.Get(ctx, tail)
		if err != nil {
			t.Fatal(err)
		}
		if len(resp.Kvs) == 0 {
			return ""
		}
		return string(resp.Kvs[0].Value)
	}
	w, err := b.Watch(ctx, key, "waiter")
	if err != nil {
		t.Fatal(err)
	}
	defer w.Stop(ctx, false)
	_, err = b.Acquire(ctx, req("waiter"))
	var held *driver.HeldError
	if !errors.As(err, &held) || held.Ahead != 0 {
		t.Fatalf("waiter's attempt = %v, want a HeldError with no one ahead but the holder", err)
	}
	members, err := cli.Get(ctx, b.LockPrefix(key), clientv3.WithPrefix(), clientv3.WithSort(clientv3.SortByCreateRevision, clientv3.SortAscend))
	if err != nil || len(members.Kvs) != 2 {
		t.Fatalf("members = %v, %v; want 2", members, err)
	}
	if got, want := tailValue(), string(members.Kvs[1].Key); got != want {
		t.Fatalf("tail = %q, want the waiter's member key %q", got, want)
	}
	if err := b.Release(ctx, key, "holder"); err != nil {
		t.Fatal(err)
	}
	<-w.C() // woken by the holder's release (else the test times out)
	if _, err := b.Acquire(ctx, req("waiter")); err != nil {
		t.Fatalf("woken waiter's attempt: %v", err)
	}
	if err := b.Release(ctx, key, "waiter"); err != nil {
		t.Fatal(err)
	}
	if got := tailValue(); got != "" {
		t.Fatalf("tail = %q after the member it names was released, want it gone", got)
	}
}

// A waiting attempt that queues reports the members ahead of its own, the holder not
// counted (driver.HeldError.Ahead), read from the count of the reply it gets anyway.
func TestPlaceInQueue(t *testing.T) {
	srv := testserver.StartEtcd(t)
	ctx := context.Background()
	b := open(t, srv.URL("place"))
	defer b.Close()
	if _, err := b.Acquire(ctx, driver.Request{Key: "k", Owner: "holder", TTL: 10e9}); err != nil {
		t.Fatal(err)
	}
	for i, w := range []string{"w0", "w1", "w2"} {
		_, err := b.Acquire(ctx, driver.Request{Key: "k", Owner: w, TTL: 10e9, Wait: true, Patience: 10e9})
		var held *driver.HeldError
		if !errors.As(err, &held) {
			t.Fatalf("%s: %v, want a *driver.HeldError", w, err)
		}
		if held.Ahead != i {
			t.Fatalf("%s queued with %d ahead, want %d", w, held.Ahead, i)
		}
	}
	for _, o := range []string{"holder", "w0", "w1", "w2"} {
		if err := b.Release(ctx, "k", o); err != nil {
			t.Fatalf("release %s: %v", o, err)
		}
	}
}
