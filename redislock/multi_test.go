package redislock

import (
	"context"
	"errors"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/dlockio/dlock/driver"
	"github.com/dlockio/dlock/internal/testserver"
)

// Tests of AcquireAll for what the conformance suite does not reach: keys that are
// a semaphore's or read-write lock's hash, lapsed holders and queued places that
// must not block the set, and the holder-change message of each grant.

func setReqs(owner string, keys ...string) []driver.Request {
	reqs := make([]driver.Request, len(keys))
	for i, k := range keys {
		reqs[i] = driver.Request{Key: k, Owner: owner, TTL: time.Minute}
	}
	return reqs
}

// A semaphore with a live holder refuses the set, naming its key, with the holder's
// TTL as RetryAfter, and changes nothing; a hash left with only lapsed holders and
// a queued place whose waiter is gone is free, and the set turns it into a mutex.
func TestAcquireAllOnHashes(t *testing.T) {
	srv := testserver.StartRedis(t)
	ctx := context.Background()
	b := openBackend(t, srv)
	rdb := b.Client()

	mustAcquire(t, b, semReq("s", "holder", 2))
	_, err := b.AcquireAll(ctx, setReqs("set", "a", "s", "z"))
	var held *driver.HeldError
	if !errors.As(err, &held) || !strings.Contains(err.Error(), `"s"`) {
		t.Fatalf("AcquireAll with a semaphore permit held: %v, want a HeldError naming \"s\"", err)
	}
	if held.RetryAfter <= 0 || held.RetryAfter > time.Minute {
		t.Fatalf("RetryAfter = %v, want the holder's TTL", held.RetryAfter)
	}
	for _, k := range []string{"a", "z"} {
		if n, err := rdb.Exists(ctx, b.LockKey(k)).Result(); err != nil || n != 0 {
			t.Fatalf("the refused set left %q's lock key (%d, %v)", k, n, err)
		}
	}
	if _, hs, err := b.Holders(ctx, "s"); err != nil || len(hs) != 1 || hs[0].Owner != "holder" {
		t.Fatalf("the semaphore after the refused set: %+v, %v", hs, err)
	}

	// A read-write lock's hash whose reader's grant has passed and whose queued
	// writer's place lapsed: the state a crash of both leaves until the hash
	// expires.
	lk := b.LockKey("r")
	if err := rdb.HSet(ctx, lk, "\x1flimit", "1 "+strconv.Itoa(len(b.prefix)), "reader", "1 7 \x1f-").Err(); err != nil {
		t.Fatal(err)
	}
	if err := rdb.RPush(ctx, queueKey(b.prefix, "r"), "gone").Err(); err != nil {
		t.Fatal(err)
	}
	if err := rdb.Set(ctx, b.TokenKey("r"), 7, 0).Err(); err != nil {
		t.Fatal(err)
	}
	gs, err := b.AcquireAll(ctx, setReqs("set", "a", "r", "z"))
	if err != nil || len(gs) != 3 {
		t.Fatalf("AcquireAll with a lapsed hash: %v, %v", gs, err)
	}
	if gs[1].Token <= 7 {
		t.Fatalf("token of r %d, not above its counter's 7", gs[1].Token)
	}
	for i, k := range []string{"a", "r", "z"} {
		info, err := b.Inspect(ctx, k)
		if err != nil || info.Owner != "set" || info.Token != gs[i].Token || info.TTL <= 0 {
			t.Fatalf("Inspect(%q) = %+v, %v; want owner set, token %d", k, info, err, gs[i].Token)
		}
	}
	if typ, err := rdb.Type(ctx, lk).Result(); err != nil || typ != "string" {
		t.Fatalf("r's lock key is a %s (%v), want a mutex's string", typ, err)
	}
	for _, k := range []string{"a", "r", "z"} {
		if err := b.Release(ctx, k, "set"); err != nil {
			t.Fatalf("Release(%q): %v", k, err)
		}
	}
}

// Every key the set is granted publishes on its holder channel, as Acquire does.
func TestAcquireAllNotifiesHolderWatches(t *testing.T) {
	srv := testserver.StartRedis(t)
	ctx := context.Background()
	b, watcher := openBackend(t, srv), openBackend(t, srv)
	keys := []string{"a", "b", "c"}
	watches := make([]driver.HolderWatch, len(keys))
	for i, k := range keys {
		w, err := watcher.WatchHolder(ctx, k)
		if err != nil {
			t.Fatal(err)
		}
		defer w.Stop()
		watches[i] = w
	}
	for i, w := range watches {
		select {
		case <-w.C():
			t.Fatalf("a holder message for %q before the set was granted", keys[i])
		default:
		}
	}
	if _, err := b.AcquireAll(ctx, setReqs("set", keys...)); err != nil {
		t.Fatal(err)
	}
	for i, w := range watches {
		select {
		case <-w.C():
		case <-time.After(10 * time.Second):
			t.Fatalf("no holder message for %q", keys[i])
		}
	}
}
