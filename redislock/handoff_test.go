package redislock

import (
	"context"
	"errors"
	"net/url"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/dlockio/dlock/driver"
	"github.com/dlockio/dlock/internal/storeops"
	"github.com/dlockio/dlock/internal/testserver"
)

// Tests of the direct handoff at the driver level, inside the package: they look at
// what a waiter was handed.

func openBackend(t *testing.T, srv *testserver.Redis) *Backend {
	t.Helper()
	u, err := url.Parse(srv.URL())
	if err != nil {
		t.Fatal(err)
	}
	b, err := Open(context.Background(), u)
	if err != nil {
		t.Fatalf("Open: %v", err)
	}
	t.Cleanup(func() { b.Close() })
	return b
}

// storeOps returns a direct connection to srv that counts its operations, closed
// when the test ends.
func storeOps(t testing.TB, srv *testserver.Redis) storeops.Store {
	t.Helper()
	s, err := storeops.Open(context.Background(), srv.URL())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

func queue(t *testing.T, ctx context.Context, b *Backend, key, owner string) *waiter {
	t.Helper()
	w, err := b.Watch(ctx, key, owner)
	if err != nil {
		t.Fatalf("Watch: %v", err)
	}
	req := driver.Request{Key: key, Owner: owner, TTL: time.Minute, Wait: true, Patience: time.Minute}
	if _, err := b.Acquire(ctx, req); !errors.Is(err, driver.ErrLocked) {
		t.Fatalf("waiting Acquire on a held key: %v, want ErrLocked", err)
	}
	return w.(*waiter)
}

func wake(t *testing.T, w *waiter) {
	t.Helper()
	select {
	case <-w.C():
	case <-time.After(10 * time.Second):
		t.Fatal("no handoff message")
	}
}

// The grant a release hands to a waiter comes back from its next Acquire without
// a request, with the token the server issued and an Age that covers the time since
// the waiter's attempt was sent.
func TestHandedGrantAge(t *testing.T) {
	srv := testserver.StartRedis(t)
	ctx := context.Background()
	holder, b := openBackend(t, srv), openBackend(t, srv)
	if _, err := holder.Acquire(ctx, driver.Request{Key: "k", Owner: "holder", TTL: time.Minute}); err != nil {
		t.Fatal(err)
	}
	sent := time.Now()
	w := queue(t, ctx, b, "k", "waiter")
	queued := time.Now() // the waiter's attempt was sent between sent and queued
	time.Sleep(50 * time.Millisecond)
	if err := holder.Release(ctx, "k", "holder"); err != nil {
		t.Fatal(err)
	}
	wake(t, w)
	info, err := holder.Inspect(ctx, "k")
	if err != nil || info.Owner != "waiter" {
		t.Fatalf("after the release the key is held by %+v (%v), want the waiter", info, err)
	}
	ops := storeOps(t, srv)
	ops0, err := ops.Ops(ctx)
	if err != nil {
		t.Fatal(err)
	}
	asked := time.Now()
	g, err := b.Acquire(ctx, driver.Request{Key: "k", Owner: "waiter", TTL: time.Minute, Wait: true, Patience: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	if ops1, err := ops.Ops(ctx); err != nil || ops1 != ops0 {
		t.Fatalf("taking a handed grant made %d server operations, want 0", ops1-ops0)
	}
	if g.Token != info.Token {
		t.Fatalf("handed token %d, the server has %d", g.Token, info.Token)
	}
	if min, max := asked.Sub(queued), time.Since(sent); g.Age < min || g.Age > max {
		t.Fatalf("Age %v, want between %v and %v", g.Age, min, max)
	}
	if err := w.Stop(ctx, true); err != nil {
		t.Fatal(err)
	}
	if err := b.Release(ctx, "k", "waiter"); err != nil {
		t.Fatalf("Release of the handed grant: %v", err)
	}
}

// A handoff message for an earlier wait of the same key and owner (whose Stop
// passed the grant on) is ignored by a later wait.
func TestStaleHandoffIgnored(t *testing.T) {
	srv := testserver.StartRedis(t)
	ctx := context.Background()
	holder, b := openBackend(t, srv), openBackend(t, srv)
	if _, err := holder.Acquire(ctx, driver.Request{Key: "k", Owner: "holder", TTL: time.Minute}); err != nil {
		t.Fatal(err)
	}
	w := queue(t, ctx, b, "k", "waiter")
	w.mu.Lock()
	first := w.first
	w.mu.Unlock()
	if !b.dispatch("waiter 99 " + strconv.FormatUint(first-1, 10) + " 60000 k") {
		t.Fatal("message not dispatched to the waiter")
	}
	if _, ok := w.take(60000); ok {
		t.Fatal("a message for an earlier wait was taken as a grant")
	}
	select {
	case <-w.C():
		t.Fatal("a message for an earlier wait woke the waiter")
	default:
	}
	// One for this wait's attempt is a grant.
	b.dispatch("waiter 99 " + strconv.FormatUint(first, 10) + " 60000 k")
	if g, ok := w.take(60000); !ok || g.Token != 99 || g.Age <= 0 {
		t.Fatalf("take = %+v, %v; want the grant", g, ok)
	}
	if err := w.Stop(ctx, false); err != nil {
		t.Fatal(err)
	}
}

// When the handoff message is lost, the waiter's next attempt asks the server,
// which finds the key already handed to the owner and re-enters it.
func TestLostHandoffMessage(t *testing.T) {
	srv := testserver.StartRedis(t)
	ctx := context.Background()
	holder, b := openBackend(t, srv), openBackend(t, srv)
	if _, err := holder.Acquire(ctx, driver.Request{Key: "k", Owner: "holder", TTL: time.Minute}); err != nil {
		t.Fatal(err)
	}
	w := queue(t, ctx, b, "k", "waiter")
	if err := holder.Release(ctx, "k", "holder"); err != nil {
		t.Fatal(err)
	}
	wake(t, w)
	w.handed.Store(nil) // lost
	info, err := holder.Inspect(ctx, "k")
	if err != nil {
		t.Fatal(err)
	}
	g, err := b.Acquire(ctx, driver.Request{Key: "k", Owner: "waiter", TTL: time.Minute, Wait: true, Patience: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	if g.Token != info.Token || g.Age != 0 {
		t.Fatalf("re-entry = %+v, want token %d and no Age", g, info.Token)
	}
	if err := w.Stop(ctx, true); err != nil {
		t.Fatal(err)
	}
	if err := b.Release(ctx, "k", "waiter"); err != nil {
		t.Fatal(err)
	}
}

// Two clients wait with the same owner id (one process resuming another's wait).
// The release hands the key to the one whose attempt came last; the other giving up
// does not release it.
func TestSameOwnerWithdrawKeepsOthersGrant(t *testing.T) {
	srv := testserver.StartRedis(t)
	ctx := context.Background()
	holder, b1, b2 := openBackend(t, srv), openBackend(t, srv), openBackend(t, srv)
	if _, err := holder.Acquire(ctx, driver.Request{Key: "k", Owner: "holder", TTL: time.Minute}); err != nil {
		t.Fatal(err)
	}
	w1 := queue(t, ctx, b1, "k", "same")
	w2 := queue(t, ctx, b2, "k", "same") // the place now names b2's channel
	if err := holder.Release(ctx, "k", "holder"); err != nil {
		t.Fatal(err)
	}
	wake(t, w2)
	if err := w1.Stop(ctx, false); err != nil {
		t.Fatal(err)
	}
	g, err := b2.Acquire(ctx, driver.Request{Key: "k", Owner: "same", TTL: time.Minute, Wait: true, Patience: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	info, err := holder.Inspect(ctx, "k")
	if err != nil || info.Owner != "same" || info.Token != g.Token {
		t.Fatalf("after the other waiter gave up: %+v (%v), want held by \"same\" with token %d", info, err, g.Token)
	}
	if err := w2.Stop(ctx, true); err != nil {
		t.Fatal(err)
	}
	if err := b2.Release(ctx, "k", "same"); err != nil {
		t.Fatal(err)
	}
}

// commandCalls reads the server's count of calls of each command (INFO
// commandstats; commands run by scripts count too).
func commandCalls(t *testing.T, rdb *redis.Client) map[string]int64 {
	t.Helper()
	info, err := rdb.Info(context.Background(), "commandstats").Result()
	if err != nil {
		t.Fatal(err)
	}
	calls := map[string]int64{}
	for line := range strings.Lines(info) {
		name, rest, ok := strings.Cut(strings.TrimPrefix(line, "cmdstat_"), ":calls=")
		if !ok {
			continue
		}
		n, _, _ := strings.Cut(rest, ",")
		calls[name], _ = strconv.ParseInt(n, 10, 64)
	}
	return calls
}

// On a hot key the scripts send no command for nothing: a waiting attempt reads
// the key before it would SET NX it (it is most often held), and a release that
// hands on a grant without a value deletes no value key. A waiting attempt that
// finds the key free takes it as a plain one does.
func TestHotPathCommands(t *testing.T) {
	srv := testserver.StartRedis(t)
	ctx := context.Background()
	holder, b, rdb := openBackend(t, srv), openBackend(t, srv), rawRedis(t, srv)
	first, err := holder.Acquire(ctx, driver.Request{Key: "k", Owner: "holder", TTL: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	before := commandCalls(t, rdb)
	w := queue(t, ctx, b, "k", "w") // a plain attempt, refused, then one that queues
	after := commandCalls(t, rdb)
	if n := after["set"] - before["set"]; n != 3 {
		t.Errorf("a Lock that queues behind a holder sent %d SETs, want 3 (the plain attempt's SET NX, the place, the queued mark)", n)
	}
	before = after
	if err := holder.Release(ctx, "k", "holder"); err != nil {
		t.Fatal(err)
	}
	wake(t, w)
	if n := commandCalls(t, rdb)["del"] - before["del"]; n != 0 {
		t.Errorf("handing on a grant without a value sent %d DELs, want 0", n)
	}
	g, err := b.Acquire(ctx, driver.Request{Key: "k", Owner: "w", TTL: time.Minute, Wait: true, Patience: time.Minute})
	if err != nil || g.Token <= first.Token {
		t.Fatalf("the waiter's Acquire after the handoff = %+v, %v; want a token above %d", g, err, first.Token)
	}
	if err := w.Stop(ctx, true); err != nil {
		t.Fatal(err)
	}

	// The key is hot for other: a Lock of it sends the waiting attempt at once,
	// which finds the key free once w has released it.
	other := openBackend(t, srv)
	if _, err := other.Acquire(ctx, driver.Request{Key: "k", Owner: "other", TTL: time.Minute}); !errors.Is(err, driver.ErrLocked) {
		t.Fatalf("Acquire of a held key = %v, want ErrLocked", err)
	}
	if err := b.Release(ctx, "k", "w"); err != nil {
		t.Fatal(err)
	}
	ow, err := other.Watch(ctx, "k", "other")
	if err != nil {
		t.Fatal(err)
	}
	defer ow.Stop(ctx, true)
	before = commandCalls(t, rdb)
	g2, err := other.Acquire(ctx, driver.Request{Key: "k", Owner: "other", TTL: time.Minute, Wait: true, Patience: time.Minute})
	if err != nil || g2.Token <= g.Token {
		t.Fatalf("a waiting Acquire of a free hot key = %+v, %v; want a token above %d", g2, err, g.Token)
	}
	if n := commandCalls(t, rdb)["evalsha"] - before["evalsha"]; n != 1 {
		t.Errorf("a waiting Acquire of a free hot key ran %d scripts, want 1", n)
	}
	if v, err := rdb.Get(ctx, lockKey(other.prefix, "k")).Result(); err != nil || v != "other" {
		t.Fatalf("lock key = %q, %v; want the owner id without marks", v, err)
	}
}
