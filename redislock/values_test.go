package redislock

import (
	"bytes"
	"context"
	"errors"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/dlockio/dlock/driver"
	"github.com/dlockio/dlock/internal/testserver"
)

// Tests of values and holder watches at the driver level, inside the package: they
// look at the keys and the subscriptions on the server.

// rawRedis returns a plain client to srv, closed when the test ends.
func rawRedis(t *testing.T, srv *testserver.Redis) *redis.Client {
	t.Helper()
	rdb := redis.NewClient(&redis.Options{Addr: srv.Addr()})
	t.Cleanup(func() { rdb.Close() })
	return rdb
}

// wantValue checks the value Inspect reads for key and, on the server, that the
// value key exists exactly when there is a value, expiring with the lock key.
func wantValue(t *testing.T, b *Backend, rdb *redis.Client, key, owner string, want []byte) {
	t.Helper()
	ctx := context.Background()
	info, err := b.Inspect(ctx, key)
	if err != nil || info.Owner != owner || !bytes.Equal(info.Value, want) {
		t.Fatalf("Inspect = owner %q value %q (%v), want %q with %q", info.Owner, info.Value, err, owner, want)
	}
	lk, vk := b.LockKey(key), b.LockKey(key)+valueSuffix
	n, err := rdb.Exists(ctx, vk).Result()
	if err != nil {
		t.Fatal(err)
	}
	if n != int64(min(len(want), 1)) {
		t.Fatalf("value key exists: %d, want a value %q", n, want)
	}
	if n == 1 {
		at1, err1 := rdb.PExpireTime(ctx, lk).Result()
		at2, err2 := rdb.PExpireTime(ctx, vk).Result()
		if err1 != nil || err2 != nil || at1 != at2 || at1 <= 0 {
			t.Fatalf("lock key expires at %v (%v), value key at %v (%v)", at1, err1, at2, err2)
		}
	}
}

// The value lives with the grant: set by Acquire, extended by Refresh, replaced
// by SetValue (TTL unchanged) and by a re-entry, and gone with a release, a force
// release or the expiry.
func TestValueLivesWithGrant(t *testing.T) {
	srv := testserver.StartRedis(t)
	ctx := context.Background()
	b, rdb := openBackend(t, srv), rawRedis(t, srv)
	val := []byte("a b\nc\x00\xff ") // any bytes: spaces, a newline, a NUL
	req := driver.Request{Key: "k", Owner: "o", TTL: time.Minute, Value: val}
	g, err := b.Acquire(ctx, req)
	if err != nil {
		t.Fatal(err)
	}
	wantValue(t, b, rdb, "k", "o", val)
	if err := b.Refresh(ctx, "k", "o", 2*time.Minute); err != nil {
		t.Fatal(err)
	}
	wantValue(t, b, rdb, "k", "o", val)
	before, _ := rdb.PExpireTime(ctx, b.LockKey("k")).Result()
	time.Sleep(5 * time.Millisecond)
	if err := b.SetValue(ctx, "k", "o", []byte("x")); err != nil {
		t.Fatal(err)
	}
	wantValue(t, b, rdb, "k", "o", []byte("x"))
	if after, _ := rdb.PExpireTime(ctx, b.LockKey("k")).Result(); after != before {
		t.Fatalf("SetValue moved the expiry from %d to %d", before, after)
	}
	if err := b.SetValue(ctx, "k", "other", []byte("y")); !errors.Is(err, driver.ErrNotHeld) {
		t.Fatalf("SetValue by another owner = %v, want ErrNotHeld", err)
	}
	if err := b.SetValue(ctx, "k", "o", nil); err != nil {
		t.Fatal(err)
	}
	wantValue(t, b, rdb, "k", "o", nil)
	if err := b.SetValue(ctx, "k", "o", []byte("z")); err != nil {
		t.Fatal(err)
	}
	wantValue(t, b, rdb, "k", "o", []byte("z"))

	// A re-entry replaces the value with its own, or drops it.
	req.Reenter, req.Value = true, []byte("r")
	if g2, err := b.Acquire(ctx, req); err != nil || g2.Token != g.Token {
		t.Fatalf("re-entry: %+v, %v; want token %d", g2, err, g.Token)
	}
	wantValue(t, b, rdb, "k", "o", []byte("r"))
	req.Value = nil
	if _, err := b.Acquire(ctx, req); err != nil {
		t.Fatal(err)
	}
	wantValue(t, b, rdb, "k", "o", nil)
	req.Value = []byte("r2")
	if _, err := b.Acquire(ctx, req); err != nil {
		t.Fatal(err)
	}
	wantValue(t, b, rdb, "k", "o", []byte("r2"))

	gone := func(what string) {
		t.Helper()
		if n, err := rdb.Exists(ctx, b.LockKey("k"), b.LockKey("k")+valueSuffix).Result(); err != nil || n != 0 {
			t.Fatalf("after %s: %d of the lock and value keys left (%v)", what, n, err)
		}
	}
	if err := b.Release(ctx, "k", "o"); err != nil {
		t.Fatal(err)
	}
	gone("a release")
	req.Reenter = false
	if _, err := b.Acquire(ctx, req); err != nil {
		t.Fatal(err)
	}
	if err := b.ForceRelease(ctx, "k"); err != nil {
		t.Fatal(err)
	}
	gone("a force release")
	req.TTL = 50 * time.Millisecond
	if _, err := b.Acquire(ctx, req); err != nil {
		t.Fatal(err)
	}
	time.Sleep(100 * time.Millisecond)
	gone("the expiry")
	if err := b.SetValue(ctx, "k", "o", []byte("late")); !errors.Is(err, driver.ErrNotHeld) {
		t.Fatalf("SetValue after the expiry = %v, want ErrNotHeld", err)
	}
	// A grant without a value after one with a value has none.
	if _, err := b.Acquire(ctx, driver.Request{Key: "k", Owner: "p", TTL: time.Minute}); err != nil {
		t.Fatal(err)
	}
	wantValue(t, b, rdb, "k", "p", nil)
}

// A queued waiter's value is kept with its place and set by the release that hands
// it the key; a waiter without a value gets none, and one with a value in its
// place still withdraws.
func TestValueHandedToWaiter(t *testing.T) {
	srv := testserver.StartRedis(t)
	ctx := context.Background()
	holder, b, rdb := openBackend(t, srv), openBackend(t, srv), rawRedis(t, srv)
	if _, err := holder.Acquire(ctx, driver.Request{Key: "k", Owner: "holder", TTL: time.Minute, Value: []byte("h")}); err != nil {
		t.Fatal(err)
	}
	queueValued := func(owner string, value []byte) *waiter {
		t.Helper()
		w, err := b.Watch(ctx, "k", owner)
		if err != nil {
			t.Fatal(err)
		}
		req := driver.Request{Key: "k", Owner: owner, TTL: time.Minute, Wait: true, Patience: time.Minute, Value: value}
		if _, err := b.Acquire(ctx, req); !errors.Is(err, driver.ErrLocked) {
			t.Fatalf("waiting Acquire on a held key: %v, want ErrLocked", err)
		}
		return w.(*waiter)
	}
	val := []byte("w 1\n2 ")
	w1 := queueValued("w1", val)
	gaveUp := queueValued("quitter", []byte("q q"))
	w2 := queueValued("w2", nil)
	if err := gaveUp.Stop(ctx, false); err != nil {
		t.Fatal(err)
	}
	if n, err := rdb.Exists(ctx, waiterKey(b.prefix, "k", "quitter")).Result(); err != nil || n != 0 {
		t.Fatalf("the place of a waiter that gave up is left (%d, %v)", n, err)
	}
	if err := holder.Release(ctx, "k", "holder"); err != nil {
		t.Fatal(err)
	}
	wake(t, w1)
	wantValue(t, holder, rdb, "k", "w1", val)
	if _, err := b.Acquire(ctx, driver.Request{Key: "k", Owner: "w1", TTL: time.Minute, Wait: true, Patience: time.Minute, Value: val}); err != nil {
		t.Fatal(err)
	}
	if err := w1.Stop(ctx, true); err != nil {
		t.Fatal(err)
	}
	if err := b.Release(ctx, "k", "w1"); err != nil {
		t.Fatal(err)
	}
	wake(t, w2)
	wantValue(t, holder, rdb, "k", "w2", nil)
	if err := w2.Stop(ctx, false); err != nil { // passes the handed grant on: to nobody
		t.Fatal(err)
	}
	if _, err := holder.Inspect(ctx, "k"); !errors.Is(err, driver.ErrNotHeld) {
		t.Fatalf("Inspect after the last waiter gave up = %v, want ErrNotHeld", err)
	}
}

// notified waits for a notification on w.
func notified(t *testing.T, w driver.HolderWatch, what string) {
	t.Helper()
	select {
	case <-w.C():
	case <-time.After(10 * time.Second):
		t.Fatalf("no notification after %s", what)
	}
}

// quiet checks that w has no notification pending.
func quiet(t *testing.T, w driver.HolderWatch, when string) {
	t.Helper()
	time.Sleep(20 * time.Millisecond)
	select {
	case <-w.C():
		t.Fatalf("a notification %s", when)
	default:
	}
}

// numSub returns how many connections subscribe to channel ch.
func numSub(t *testing.T, rdb *redis.Client, ch string) int64 {
	t.Helper()
	m, err := rdb.PubSubNumSub(context.Background(), ch).Result()
	if err != nil {
		t.Fatal(err)
	}
	return m[ch]
}

// Holder watches share the client's one pub/sub connection, a key's watches one
// subscription, which the last to stop ends; a watch is not notified at its
// start, and is notified once after the connection is re-established.
func TestHolderWatchSubscriptions(t *testing.T) {
	srv := testserver.StartRedis(t)
	ctx := context.Background()
	b, other, rdb := openBackend(t, srv), openBackend(t, srv), rawRedis(t, srv)
	w1, err := b.WatchHolder(ctx, "k")
	if err != nil {
		t.Fatal(err)
	}
	w2, err := b.WatchHolder(ctx, "k")
	if err != nil {
		t.Fatal(err)
	}
	w3, err := b.WatchHolder(ctx, "j")
	if err != nil {
		t.Fatal(err)
	}
	defer w3.Stop()
	quiet(t, w1, "at the start")
	ch := b.holderChannel("k")
	if n := numSub(t, rdb, ch); n != 1 {
		t.Fatalf("%d subscriptions to the holder channel, want 1", n)
	}
	clients, err := rdb.ClientList(ctx).Result()
	if err != nil {
		t.Fatal(err)
	}
	if n := bytes.Count([]byte(clients), []byte("flags=P")); n != 1 {
		t.Fatalf("%d pub/sub connections, want 1:\n%s", n, clients)
	}

	if _, err := other.Acquire(ctx, driver.Request{Key: "k", Owner: "o", TTL: time.Minute}); err != nil {
		t.Fatal(err)
	}
	notified(t, w1, "a grant")
	notified(t, w2, "a grant")
	quiet(t, w3, "for another key")

	// A broken connection: once go-redis has subscribed again, one notification.
	if err := rdb.ClientKillByFilter(ctx, "TYPE", "pubsub").Err(); err != nil {
		t.Fatal(err)
	}
	notified(t, w1, "a reconnect")
	notified(t, w3, "a reconnect")
	if err := other.Release(ctx, "k", "o"); err != nil {
		t.Fatal(err)
	}
	notified(t, w1, "a release after the reconnect")

	w1.Stop()
	w1.Stop() // a second Stop does nothing
	if n := numSub(t, rdb, ch); n != 1 {
		t.Fatalf("after one of two watches stopped: %d subscriptions, want 1", n)
	}
	w2.Stop()
	unsubscribed(t, rdb, ch, "after its last watch stopped")

	// A watch that could not start leaves no subscription.
	dead, cancel := context.WithCancel(ctx)
	cancel()
	if w, err := b.WatchHolder(dead, "k"); err == nil {
		w.Stop()
		t.Log("WatchHolder with a cancelled context succeeded")
	}
	unsubscribed(t, rdb, ch, "after a cancelled WatchHolder")
}

// unsubscribed waits until no connection subscribes to ch (an UNSUBSCRIBE is not
// answered before it returns).
func unsubscribed(t *testing.T, rdb *redis.Client, ch, when string) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for numSub(t, rdb, ch) != 0 {
		if time.Now().After(deadline) {
			t.Fatalf("the holder channel is still subscribed %s", when)
		}
		time.Sleep(5 * time.Millisecond)
	}
}
