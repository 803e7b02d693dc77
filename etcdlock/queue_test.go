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
	"github.com/dlockio/dlock/etcdlock"
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

// tailKeyOf is the name of key's tail key (see tailSep).
func tailKeyOf(b *etcdlock.Backend, key string) string {
	return strings.TrimSuffix(b.LockPrefix(key), "\x1f") + "\x1e"
}

// tailOfLock returns the member key that key's tail names, "" without a tail.
func tailOfLock(t *testing.T, cli *clientv3.Client, b *etcdlock.Backend, key string) string {
	t.Helper()
	resp, err := cli.Get(context.Background(), tailKeyOf(b, key))
	if err != nil {
		t.Fatal(err)
	}
	if len(resp.Kvs) == 0 {
		return ""
	}
	return string(resp.Kvs[0].Value)
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
	req := func(owner string) driver.Request {
		return driver.Request{Key: key, Owner: owner, TTL: time.Minute, Wait: true, Patience: time.Minute}
	}
	if _, err := b.Acquire(ctx, req("holder")); err != nil {
		t.Fatal(err)
	}
	tailValue := func() string { return tailOfLock(t, cli, b, key) }
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

// A grant made on a lock with nothing in it (no member, tail or limit key), by a
// waiting attempt or a TryLock, writes no tail, and its release leaves alone the
// tail of a waiter that queued behind it. A waiter that withdraws leaves its tail.
// A lock whose tail is still there (left by a member deleted behind its client's
// back, or a withdrawn wait) is not taken for empty: the attempt writes the tail
// as a queueing one does.
func TestTaillessGrant(t *testing.T) {
	srv := testserver.StartEtcd(t)
	cli := rawClient(t, srv.Endpoint())
	b := open(t, srv.URL("dlock"))
	defer b.Close()
	ctx := context.Background()
	key := drivertest.Key(t, "k")
	tail := tailKeyOf(b, key)
	tailValue := func() string { return tailOfLock(t, cli, b, key) }
	req := func(owner string, wait bool) driver.Request {
		return driver.Request{Key: key, Owner: owner, TTL: time.Minute, Wait: wait, Patience: time.Minute}
	}
	for _, wait := range []bool{false, true} {
		if _, err := b.Acquire(ctx, req("holder", wait)); err != nil {
			t.Fatal(err)
		}
		if got := tailValue(); got != "" {
			t.Fatalf("grant of a free lock (wait %v) wrote tail %q, want none", wait, got)
		}
		if err := b.Release(ctx, key, "holder"); err != nil {
			t.Fatal(err)
		}
	}

	// A waiter behind the tail-less holder writes the tail; the holder's release
	// keeps it, the waiter's deletes it.
	if _, err := b.Acquire(ctx, req("holder", true)); err != nil {
		t.Fatal(err)
	}
	w, err := b.Watch(ctx, key, "waiter")
	if err != nil {
		t.Fatal(err)
	}
	defer w.Stop(ctx, false)
	if _, err := b.Acquire(ctx, req("waiter", true)); !errors.Is(err, driver.ErrLocked) {
		t.Fatalf("waiter's attempt = %v, want ErrLocked", err)
	}
	mine := member(t, cli, b, key, "waiter")
	if got := tailValue(); got != string(mine.Key) {
		t.Fatalf("tail = %q, want the waiter's member key %q", got, mine.Key)
	}
	if err := b.Release(ctx, key, "holder"); err != nil {
		t.Fatal(err)
	}
	select {
	case <-w.C():
	case <-time.After(drivertest.Wait):
		t.Fatal("waiter not woken by the tail-less holder's release")
	}
	if got := tailValue(); got != string(mine.Key) {
		t.Fatalf("tail = %q after the holder's release, want the waiter's %q still", got, mine.Key)
	}
	if g, err := b.Acquire(ctx, req("waiter", true)); err != nil || g.Token != uint64(mine.CreateRevision) {
		t.Fatalf("woken waiter's attempt = %+v, %v; want its member's token %d", g, err, mine.CreateRevision)
	}
	if err := b.Release(ctx, key, "waiter"); err != nil {
		t.Fatal(err)
	}
	if got := tailValue(); got != "" {
		t.Fatalf("tail = %q after the waiter's release, want it gone", got)
	}

	// A waiter that withdraws leaves its tail (stale), so the next waiter's write
	// finds a tail and writes its own; the chain still hands over in order.
	if _, err := b.Acquire(ctx, req("holder", true)); err != nil {
		t.Fatal(err)
	}
	gone, err := b.Watch(ctx, key, "gone")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := b.Acquire(ctx, req("gone", true)); !errors.Is(err, driver.ErrLocked) {
		t.Fatalf("withdrawing waiter's attempt = %v, want ErrLocked", err)
	}
	stale := string(member(t, cli, b, key, "gone").Key)
	if err := gone.Stop(ctx, false); err != nil {
		t.Fatal(err)
	}
	if got := tailValue(); got != stale {
		t.Fatalf("tail = %q after a waiter withdrew, want its stale %q", got, stale)
	}
	next, err := b.Watch(ctx, key, "next")
	if err != nil {
		t.Fatal(err)
	}
	defer next.Stop(ctx, false)
	if _, err := b.Acquire(ctx, req("next", true)); !errors.Is(err, driver.ErrLocked) {
		t.Fatalf("next waiter's attempt = %v, want ErrLocked", err)
	}
	if got, want := tailValue(), string(member(t, cli, b, key, "next").Key); got != want {
		t.Fatalf("tail = %q after the next waiter queued, want its %q", got, want)
	}
	if err := b.Release(ctx, key, "holder"); err != nil {
		t.Fatal(err)
	}
	// Woken at once by the stale tail's member being gone (its attempt then
	// follows the holder), and by the holder's release.
	for i := 0; ; i++ {
		select {
		case <-next.C():
		case <-time.After(drivertest.Wait):
			t.Fatal("next waiter not woken by the holder's release")
		}
		_, err := b.Acquire(ctx, req("next", true))
		if err == nil {
			break
		}
		if !errors.Is(err, driver.ErrLocked) || i == 2 {
			t.Fatalf("woken next waiter's attempt %d = %v", i, err)
		}
	}
	if err := b.Release(ctx, key, "next"); err != nil {
		t.Fatal(err)
	}

	// A tail left on a lock without members: the lock is not empty, so the
	// grant writes the tail (naming itself), and its release deletes it.
	if _, err := cli.Put(ctx, tail, "gone"); err != nil {
		t.Fatal(err)
	}
	if _, err := b.Acquire(ctx, req("holder", true)); err != nil {
		t.Fatal(err)
	}
	if got, want := tailValue(), string(member(t, cli, b, key, "holder").Key); got != want {
		t.Fatalf("tail = %q after a grant on a lock with a stale tail, want the holder's %q", got, want)
	}
	if err := b.Release(ctx, key, "holder"); err != nil {
		t.Fatal(err)
	}
	if got := tailValue(); got != "" {
		t.Fatalf("tail = %q after the release, want it gone", got)
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

// A waiting attempt that says Reenter without Resume (a generated owner id, this
// lock call's alone) queues behind a grant of its owner id made through another
// client instead of taking it over; with Resume (WithResume) it takes it over, with
// its token.
func TestReenterIsNotResume(t *testing.T) {
	srv := testserver.StartEtcd(t)
	b, other := open(t, srv.URL("dlock")), open(t, srv.URL("dlock"))
	defer b.Close()
	defer other.Close()
	ctx := context.Background()
	key := drivertest.Key(t, "k")
	g, err := other.Acquire(ctx, driver.Request{Key: key, Owner: "job-7", TTL: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	w, err := b.Watch(ctx, key, "job-7")
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = w.Stop(ctx, false) }()
	req := driver.Request{Key: key, Owner: "job-7", TTL: time.Minute, Wait: true, Patience: time.Minute, Reenter: true}
	for range 2 { // the second attempt is answered by the queued place
		if _, err := b.Acquire(ctx, req); !errors.Is(err, driver.ErrLocked) {
			t.Fatalf("waiting attempt with Reenter alone = %v, want ErrLocked (queued behind the other client's grant)", err)
		}
	}
	r, err := b.Acquire(ctx, driver.Request{Key: key, Owner: "job-7", TTL: time.Minute, Reenter: true, Resume: true})
	if err != nil || r.Token != g.Token {
		t.Fatalf("resume = %+v, %v; want token %d", r, err, g.Token)
	}
	if err := b.Release(ctx, key, "job-7"); err != nil {
		t.Fatal(err)
	}
}

// A woken waiter reads its place at the revision its watch saw the member ahead
// deleted; when that revision is compacted meanwhile, it reads the current one.
func TestWokenAfterCompaction(t *testing.T) {
	srv := testserver.StartEtcd(t)
	cli := rawClient(t, srv.Endpoint())
	b, b2 := open(t, srv.URL("dlock")), open(t, srv.URL("dlock"))
	defer b.Close()
	defer b2.Close()
	ctx := context.Background()
	key := drivertest.Key(t, "k")
	if _, err := b.Acquire(ctx, driver.Request{Key: key, Owner: "alice", TTL: time.Minute}); err != nil {
		t.Fatal(err)
	}
	w, err := b2.Watch(ctx, key, "bob")
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = w.Stop(ctx, true) }()
	req := driver.Request{Key: key, Owner: "bob", TTL: time.Minute, Wait: true, Patience: time.Minute}
	if _, err := b2.Acquire(ctx, req); !errors.Is(err, driver.ErrLocked) {
		t.Fatalf("queued attempt = %v", err)
	}
	if err := b.Release(ctx, key, "alice"); err != nil {
		t.Fatal(err)
	}
	select {
	case <-w.C():
	case <-time.After(drivertest.Wait):
		t.Fatal("waiter not woken by the release")
	}
	put, err := cli.Put(ctx, "unrelated", "x")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := cli.Compact(ctx, put.Header.Revision); err != nil {
		t.Fatal(err)
	}
	g, err := b2.Acquire(ctx, req)
	if err != nil {
		t.Fatalf("woken attempt after compaction = %v", err)
	}
	if m := member(t, cli, b2, key, "bob"); g.Token != uint64(m.CreateRevision) {
		t.Fatalf("token %d, want the member's create revision %d", g.Token, m.CreateRevision)
	}
	if err := b2.Release(ctx, key, "bob"); err != nil {
		t.Fatal(err)
	}
}
