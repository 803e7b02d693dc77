package redlock_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/dlockio/dlock/driver"
	"github.com/dlockio/dlock/internal/testserver"
)

// A waiter queued behind others on a majority answers its fallback attempts without
// a request (each ran a script on every node: at thousands of waiters, those
// scripts starved the holder's calls past the node timeout), and says how many are
// ahead of it. Once its client's subscriptions are up, a waiting attempt costs no
// command on any node; the chain still passes the key down by wake-ups.
func TestQueuedWaiterAnswersLocally(t *testing.T) {
	nodes := testserver.StartRedisNodes(t, 5)
	u := testserver.RedlockURL(nodes, testQuery)
	ctx := ctxT(t)
	hb, b1, b2 := open(t, u), open(t, u), open(t, u)
	defer hb.Close()
	defer b1.Close()
	defer b2.Close()
	const key = "local-answers"
	req := func(owner string) driver.Request {
		return driver.Request{Key: key, Owner: owner, TTL: time.Minute, Wait: true, Patience: time.Minute}
	}
	if _, err := hb.Acquire(ctx, driver.Request{Key: key, Owner: "holder", TTL: time.Minute}); err != nil {
		t.Fatal(err)
	}
	w1, err := b1.Watch(ctx, key, "w1")
	if err != nil {
		t.Fatal(err)
	}
	defer w1.Stop(context.WithoutCancel(ctx), false)
	w2, err := b2.Watch(ctx, key, "w2")
	if err != nil {
		t.Fatal(err)
	}
	defer w2.Stop(context.WithoutCancel(ctx), false)
	attempt := func(b driver.Backend, owner string) int {
		t.Helper()
		_, err := b.Acquire(ctx, req(owner))
		var held *driver.HeldError
		if !errors.As(err, &held) {
			t.Fatalf("waiting attempt of %s = %v, want a HeldError", owner, err)
		}
		return held.Ahead
	}
	if got := attempt(b1, "w1"); got != 0 {
		t.Fatalf("first waiter: Ahead = %d, want 0", got)
	}
	if got := attempt(b2, "w2"); got != 1 {
		t.Fatalf("second waiter: Ahead = %d, want 1", got)
	}
	// The subscriptions start with the first queued attempt; until every node has
	// confirmed its own, attempts ask the nodes.
	direct := store(t, u)
	ops := func() int64 {
		n, err := direct.Ops(ctx)
		if err != nil {
			t.Fatal(err)
		}
		return n
	}
	local := false
	for range 500 {
		before := ops()
		ahead := attempt(b2, "w2")
		if ops() == before {
			if ahead != 1 {
				t.Fatalf("second waiter answered locally: Ahead = %d, want 1", ahead)
			}
			local = true
			break
		}
		time.Sleep(10 * time.Millisecond)
	}
	if !local {
		t.Fatal("every waiting attempt of a queued waiter ran commands on the nodes")
	}

	if err := hb.Release(ctx, key, "holder"); err != nil {
		t.Fatal(err)
	}
	select {
	case <-w1.C():
	case <-ctx.Done():
		t.Fatal("the first waiter was not woken by the release")
	}
	if _, err := b1.Acquire(ctx, req("w1")); err != nil {
		t.Fatalf("first waiter after the release: %v", err)
	}
	if err := b1.Release(ctx, key, "w1"); err != nil {
		t.Fatal(err)
	}
	for {
		select {
		case <-w2.C():
		case <-ctx.Done():
			t.Fatal("the second waiter was not woken by the release")
		}
		// The wake-up may be the first one of the subscriptions (or an early copy
		// of the release's message): attempt until granted, as the core does.
		_, err := b2.Acquire(ctx, req("w2"))
		if err == nil {
			break
		}
		if !errors.Is(err, driver.ErrLocked) {
			t.Fatalf("second waiter after the release: %v", err)
		}
	}
	if err := b2.Release(ctx, key, "w2"); err != nil {
		t.Fatal(err)
	}
}
