package redlock_test

import (
	"bytes"
	"errors"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/dlockio/dlock/driver"
	"github.com/dlockio/dlock/internal/testserver"
	"github.com/dlockio/dlock/redlock"
)

// The value is part of the lock on every node: written with the grant, kept by the
// token's commit, restored with the lock on a node that lost it, replaced by
// SetValue on a majority (TTL unchanged); Inspect reads the majority's value.
func TestValueOnEveryNode(t *testing.T) {
	nodes := testserver.StartRedisNodes(t, 5)
	raw := rawClients(t, nodes)
	ctx := ctxT(t)
	a := open(t, testserver.RedlockURL(nodes, testQuery)) // driven by hand
	defer a.Close()
	val := []byte("a b\x00c\n ") // any bytes
	// A new client has no proposal: the token is settled by a commit round.
	g, err := a.Acquire(ctx, driver.Request{Key: "k", Owner: "alice", TTL: time.Minute, Value: val})
	if err != nil {
		t.Fatal(err)
	}
	tok := strconv.FormatUint(g.Token, 10)
	onNodes := func(want string, idx ...int) {
		t.Helper()
		for _, i := range idx {
			if v, err := raw[i].Get(ctx, a.LockKey("k")).Result(); err != nil || v != want {
				t.Fatalf("node %d holds %q (%v), want %q", i, v, err, want)
			}
		}
	}
	all := []int{0, 1, 2, 3, 4}
	onNodes("alice "+tok+" "+string(val), all...)
	wantInfo := func(value string) {
		t.Helper()
		info, err := a.Inspect(ctx, "k")
		if err != nil || info.Owner != "alice" || info.Token != g.Token || !bytes.Equal(info.Value, []byte(value)) {
			t.Fatalf("Inspect = %+v (value %q), %v; want alice, token %d, value %q", info, info.Value, err, g.Token, value)
		}
	}
	wantInfo(string(val))

	// A renewal restores the lock, value and all, on nodes that lost it.
	for _, r := range raw[:2] {
		r.Del(ctx, a.LockKey("k"))
	}
	if err := a.Refresh(ctx, "k", "alice", time.Minute); err != nil {
		t.Fatal(err)
	}
	onNodes("alice "+tok+" "+string(val), 0, 1)

	// SetValue leaves the TTL as it was.
	before, _ := raw[0].PExpireTime(ctx, a.LockKey("k")).Result()
	time.Sleep(5 * time.Millisecond)
	if err := a.SetValue(ctx, "k", "alice", []byte("v2")); err != nil {
		t.Fatal(err)
	}
	onNodes("alice "+tok+" v2", all...)
	if after, _ := raw[0].PExpireTime(ctx, a.LockKey("k")).Result(); after != before {
		t.Fatalf("SetValue moved the expiry from %d to %d", before, after)
	}
	if err := a.SetValue(ctx, "k", "alice", nil); err != nil {
		t.Fatal(err)
	}
	onNodes("alice "+tok, all...)
	wantInfo("")
	if err := a.SetValue(ctx, "k", "alice", []byte("v3")); err != nil {
		t.Fatal(err)
	}

	// Inspect reads the value a majority holds, and refuses to guess without one.
	for _, r := range raw[:2] {
		r.Set(ctx, a.LockKey("k"), "alice "+tok+" other", redis.KeepTTL)
	}
	wantInfo("v3")
	raw[2].Set(ctx, a.LockKey("k"), "alice "+tok+" third", redis.KeepTTL)
	var qe *redlock.QuorumError
	if _, err := a.Inspect(ctx, "k"); !errors.As(err, &qe) || errors.Is(err, driver.ErrNotHeld) {
		t.Fatalf("Inspect with values other, other, third, v3, v3 = %v, want a QuorumError", err)
	}
	// A re-entry replaces the value everywhere.
	if _, err := a.Acquire(ctx, driver.Request{Key: "k", Owner: "alice", TTL: time.Minute, Reenter: true, Value: []byte("r")}); err != nil {
		t.Fatal(err)
	}
	onNodes("alice "+tok+" r", all...)

	// SetValue needs a majority: it fails when another owner holds one, and when
	// too many nodes are down to tell.
	if err := a.SetValue(ctx, "k", "bob", []byte("x")); !errors.Is(err, driver.ErrNotHeld) {
		t.Fatalf("SetValue by another owner = %v, want ErrNotHeld", err)
	}
	nodes[3].Kill()
	nodes[4].Kill()
	if err := a.SetValue(ctx, "k", "alice", []byte("v4")); err != nil {
		t.Fatalf("SetValue with 3 of 5 nodes up: %v", err)
	}
	nodes[2].Kill()
	if err := a.SetValue(ctx, "k", "alice", []byte("v5")); err == nil || errors.Is(err, driver.ErrNotHeld) {
		t.Fatalf("SetValue with 2 of 5 nodes up = %v, want an error that is not ErrNotHeld", err)
	}
}

// holderCh is the holder channel of key on a (see names.go).
func holderCh(a *redlock.Backend, key string) string { return a.LockKey(key) + "\x1fholder" }

func notified(t *testing.T, w driver.HolderWatch, what string) {
	t.Helper()
	select {
	case <-w.C():
	case <-time.After(10 * time.Second):
		t.Fatalf("no notification after %s", what)
	}
}

// drain waits a little and takes a pending notification, if any.
func drain(w driver.HolderWatch) {
	time.Sleep(50 * time.Millisecond)
	select {
	case <-w.C():
	default:
	}
}

// Holder watches use one subscriber connection per node and one subscription per
// key; any node's message notifies, and so does a node that subscribes again after
// a reconnect, or late because it was down; the last Stop unsubscribes everywhere.
func TestHolderWatchNodes(t *testing.T) {
	nodes := testserver.StartRedisNodes(t, 3)
	raw := rawClients(t, nodes)
	ctx := ctxT(t)
	a := open(t, testserver.RedlockURL(nodes, testQuery+"&dial_timeout=500ms"))
	defer a.Close()
	w1, err := a.WatchHolder(ctx, "k")
	if err != nil {
		t.Fatal(err)
	}
	w2, err := a.WatchHolder(ctx, "k")
	if err != nil {
		t.Fatal(err)
	}
	w3, err := a.WatchHolder(ctx, "j")
	if err != nil {
		t.Fatal(err)
	}
	defer w3.Stop()
	ch := holderCh(a, "k")
	numSub := func(i int) int64 {
		t.Helper()
		m, err := raw[i].PubSubNumSub(ctx, ch).Result()
		if err != nil {
			t.Fatal(err)
		}
		return m[ch]
	}
	eventually := func(what string, ok func() bool) {
		t.Helper()
		for deadline := time.Now().Add(5 * time.Second); !ok(); time.Sleep(5 * time.Millisecond) {
			if time.Now().After(deadline) {
				t.Fatalf("not so after 5s: %s", what)
			}
		}
	}
	for i := range nodes {
		eventually("one subscription on node "+strconv.Itoa(i), func() bool { return numSub(i) == 1 })
		clients, err := raw[i].ClientList(ctx).Result()
		if err != nil {
			t.Fatal(err)
		}
		if n := strings.Count(clients, "flags=P"); n != 1 {
			t.Fatalf("node %d: %d pub/sub connections, want 1", i, n)
		}
	}
	drain(w1)
	drain(w2)
	drain(w3)

	// A grant is announced once its token is known: a new client's first grant,
	// whose token a commit round settles, is read with that token.
	w5, err := a.WatchHolder(ctx, "t")
	if err != nil {
		t.Fatal(err)
	}
	drain(w5)
	fresh := open(t, testserver.RedlockURL(nodes, testQuery))
	defer fresh.Close()
	g, err := fresh.Acquire(ctx, driver.Request{Key: "t", Owner: "first", TTL: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	notified(t, w5, "a grant")
	if info, err := a.Inspect(ctx, "t"); err != nil || info.Token != g.Token {
		t.Fatalf("Inspect after the grant's notification = %+v, %v; want token %d", info, err, g.Token)
	}
	w5.Stop()

	// One node's message is enough.
	if err := raw[2].Publish(ctx, ch, "").Err(); err != nil {
		t.Fatal(err)
	}
	notified(t, w1, "a message from one node")
	notified(t, w2, "a message from one node")
	drain(w3)
	select {
	case <-w3.C():
		t.Fatal("a watch of another key was notified")
	default:
	}

	// A node's subscriber connection breaks: notified once it subscribed again.
	if err := raw[1].ClientKillByFilter(ctx, "TYPE", "pubsub").Err(); err != nil {
		t.Fatal(err)
	}
	notified(t, w1, "a reconnect")
	notified(t, w3, "a reconnect")
	drain(w1)

	// A node down when a watch starts: the majority is enough, and the node
	// notifies when it is back.
	nodes[2].Kill()
	w4, err := a.WatchHolder(ctx, "n")
	if err != nil {
		t.Fatalf("WatchHolder with 2 of 3 nodes up: %v", err)
	}
	drain(w4)
	if err := nodes[2].Restart(); err != nil {
		t.Fatal(err)
	}
	notified(t, w4, "a node came back")
	w4.Stop()

	w1.Stop()
	w1.Stop() // a second Stop does nothing
	if n := numSub(0); n != 1 {
		t.Fatalf("after one of two watches stopped: %d subscriptions, want 1", n)
	}
	w2.Stop()
	for i := range nodes {
		eventually("no subscription on node "+strconv.Itoa(i), func() bool { return numSub(i) == 0 })
	}

	// Without a majority, no watch.
	nodes[1].Kill()
	nodes[2].Kill()
	var qe *redlock.QuorumError
	if _, err := a.WatchHolder(ctx, "m"); !errors.As(err, &qe) {
		t.Fatalf("WatchHolder with 1 of 3 nodes up = %v, want a QuorumError", err)
	}
}
