package redisops

import (
	"context"
	"net/url"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/dlockio/dlock/internal/storeops"
	"github.com/dlockio/dlock/internal/testserver"
)

func openRedlockStore(t *testing.T, rawURL string) storeops.Store {
	t.Helper()
	s, err := storeops.Open(context.Background(), rawURL)
	if err != nil {
		t.Fatalf("Open(%q): %v", rawURL, err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

func redlockClient(t *testing.T, n *testserver.Redis) *redis.Client {
	c := redis.NewClient(&redis.Options{Addr: n.Addr(), DisableIdentity: true})
	t.Cleanup(func() { c.Close() })
	return c
}

// The floor takes and releases the key's floor key on the first node only, and
// leaves nothing behind; a floor key held by someone else fails the cycle. Lock
// parameters in the URL are ignored.
func TestRedlockFloorCycle(t *testing.T) {
	nodes := testserver.StartRedisNodes(t, 3)
	ctx := context.Background()
	s := openRedlockStore(t, testserver.RedlockURL(nodes, "prefix=p&node_timeout=1s&ttl=5s"))
	first := redlockClient(t, nodes[0])
	for range 3 {
		if err := s.FloorCycle(ctx, "a/b c"); err != nil {
			t.Fatalf("FloorCycle: %v", err)
		}
	}
	for i, n := range nodes {
		if size := redlockClient(t, n).DBSize(ctx).Val(); size != 0 {
			t.Fatalf("node %d holds %d keys after floor cycles, want 0", i, size)
		}
	}
	const floorKey = "p:floor\x1fk" // see the key layout in redlock/names.go
	if err := first.Set(ctx, floorKey, "other", time.Minute).Err(); err != nil {
		t.Fatal(err)
	}
	if err := s.FloorCycle(ctx, "k"); err == nil {
		t.Fatal("FloorCycle on a held floor key succeeded")
	}
	if v := first.Get(ctx, floorKey).Val(); v != "other" {
		t.Fatalf("the held floor key holds %q after a failed cycle, want %q", v, "other")
	}
}

// Ops sums the commands of every node and does not count its own reads.
func TestRedlockOps(t *testing.T) {
	nodes := testserver.StartRedisNodes(t, 3)
	ctx := context.Background()
	s := openRedlockStore(t, testserver.RedlockURL(nodes, ""))
	if src := s.OpsSource(); src == "" {
		t.Fatal("empty OpsSource")
	}
	c1, c2 := redlockClient(t, nodes[1]), redlockClient(t, nodes[2])
	for _, c := range []*redis.Client{c1, c2} {
		if err := c.Ping(ctx).Err(); err != nil { // connect before counting
			t.Fatal(err)
		}
	}
	ops := func() int64 {
		t.Helper()
		n, err := s.Ops(ctx)
		if err != nil {
			t.Fatalf("Ops: %v", err)
		}
		return n
	}
	a := ops()
	if b := ops(); b != a {
		t.Fatalf("Ops moved from %d to %d with nothing else running", a, b)
	}
	if err := c1.Set(ctx, "k", "v", 0).Err(); err != nil {
		t.Fatal(err)
	}
	if err := c2.Get(ctx, "k").Err(); err != redis.Nil {
		t.Fatal(err)
	}
	if b := ops(); b != a+2 {
		t.Fatalf("Ops = %d after a SET and a GET on two nodes, want %d", b, a+2)
	}
	nodes[2].Stop()
	if _, err := s.Ops(ctx); err == nil {
		t.Fatal("Ops with a node down succeeded")
	}
}

func TestRedlockOpenNoNodes(t *testing.T) {
	if s, err := storeops.Open(context.Background(), "redlock:///0"); err == nil {
		s.Close()
		t.Fatal("Open of a redlock URL without nodes succeeded")
	}
}

// The store reads the URL's TLS parameters as the backend does.
func TestRedlockTLS(t *testing.T) {
	files := testserver.NewTLSFiles(t)
	var hosts []string
	for range 3 {
		_, port := testserver.StartRedisTLS(t, files)
		hosts = append(hosts, "127.0.0.1:"+strconv.Itoa(port))
	}
	ctx := context.Background()
	base := "redlock://" + strings.Join(hosts, ",") + "?tls=true"
	s := openRedlockStore(t, base+"&tls_ca="+url.QueryEscape(files.CA))
	if err := s.FloorCycle(ctx, "k"); err != nil {
		t.Fatalf("FloorCycle over TLS: %v", err)
	}
	if _, err := s.Ops(ctx); err != nil {
		t.Fatalf("Ops over TLS: %v", err)
	}
	untrusted := openRedlockStore(t, base)
	if _, err := untrusted.Ops(ctx); err == nil || !strings.Contains(err.Error(), "certificate") {
		t.Fatalf("Ops without the CA = %v, want a certificate error", err)
	}
}
