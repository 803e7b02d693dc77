package redislock_test

import (
	"context"
	"errors"
	"math/rand/v2"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/dlockio/dlock"
	"github.com/dlockio/dlock/driver"
	"github.com/dlockio/dlock/drivertest"
	"github.com/dlockio/dlock/internal/testserver"
	"github.com/dlockio/dlock/redislock"
)

// clusterClient returns a go-redis cluster client of cl, closed when the test ends.
func clusterClient(t testing.TB, cl *testserver.RedisCluster) *redis.ClusterClient {
	addrs := make([]string, len(cl.Nodes))
	for i, n := range cl.Nodes {
		addrs[i] = n.Addr()
	}
	rdb := redis.NewClusterClient(&redis.ClusterOptions{Addrs: addrs})
	t.Cleanup(func() { rdb.Close() })
	return rdb
}

func clusterHarness(t testing.TB, cl *testserver.RedisCluster) drivertest.Harness {
	rdb := clusterClient(t, cl)
	keyer, err := redislock.New(context.Background(), rdb)
	if err != nil {
		t.Fatal(err)
	}
	return drivertest.Harness{
		Open: func(t testing.TB) driver.Backend { return open(t, cl.URL("")) },
		Expire: func(t testing.TB, key string) {
			if err := rdb.Del(context.Background(), keyer.LockKey(key)).Err(); err != nil {
				t.Fatal(err)
			}
		},
		Fencing:   true,
		FIFO:      true,
		RoundTrip: func(ctx context.Context) error { return rdb.Ping(ctx).Err() },
		Namespace: func(t testing.TB, ns string) (driver.Backend, error) {
			u, err := url.Parse(cl.URL(""))
			if err != nil {
				t.Fatal(err)
			}
			return redislock.Open(context.Background(), u, redislock.WithPrefix(ns))
		},
	}
}

// The whole conformance suite on a Redis Cluster of three masters, one replica
// each.
func TestClusterConformance(t *testing.T) {
	cl := testserver.StartRedisCluster(t, 3, 1)
	drivertest.Run(t, clusterHarness(t, cl))
}

// Every key of one lock (lock, token counter, value, queue, waiter places) is in
// one hash slot whatever its name holds, and the scripts' names are the ones the
// slot check expects: a waiter queues, a release hands over and Inspect, List
// and the wake message show the user's name.
func TestClusterKeysShareASlot(t *testing.T) {
	cl := testserver.StartRedisCluster(t, 3, 0)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	rdb := clusterClient(t, cl)
	c, err := dlock.Open(ctx, cl.URL("prefix=app"))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	other, err := dlock.Open(ctx, cl.URL("prefix=app"))
	if err != nil {
		t.Fatal(err)
	}
	defer other.Close()
	for _, key := range []string{"}", "}a{b}", "{", "{}", "{order1}:a", "a:b}c", "x{y", "}}{{", "plain"} {
		l, err := c.Lock(ctx, key, dlock.WithValue([]byte("v")))
		if err != nil {
			t.Fatalf("Lock(%q): %v", key, err)
		}
		got := make(chan *dlock.Lease, 1)
		go func() {
			l2, err := other.Lock(ctx, key)
			if err != nil {
				t.Errorf("queued Lock(%q): %v", key, err)
			}
			got <- l2
		}()
		// Wait until the waiter's place is on the server, then look at every key.
		deadline := time.Now().Add(10 * time.Second)
		var names []string
		var mu sync.Mutex
		for {
			names = names[:0]
			err := rdb.ForEachMaster(ctx, func(ctx context.Context, m *redis.Client) error {
				ks, err := m.Keys(ctx, "app:*").Result()
				mu.Lock()
				names = append(names, ks...)
				mu.Unlock()
				return err
			})
			if err != nil {
				t.Fatal(err)
			}
			if len(names) >= 5 || time.Now().After(deadline) {
				break
			}
			time.Sleep(10 * time.Millisecond)
		}
		// lock, token, value, queue, waiter.
		if len(names) != 5 {
			t.Fatalf("%q: keys %q, want 5", key, names)
		}
		slot := cl.Slot(names[0])
		for _, n := range names {
			if s := cl.Slot(n); s != slot {
				t.Fatalf("%q: key %q in slot %d, %q in %d", key, n, s, names[0], slot)
			}
		}
		infos, err := c.List(ctx, "")
		if err != nil || len(infos) != 1 || infos[0].Key != key || infos[0].Waiters != 1 || string(infos[0].Value) != "v" {
			t.Fatalf("List = %+v, %v; want one holder of %q with a waiter", infos, err, key)
		}
		if info, err := c.Inspect(ctx, key); err != nil || info.Key != key || info.Owner != l.Owner() {
			t.Fatalf("Inspect(%q) = %+v, %v", key, info, err)
		}
		if err := l.Release(ctx); err != nil {
			t.Fatal(err)
		}
		l2 := <-got
		if l2 == nil {
			t.FailNow()
		}
		if l2.Token() <= l.Token() {
			t.Fatalf("%q: handed-over token %d not above %d", key, l2.Token(), l.Token())
		}
		if err := l2.Release(ctx); err != nil {
			t.Fatal(err)
		}
		// Delete the token counters, so the next name starts with no keys.
		_ = rdb.ForEachMaster(ctx, func(ctx context.Context, m *redis.Client) error {
			ks, _ := m.Keys(ctx, "app:*").Result()
			for _, k := range ks {
				m.Del(ctx, k)
			}
			return nil
		})
	}
}

// AtomicSet matches the cluster's own slots; a set across slots is taken key by
// key by the core, and AcquireAll refuses it without changing anything.
func TestClusterSets(t *testing.T) {
	cl := testserver.StartRedisCluster(t, 3, 0)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	b := open(t, cl.URL(""))
	defer b.Close()
	for _, set := range [][]string{{"a", "b"}, {"{o}a", "{o}b"}, {"o}a", "o}b"}, {"}a", "}b"}, {"x", "x"}} {
		want := cl.Slot(b.LockKey(set[0])) == cl.Slot(b.LockKey(set[1]))
		if got := b.AtomicSet(set); got != want {
			t.Errorf("AtomicSet(%q) = %v, the cluster says %v", set, got, want)
		}
	}
	// Random names of the bytes that matter to hash tags.
	r := rand.New(rand.NewPCG(1, 2))
	name := func() string {
		var sb strings.Builder
		for range 1 + r.IntN(6) {
			sb.WriteByte("{}:ab"[r.IntN(5)])
		}
		return sb.String()
	}
	rdb := clusterClient(t, cl)
	for range 300 {
		set := []string{name(), name()}
		s0, err0 := rdb.ClusterKeySlot(ctx, b.LockKey(set[0])).Result()
		s1, err1 := rdb.ClusterKeySlot(ctx, b.LockKey(set[1])).Result()
		if err0 != nil || err1 != nil {
			t.Fatal(err0, err1)
		}
		if got := b.AtomicSet(set); got != (s0 == s1) {
			t.Fatalf("AtomicSet(%q) = %v, the cluster says slots %d and %d", set, got, s0, s1)
		}
		if got := b.AtomicSet([]string{set[0], set[0] + "x"}); got != strings.Contains(set[0], "}") {
			t.Fatalf("AtomicSet(%q, %q) = %v", set[0], set[0]+"x", got)
		}
	}
	_, err := b.AcquireAll(ctx, []driver.Request{{Key: "a", Owner: "o", TTL: time.Second}, {Key: "b", Owner: "o", TTL: time.Second}})
	if !errors.Is(err, driver.ErrUnsupported) {
		t.Fatalf("AcquireAll across slots: %v, want ErrUnsupported", err)
	}
	if in, err := b.Inspect(ctx, "a"); !errors.Is(err, driver.ErrNotHeld) {
		t.Fatalf("after a refused AcquireAll: %+v, %v", in, err)
	}
	c, err := dlock.New(b)
	if err != nil {
		t.Fatal(err)
	}
	m, err := c.LockAll(ctx, []string{"a", "b", "c"})
	if err != nil {
		t.Fatalf("LockAll across slots: %v", err)
	}
	if err := m.Release(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := openURL(cl.URL("prefix=a{b")); !errors.Is(err, driver.ErrInvalid) {
		t.Fatalf("prefix with a brace: %v, want ErrInvalid", err)
	}
}

// A failover of the master that owns a held lock's slot, with replicas=1 (every
// grant acknowledged by the replica): the lock is still held after it, by the
// same owner, and the next token is higher.
func TestClusterFailover(t *testing.T) {
	cl := testserver.StartRedisCluster(t, 3, 1)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	c, err := dlock.Open(ctx, cl.URL("replicas=1&replica_timeout=1s"), dlock.WithTTL(10*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	b := c.Backend().(*redislock.Backend)
	const key = "orders:7"
	l, err := c.Lock(ctx, key)
	if err != nil {
		t.Fatal(err)
	}
	old, _ := cl.Master(cl.Slot(b.LockKey(key)))
	nm := cl.Failover(b.LockKey(key))
	if nm == old {
		t.Fatal("the slot's master did not change")
	}
	if _, err := c.TryLock(ctx, key); !errors.Is(err, dlock.ErrLocked) {
		t.Fatalf("TryLock after the failover: %v, want ErrLocked (the grant was replicated)", err)
	}
	if info, err := c.Inspect(ctx, key); err != nil || info.Owner != l.Owner() || uint64(info.Token) != uint64(l.Token()) {
		t.Fatalf("Inspect after the failover = %+v, %v; want %s with token %d", info, err, l.Owner(), l.Token())
	}
	if err := b.Refresh(ctx, key, l.Owner(), 10*time.Second); err != nil || l.Err() != nil {
		t.Fatalf("Refresh after the failover: %v (lease: %v)", err, l.Err())
	}
	if err := l.Release(ctx); err != nil {
		t.Fatalf("Release after the failover: %v", err)
	}
	l2, err := c.Lock(ctx, key)
	if err != nil {
		t.Fatal(err)
	}
	if l2.Token() <= l.Token() {
		t.Fatalf("token after the failover %d not above %d", l2.Token(), l.Token())
	}
	if err := l2.Release(ctx); err != nil {
		t.Fatal(err)
	}

	// WAIT runs on the master of the key's slot: with that shard's replica (the
	// old master) stopped, a grant there is not acknowledged, and is undone;
	// another shard's grants still are.
	old.Pause()
	defer old.Resume()
	if _, err := c.TryLock(ctx, key); !errors.Is(err, redislock.ErrNotReplicated) {
		t.Fatalf("TryLock with the slot's replica stopped: %v, want ErrNotReplicated", err)
	}
	var elsewhere string
	for i := 0; elsewhere == ""; i++ {
		k := "elsewhere" + strconv.Itoa(i)
		if m, _ := cl.Master(cl.Slot(b.LockKey(k))); m != nm {
			elsewhere = k
		}
	}
	l3, err := c.TryLock(ctx, elsewhere)
	if err != nil {
		t.Fatalf("TryLock in another shard: %v", err)
	}
	if err := l3.Release(ctx); err != nil {
		t.Fatal(err)
	}
	old.Resume()
	if info, err := c.Inspect(ctx, key); !errors.Is(err, driver.ErrNotHeld) {
		t.Fatalf("Inspect after the unacknowledged grant: %+v, %v; want it undone", info, err)
	}
}

// The client's one subscription survives the loss of the node it listens on: a
// waiter is still woken by the release, not by its lock's TTL.
func TestClusterSubscriptionSurvivesNodeLoss(t *testing.T) {
	cl := testserver.StartRedisCluster(t, 3, 1)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	holder, err := dlock.Open(ctx, cl.URL(""), dlock.WithTTL(time.Minute))
	if err != nil {
		t.Fatal(err)
	}
	defer holder.Close()
	waiter, err := dlock.Open(ctx, cl.URL(""))
	if err != nil {
		t.Fatal(err)
	}
	defer waiter.Close()
	wb := waiter.Backend().(*redislock.Backend)
	// Find a lock name whose slot is on another master than the subscription's
	// (go-redis subscribes on the master of the first channel's slot), so that
	// the lock keeps its master.
	sub := cl.Slot(wb.WakeChannel())
	subMaster, _ := cl.Master(sub)
	var key string
	for i := 0; key == ""; i++ {
		k := "k" + strconv.Itoa(i)
		if m, _ := cl.Master(cl.Slot(wb.LockKey(k))); m != subMaster {
			key = k
		}
	}
	// One wait, to subscribe, before the node goes.
	l, err := holder.Lock(ctx, key)
	if err != nil {
		t.Fatal(err)
	}
	wctx, wcancel := context.WithTimeout(ctx, 200*time.Millisecond)
	if _, err := waiter.Lock(wctx, key); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Lock of a held key: %v", err)
	}
	wcancel()
	sm := redis.NewClient(&redis.Options{Addr: subMaster.Addr()})
	n, err := sm.PubSubNumSub(ctx, wb.WakeChannel()).Result()
	sm.Close()
	if err != nil || n[wb.WakeChannel()] != 1 {
		t.Fatalf("PUBSUB NUMSUB on %s: %v, %v; want the subscription there", subMaster.Addr(), n, err)
	}
	killed, _ := cl.KillMaster(wb.WakeChannel())
	if killed != subMaster {
		t.Fatalf("killed %s, the subscription is on %s", killed.Addr(), subMaster.Addr())
	}
	got := make(chan error, 1)
	go func() {
		l2, err := waiter.Lock(ctx, key)
		if err == nil {
			err = l2.Release(ctx)
		}
		got <- err
	}()
	time.Sleep(500 * time.Millisecond) // the waiter queues
	start := time.Now()
	if err := l.Release(ctx); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-got:
		if err != nil {
			t.Fatal(err)
		}
		t.Logf("waiter woken %v after the release", time.Since(start))
	case <-time.After(15 * time.Second):
		t.Fatal("the waiter was not woken within 15s of the release (the lock's TTL is a minute)")
	}
}

// A resharding moves a held lock's slot to another master: the client follows
// the MOVED redirection, with and without WAIT (which runs on the new master);
// the lock is still held and its keys moved together.
func TestClusterMoved(t *testing.T) {
	cl := testserver.StartRedisCluster(t, 3, 1)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	for _, q := range []string{"", "replicas=1&replica_timeout=1s"} {
		c, err := dlock.Open(ctx, cl.URL(q), dlock.WithTTL(10*time.Second))
		if err != nil {
			t.Fatal(err)
		}
		b := c.Backend().(*redislock.Backend)
		key := "moving" + strconv.Itoa(len(q))
		l, err := c.Lock(ctx, key)
		if err != nil {
			t.Fatal(err)
		}
		old, _ := cl.Master(cl.Slot(b.LockKey(key)))
		if nm := cl.MoveSlot(b.LockKey(key)); nm == old {
			t.Fatal("the slot did not move")
		}
		if _, err := c.TryLock(ctx, key); !errors.Is(err, dlock.ErrLocked) {
			t.Fatalf("TryLock after the move: %v, want ErrLocked", err)
		}
		if err := b.Refresh(ctx, key, l.Owner(), 10*time.Second); err != nil || l.Err() != nil {
			t.Fatalf("Refresh after the move: %v (lease: %v)", err, l.Err())
		}
		if err := l.Release(ctx); err != nil {
			t.Fatalf("Release after the move: %v", err)
		}
		l2, err := c.Lock(ctx, key)
		if err != nil || l2.Token() <= l.Token() {
			t.Fatalf("Lock after the move: %v, token %d after %d", err, l2.Token(), l.Token())
		}
		if err := l2.Release(ctx); err != nil {
			t.Fatal(err)
		}
		c.Close()
	}
}

// The cluster URL: seeds, parameters as for redis://, no database.
func TestClusterURL(t *testing.T) {
	cl := testserver.StartRedisCluster(t, 3, 0)
	seeds := strings.TrimSuffix(strings.TrimPrefix(cl.URL(""), "redis+cluster://"), "/")
	for _, raw := range []string{
		"redis+cluster://" + seeds,
		"redis+cluster://" + strings.Split(seeds, ",")[0] + "/?pool_size=4&dial_timeout=1s&prefix=p&idle_timeout=5s",
	} {
		b, err := openURL(raw)
		if err != nil {
			t.Errorf("Open(%s): %v", raw, err)
			continue
		}
		if _, ok := b.Client().(*redis.ClusterClient); !ok {
			t.Errorf("Open(%s): client %T", raw, b.Client())
		}
		b.Close()
	}
	for _, raw := range []string{
		"redis+cluster://" + seeds + "/0",
		"redis+cluster://" + seeds + "/?db=1",
		"redis+cluster://" + seeds + "/?pool_size=-1",
		"redis+cluster://" + seeds + "/?nonsense=1",
		"redis+cluster://" + seeds + "/?idle_timeout=1s&conn_max_idle_time=2s",
		"redis+cluster://,/",
		"redis+cluster://" + seeds + "/?prefix=%7Bx",
		"redis+cluster://" + seeds + "/?skip_verify=true",
	} {
		if b, err := openURL(raw); !errors.Is(err, driver.ErrInvalid) {
			if err == nil {
				b.Close()
			}
			t.Errorf("Open(%s) = %v, want ErrInvalid", raw, err)
		}
	}
	// strict checks every master (none has appendfsync always here).
	if _, err := openURL(cl.URL("strict=true")); !errors.Is(err, redislock.ErrNotDurable) {
		t.Errorf("strict=true on a cluster without AOF: %v, want ErrNotDurable", err)
	}
	// So does the eviction check: one master of three that may evict is enough.
	last := redis.NewClient(&redis.Options{Addr: cl.Nodes[2].Addr()})
	defer last.Close()
	ctx := context.Background()
	if err := last.ConfigSet(ctx, "maxmemory-policy", "allkeys-lru").Err(); err != nil {
		t.Fatal(err)
	}
	if err := last.ConfigSet(ctx, "maxmemory", "64mb").Err(); err != nil {
		t.Fatal(err)
	}
	if _, err := openURL(cl.URL("")); !errors.Is(err, redislock.ErrEvicts) {
		t.Errorf("a cluster with an evicting master: %v, want ErrEvicts", err)
	}
	if err := last.ConfigSet(ctx, "maxmemory", "0").Err(); err != nil {
		t.Fatal(err)
	}
	if _, err := openURL("rediss+cluster://" + seeds + "/?tls=false"); !errors.Is(err, driver.ErrInvalid) {
		t.Errorf("rediss+cluster with tls=false: %v", err)
	}
}

// BenchmarkClusterCycle: BenchmarkCycle on a cluster of three masters.
func BenchmarkClusterCycle(b *testing.B) {
	cl := testserver.StartRedisCluster(b, 3, 0)
	drivertest.BenchCycle(b, clusterHarness(b, cl))
}

// BenchmarkClusterMultiKey: BenchmarkMultiKey on a cluster of three masters (the
// suite's sets share a hash tag: one script call each).
func BenchmarkClusterMultiKey(b *testing.B) {
	cl := testserver.StartRedisCluster(b, 3, 0)
	for _, n := range []int{2, 8} {
		drivertest.BenchMultiKey(b, clusterHarness(b, cl), n)
	}
}
