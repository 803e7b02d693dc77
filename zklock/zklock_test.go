package zklock_test

import (
	"context"
	"fmt"
	"log/slog"
	"net/url"
	"sync"
	"testing"
	"time"

	"github.com/go-zookeeper/zk"
	"go.uber.org/goleak"

	"github.com/dlockio/dlock"
	"github.com/dlockio/dlock/driver"
	"github.com/dlockio/dlock/drivertest"
	"github.com/dlockio/dlock/internal/storeops"
	_ "github.com/dlockio/dlock/internal/storeops/zkops" // the store the harness measures with
	"github.com/dlockio/dlock/internal/testserver"
	"github.com/dlockio/dlock/zklock"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func open(t testing.TB, rawURL string, opts ...zklock.Option) *zklock.Backend {
	t.Helper()
	u, err := url.Parse(rawURL)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	b, err := zklock.Open(ctx, u, opts...)
	if err != nil {
		t.Fatalf("Open: %v", err)
	}
	return b
}

type silent struct{}

func (silent) Printf(string, ...any) {}

// rawConn is a plain ZooKeeper session for looking behind the backend's back.
func rawConn(t testing.TB, servers ...string) *zk.Conn {
	t.Helper()
	conn, events, err := zk.Connect(servers, 10*time.Second, zk.WithLogger(silent{}), zk.WithLogInfo(false))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		conn.Close()
		for range events {
		}
	})
	deadline := time.After(20 * time.Second)
	for conn.State() != zk.StateHasSession {
		select {
		case <-deadline:
			t.Fatalf("raw ZooKeeper connection: no session (state %v)", conn.State())
		case <-time.After(5 * time.Millisecond):
		}
	}
	return conn
}

// lockPath mirrors the backend's layout under the default root.
func lockPath(key string) string { return "/dlock/k-" + url.PathEscape(key) }

// expire deletes the holder's node, as the ensemble does when the holder's session
// expires.
func expire(t testing.TB, raw *zk.Conn, key string) {
	t.Helper()
	names, _, err := raw.Children(lockPath(key))
	if err != nil {
		t.Fatalf("expire %q: %v", key, err)
	}
	lowest := ""
	for _, n := range names {
		if lowest == "" || n[len(n)-10:] < lowest[len(lowest)-10:] {
			lowest = n
		}
	}
	if lowest == "" {
		t.Fatalf("expire %q: no holder", key)
	}
	if err := raw.Delete(lockPath(key)+"/"+lowest, -1); err != nil {
		t.Fatalf("expire %q: %v", key, err)
	}
}

func harness(t testing.TB, srv *testserver.ZooKeeper) drivertest.Harness {
	raw := rawConn(t, srv.Addr())
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	st, err := storeops.Open(ctx, srv.URL("/dlock"))
	if err != nil {
		t.Fatalf("storeops: %v", err)
	}
	t.Cleanup(func() { st.Close() })
	return drivertest.Harness{
		Ops:   st.Ops,
		Floor: st.FloorCycle,
		Open: func(t testing.TB) driver.Backend {
			b := open(t, srv.URL("/dlock"))
			return b
		},
		Expire:  func(t testing.TB, key string) { expire(t, raw, key) },
		Fencing: true,
		FIFO:    true,
		RoundTrip: func(ctx context.Context) error {
			_, _, err := raw.Exists("/")
			return err
		},
		Namespace: func(t testing.TB, ns string) (driver.Backend, error) {
			u, err := url.Parse(srv.URL(""))
			if err != nil {
				t.Fatal(err)
			}
			ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
			defer cancel()
			b, err := zklock.Open(ctx, u, zklock.WithRoot("/"+ns))
			if err != nil {
				return nil, err
			}
			return b, nil
		},
	}
}

func TestConformance(t *testing.T) {
	srv := testserver.StartZooKeeper(t)
	drivertest.Run(t, harness(t, srv))
}

func mustURL(t testing.TB, s string) *url.URL {
	t.Helper()
	u, err := url.Parse(s)
	if err != nil {
		t.Fatal(err)
	}
	return u
}

// The token is the contender node's czxid, also when it is read from the create
// reply under concurrent writes from other sessions.
func TestTokenIsCzxid(t *testing.T) {
	srv := testserver.StartZooKeeper(t)
	raw := rawConn(t, srv.Addr())
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	const clients, rounds = 4, 20
	var wg sync.WaitGroup
	for i := range clients {
		logs := &captured{}
		b := open(t, srv.URL("/dlock"), zklock.WithLogger(slog.New(logs)))
		c := newClient(t, b)
		wg.Go(func() {
			for r := range rounds {
				key := fmt.Sprintf("czxid-%d-%d", i, r%3)
				l, err := c.Lock(ctx, key)
				if err != nil {
					t.Error(err)
					return
				}
				// The first renewal confirms the token against the node's stat.
				if err := b.Refresh(ctx, key, l.Owner(), dlock.DefaultTTL); err != nil {
					t.Errorf("Refresh: %v", err)
				}
				names, _, err := raw.Children(lockPath(key))
				if err != nil || len(names) != 1 {
					t.Errorf("children of %s: %v, %v", key, names, err)
				} else if _, st, err := raw.Get(lockPath(key) + "/" + names[0]); err != nil || uint64(st.Czxid) != uint64(l.Token()) {
					t.Errorf("token %d, node czxid %v (%v)", l.Token(), st, err)
				}
				if err := l.Release(ctx); err != nil {
					t.Error(err)
				}
			}
			if n := logs.count("not the node's czxid"); n > 0 {
				t.Errorf("%d grants ended on a czxid mismatch", n)
			}
		})
	}
	wg.Wait()
}
