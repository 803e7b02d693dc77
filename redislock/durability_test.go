package redislock_test

import (
	"context"
	"errors"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/dlockio/dlock"
	"github.com/dlockio/dlock/driver"
	"github.com/dlockio/dlock/internal/testserver"
	"github.com/dlockio/dlock/redislock"
)

// startReplica starts a replica of master and waits until it is in sync.
func startReplica(t *testing.T, master *testserver.Redis) *testserver.Redis {
	t.Helper()
	r := testserver.StartRedis(t, "--replicaof", "127.0.0.1", strconv.Itoa(master.Port))
	rdb := rawClient(t, master)
	deadline := time.Now().Add(20 * time.Second)
	for {
		// The master counts the replica for WAIT once it is online in its view.
		info, err := rdb.Info(context.Background(), "replication").Result()
		if err == nil && strings.Contains(info, "port="+strconv.Itoa(r.Port)+",state=online") {
			// ... and acknowledges a write (WAIT on the connection that wrote).
			var wait *redis.Cmd
			_, err := rdb.Pipelined(context.Background(), func(p redis.Pipeliner) error {
				p.Set(context.Background(), "replica-ready", "1", 0)
				wait = p.Do(context.Background(), "WAIT", 1, 1000)
				return nil
			})
			if n, _ := wait.Int64(); err == nil && n == 1 {
				return r
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("replica not in sync: %v %s", err, info)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func TestReplicaAcknowledgement(t *testing.T) {
	master := testserver.StartRedis(t)
	replica := startReplica(t, master)
	ctx := context.Background()
	c, err := dlock.Open(ctx, master.URL()+"?replicas=1&replica_timeout=200ms")
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	l, err := c.TryLock(ctx, "k")
	if err != nil {
		t.Fatalf("TryLock with an acknowledging replica: %v", err)
	}
	// The grant was on the replica when TryLock returned.
	owner, err := rawClient(t, replica).Get(ctx, "dlock:lock\x1fk").Result()
	if err != nil || owner != l.Owner() {
		t.Fatalf("replica has %q, %v; want %q", owner, err, l.Owner())
	}
	if err := l.Release(ctx); err != nil {
		t.Fatal(err)
	}

	// No replica: the acquire fails closed and leaves nothing held.
	replica.Kill()
	_, err = c.TryLock(ctx, "k")
	if !errors.Is(err, redislock.ErrNotReplicated) {
		t.Fatalf("TryLock without a replica = %v, want ErrNotReplicated", err)
	}
	if n, err := rawClient(t, master).Exists(ctx, "dlock:lock\x1fk").Result(); err != nil || n != 0 {
		t.Fatalf("lock key left on the master after a failed replication: %d, %v", n, err)
	}
}

// With WithReplicas a waiter does not take a grant handed over at release as it is:
// its own attempt re-enters the grant and WAITs for the replica.
func TestReplicatedHandoff(t *testing.T) {
	master := testserver.StartRedis(t)
	startReplica(t, master)
	ctx := context.Background()
	holder, err := dlock.Open(ctx, master.URL())
	if err != nil {
		t.Fatal(err)
	}
	defer holder.Close()
	waiter, err := dlock.Open(ctx, master.URL()+"?replicas=1&replica_timeout=1s")
	if err != nil {
		t.Fatal(err)
	}
	defer waiter.Close()
	// A writer's handed grant, then a reader's (held in the hash).
	for _, shared := range []bool{false, true} {
		replicatedHandoff(t, master, holder, waiter, shared)
	}
}

func replicatedHandoff(t *testing.T, master *testserver.Redis, holder, waiter *dlock.Client, shared bool) {
	ctx := context.Background()
	var opts []dlock.Option
	if shared {
		opts = append(opts, dlock.WithShared())
	}
	l, err := holder.Lock(ctx, "k")
	if err != nil {
		t.Fatal(err)
	}
	got := make(chan *dlock.Lease, 1)
	go func() {
		l2, err := waiter.Lock(ctx, "k", opts...)
		if err != nil {
			t.Error(err)
		}
		got <- l2
	}()
	in := holder.Backend().(driver.Inspector)
	for {
		if info, err := in.Inspect(ctx, "k"); err == nil && info.Waiters == 1 {
			break
		}
		time.Sleep(time.Millisecond)
	}
	waits := func() int64 {
		s, _ := rawClient(t, master).Info(ctx, "commandstats").Result()
		for line := range strings.SplitSeq(s, "\n") {
			if rest, ok := strings.CutPrefix(line, "cmdstat_wait:calls="); ok {
				n, _ := strconv.ParseInt(rest[:strings.IndexByte(rest, ',')], 10, 64)
				return n
			}
		}
		return 0
	}
	before := waits()
	if err := l.Release(ctx); err != nil {
		t.Fatal(err)
	}
	l2 := <-got
	if l2 == nil {
		t.FailNow()
	}
	if after := waits(); after <= before {
		t.Fatalf("the waiter (shared %v) took the handed grant without a WAIT (%d WAIT calls before the release, %d after)", shared, before, after)
	}
	if l2.Shared() != shared {
		t.Fatalf("the handed lease's Shared() = %v, want %v", l2.Shared(), shared)
	}
	if err := l2.Release(ctx); err != nil {
		t.Fatal(err)
	}
}

// A held lease whose renewals cannot be replicated is lost at its deadline.
func TestReplicaLostDuringLease(t *testing.T) {
	master := testserver.StartRedis(t)
	replica := startReplica(t, master)
	ctx := context.Background()
	c, err := dlock.Open(ctx, master.URL()+"?replicas=1&replica_timeout=50ms&ttl=1s&renew=100ms")
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	l, err := c.Lock(ctx, "k")
	if err != nil {
		t.Fatal(err)
	}
	replica.Kill()
	select {
	case <-l.Done():
	case <-time.After(10 * time.Second):
		t.Fatal("lease not lost although no renewal was replicated")
	}
	if !errors.Is(l.Err(), dlock.ErrLeaseLost) {
		t.Fatalf("Err = %v", l.Err())
	}
}

func TestPersistenceReport(t *testing.T) {
	ctx := context.Background()
	volatile := testserver.StartRedis(t)
	b := open(t, volatile.URL())
	p := b.Persistence()
	b.Close()
	if !p.Known || p.AppendOnly || p.Durable() {
		t.Fatalf("default test server reported as %+v", p)
	}
	if _, err := dlock.Open(ctx, volatile.URL()+"?strict=true"); !errors.Is(err, redislock.ErrNotDurable) {
		t.Fatalf("strict Open on a volatile server = %v, want ErrNotDurable", err)
	}
	durable := testserver.StartRedis(t, "--appendonly", "yes", "--appendfsync", "always")
	c, err := dlock.Open(ctx, durable.URL()+"?strict=true")
	if err != nil {
		t.Fatalf("strict Open on a durable server: %v", err)
	}
	p = c.Backend().(*redislock.Backend).Persistence()
	c.Close()
	if !p.Durable() || p.AppendFsync != "always" {
		t.Fatalf("durable server reported as %+v", p)
	}
}

// A server that may evict keys (maxmemory with an evicting policy; volatile-* too,
// since lock keys carry a TTL) is refused unless allow_eviction=true; a memory
// limit with noeviction, or an evicting policy without a limit, is accepted.
func TestEvictingServer(t *testing.T) {
	ctx := context.Background()
	evicting := testserver.StartRedis(t, "--maxmemory", "64mb", "--maxmemory-policy", "volatile-lru")
	if _, err := dlock.Open(ctx, evicting.URL()); !errors.Is(err, redislock.ErrEvicts) || !strings.Contains(err.Error(), "volatile-lru") {
		t.Fatalf("Open on an evicting server = %v, want ErrEvicts naming the policy", err)
	}
	c, err := dlock.Open(ctx, evicting.URL()+"?allow_eviction=true")
	if err != nil {
		t.Fatalf("Open with allow_eviction=true: %v", err)
	}
	p := c.Backend().(*redislock.Backend).Persistence()
	c.Close()
	if !p.Evicts() || p.MaxMemory != 64<<20 || p.EvictionPolicy != "volatile-lru" {
		t.Fatalf("evicting server reported as %+v", p)
	}
	for _, args := range [][]string{
		{"--maxmemory", "64mb", "--maxmemory-policy", "noeviction"},
		{"--maxmemory", "0", "--maxmemory-policy", "allkeys-lru"},
	} {
		c, err := dlock.Open(ctx, testserver.StartRedis(t, args...).URL())
		if err != nil {
			t.Fatalf("Open on a server with %v: %v", args, err)
		}
		c.Close()
	}
}

// With appendfsync always, a grant survives kill -9 of the server: the restarted
// server refuses a second holder.
func TestDurableServerKeepsGrantAcrossCrash(t *testing.T) {
	srv := testserver.StartRedis(t, "--appendonly", "yes", "--appendfsync", "always")
	ctx := context.Background()
	rdb := redis.NewClient(&redis.Options{Addr: srv.Addr()})
	defer rdb.Close()
	b, err := redislock.New(ctx, rdb)
	if err != nil {
		t.Fatal(err)
	}
	c, err := dlock.New(b, dlock.WithTTL(time.Minute))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	l, err := c.TryLock(ctx, "k")
	if err != nil {
		t.Fatal(err)
	}
	srv.Kill()
	if err := srv.Restart(); err != nil {
		t.Fatal(err)
	}
	other, err := dlock.Open(ctx, srv.URL())
	if err != nil {
		t.Fatal(err)
	}
	defer other.Close()
	if _, err := other.TryLock(ctx, "k"); !errors.Is(err, dlock.ErrLocked) {
		t.Fatalf("second holder after a crash of a durable server: %v", err)
	}
	if err := l.Release(ctx); err != nil {
		t.Fatalf("release after the restart: %v", err)
	}
}

func TestDurabilityParameters(t *testing.T) {
	srv := testserver.StartRedis(t)
	for _, q := range []string{"replicas=-1", "replicas=x", "replicas=1&replica_timeout=0s", "replicas=1&replica_timeout=500us", "strict=maybe"} {
		c, err := dlock.Open(context.Background(), srv.URL()+"?"+q)
		if err == nil {
			c.Close()
			t.Errorf("%s accepted", q)
		} else if !errors.Is(err, dlock.ErrInvalid) {
			t.Errorf("%s: %v, want ErrInvalid", q, err)
		}
	}
}
