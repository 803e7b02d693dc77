package redlock_test

import (
	"testing"
	"time"

	"github.com/dlockio/dlock"
	"github.com/dlockio/dlock/driver"
	"github.com/dlockio/dlock/internal/testserver"
	"github.com/dlockio/dlock/redlock"
)

// Tokens keep rising across node restarts: with persistence (appendfsync always) the
// counters survive even if every node crashes at once; without it, rolling restarts
// keep them through the majority intersection.
func TestTokensRiseAcrossRestarts(t *testing.T) {
	t.Run("persistent/all-crash", func(t *testing.T) {
		nodes := testserver.StartRedisNodes(t, 5, "--appendonly", "yes", "--appendfsync", "always")
		raw := rawClients(t, nodes)
		ctx := ctxT(t)
		u := testserver.RedlockURL(nodes, "node_timeout=100ms")
		c := client(t, u)
		var last dlock.Token
		for round := range 3 {
			l, err := c.Lock(ctx, "k")
			if err != nil {
				t.Fatal(err)
			}
			if l.Token() <= last {
				t.Fatalf("round %d: token %d not above %d", round, l.Token(), last)
			}
			last = l.Token()
			if err := l.Release(ctx); err != nil {
				t.Fatal(err)
			}
			for _, n := range nodes {
				n.Kill()
			}
			for _, n := range nodes {
				if err := n.Restart(); err != nil {
					t.Fatal(err)
				}
			}
			// The counters came back from the AOF: the register, not the clock
			// fallback, carries the order.
			fenceKey := c.Backend().(*redlock.Backend).FenceKey("k")
			kept := 0
			for _, r := range raw {
				if v, err := r.Get(ctx, fenceKey).Uint64(); err == nil && v == uint64(last) {
					kept++
				}
			}
			if kept < 3 {
				t.Fatalf("round %d: only %d nodes kept counter %d after a crash with appendfsync always", round, kept, last)
			}
		}
	})
	t.Run("volatile/rolling", func(t *testing.T) {
		nodes := testserver.StartRedisNodes(t, 5)
		ctx := ctxT(t)
		c := client(t, testserver.RedlockURL(nodes, "node_timeout=100ms"))
		var last dlock.Token
		for i := range 2 * len(nodes) {
			l, err := c.Lock(ctx, "k")
			if err != nil {
				t.Fatal(err)
			}
			if l.Token() <= last {
				t.Fatalf("after restarting node %d: token %d not above %d", (i-1)%len(nodes), l.Token(), last)
			}
			last = l.Token()
			if err := l.Release(ctx); err != nil {
				t.Fatal(err)
			}
			n := nodes[i%len(nodes)]
			n.Kill()
			if err := n.Restart(); err != nil {
				t.Fatal(err)
			}
		}
	})
}

// The majority register alone orders tokens: a grant on nodes {0,1,2} and a later one
// on {2,3,4}, where nodes 3 and 4 lost their counters (here replaced by a low value,
// so that the clock fallback cannot help), share node 2, which carries the order.
func TestFencingMajorityIntersection(t *testing.T) {
	nodes := testserver.StartRedisNodes(t, 5)
	raw := rawClients(t, nodes)
	ctx := ctxT(t)
	u := testserver.RedlockURL(nodes, "node_timeout=100ms")
	a, b := open(t, u), open(t, u)
	defer a.Close()
	defer b.Close()
	key := "k"
	for _, r := range raw {
		if err := r.Set(ctx, a.FenceKey(key), 100, 0).Err(); err != nil {
			t.Fatal(err)
		}
	}
	nodes[3].Kill()
	nodes[4].Kill()
	g, err := a.Acquire(ctx, driver.Request{Key: key, Owner: "alice", TTL: 10 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	if g.Token != 101 {
		t.Fatalf("first token %d, want 101 (one above the counters)", g.Token)
	}
	if err := a.Release(ctx, key, "alice"); err != nil {
		t.Fatal(err)
	}
	for _, i := range []int{3, 4} {
		if err := nodes[i].Restart(); err != nil {
			t.Fatal(err)
		}
		if err := raw[i].Set(ctx, a.FenceKey(key), 1, 0).Err(); err != nil {
			t.Fatal(err)
		}
	}
	nodes[0].Kill()
	nodes[1].Kill()
	g2, err := b.Acquire(ctx, driver.Request{Key: key, Owner: "bob", TTL: 10 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	if g2.Token <= g.Token {
		t.Fatalf("grant on {2,3,4} got token %d, not above %d from {0,1,2}", g2.Token, g.Token)
	}
	// The token is now on a majority: nodes 2, 3 and 4 all carry it.
	for _, i := range []int{2, 3, 4} {
		if v, err := raw[i].Get(ctx, a.FenceKey(key)).Uint64(); err != nil || v != g2.Token {
			t.Fatalf("node %d counter = %d, %v; want %d", i, v, err, g2.Token)
		}
	}
	if err := b.Release(ctx, key, "bob"); err != nil {
		t.Fatal(err)
	}
}

// A guessed token that a majority of nodes reject (their counters moved on) costs a
// commit round and yields a token above every counter seen; a resume by the same
// owner keeps its token only while every granting node still records it.
//
// Counters moved on a minority only (as a failed attempt leaves them) do not stand
// for any grant: the next token need only exceed the earlier grants' (an acquire
// may be settled by the first majority that accepts its guess).
func TestFencingGuessAndResume(t *testing.T) {
	nodes := testserver.StartRedisNodes(t, 5)
	raw := rawClients(t, nodes)
	ctx := ctxT(t)
	u := testserver.RedlockURL(nodes, testQuery)
	a := open(t, u)
	defer a.Close()
	const key, ttl = "k", 10 * time.Second
	cycle := func(moved int, by uint64) (before, after uint64) {
		t.Helper()
		g, err := a.Acquire(ctx, driver.Request{Key: key, Owner: "alice", TTL: ttl})
		if err != nil {
			t.Fatal(err)
		}
		if err := a.Release(ctx, key, "alice"); err != nil {
			t.Fatal(err)
		}
		for _, r := range raw[:moved] {
			if err := r.Set(ctx, a.FenceKey(key), g.Token+by, 0).Err(); err != nil {
				t.Fatal(err)
			}
		}
		g2, err := a.Acquire(ctx, driver.Request{Key: key, Owner: "alice", TTL: ttl})
		if err != nil {
			t.Fatal(err)
		}
		return g.Token, g2.Token
	}
	before, after := cycle(2, 1000)
	if after <= before {
		t.Fatalf("token %d after counters moved on a minority, want above the earlier grant's %d", after, before)
	}
	if err := a.Release(ctx, key, "alice"); err != nil {
		t.Fatal(err)
	}
	before, after = cycle(3, 1_000_000)
	if high := before + 1_000_000; after <= high {
		t.Fatalf("token %d not above the counter %d of a majority", after, high)
	}
	g2 := driver.Grant{Token: after}

	// Resume from another process: same token while every node records it...
	b := open(t, u)
	defer b.Close()
	g3, err := b.Acquire(ctx, driver.Request{Key: key, Owner: "alice", TTL: ttl, Reenter: true})
	if err != nil || g3.Token != g2.Token {
		t.Fatalf("resume = %d, %v; want token %d", g3.Token, err, g2.Token)
	}
	// ...and a new, larger one once a node lost the grant (as in a restart).
	if err := raw[0].Del(ctx, a.LockKey(key)).Err(); err != nil {
		t.Fatal(err)
	}
	g4, err := b.Acquire(ctx, driver.Request{Key: key, Owner: "alice", TTL: ttl, Reenter: true})
	if err != nil {
		t.Fatal(err)
	}
	if g4.Token <= g3.Token {
		t.Fatalf("resume after a node lost the grant: token %d, want above %d", g4.Token, g3.Token)
	}
	info, err := b.Inspect(ctx, key)
	if err != nil || info.Owner != "alice" || info.Token != g4.Token {
		t.Fatalf("Inspect = %+v, %v; want alice with token %d", info, err, g4.Token)
	}
	if err := b.Release(ctx, key, "alice"); err != nil {
		t.Fatal(err)
	}
}
