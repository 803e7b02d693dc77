package etcdops

import (
	"context"
	"errors"
	"net/url"
	"strconv"
	"testing"

	"github.com/dlockio/dlock"
	"github.com/dlockio/dlock/driver"
	_ "github.com/dlockio/dlock/etcdlock"
	"github.com/dlockio/dlock/internal/storeops"
	"github.com/dlockio/dlock/internal/testserver"
)

func openEtcdStore(t *testing.T, rawURL string) storeops.Store {
	t.Helper()
	s, err := storeops.Open(context.Background(), rawURL)
	if err != nil {
		t.Fatalf("Open(%s): %v", rawURL, err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

// Ops counts the requests the etcd server received, from its own metrics page
// (found from a plain loopback endpoint): reading it costs nothing, a Lock+Release
// cycle costs a few requests, whoever makes them, and a metrics page that cannot be
// read fails Ops only.
func TestEtcdOps(t *testing.T) {
	srv := testserver.StartEtcd(t)
	ctx := context.Background()
	s := openEtcdStore(t, srv.URL("ops"))
	read := func(s storeops.Store) int64 {
		t.Helper()
		n, err := s.Ops(ctx)
		if err != nil {
			t.Fatalf("Ops: %v", err)
		}
		return n
	}
	a, c := read(s), read(s)
	if a <= 0 {
		t.Fatalf("Ops = %d after Open's read, want > 0", a)
	}
	if c != a {
		t.Fatalf("Ops moved from %d to %d between two reads with nothing else running", a, c)
	}

	// A dlock client's cycle: its session's lease grant, a creating transaction and
	// a delete, and a keep-alive or two.
	client, err := dlock.Open(ctx, srv.URL("ops"))
	if err != nil {
		t.Fatal(err)
	}
	before := read(s)
	l, err := client.Lock(ctx, "k")
	if err != nil {
		t.Fatal(err)
	}
	if err := l.Release(ctx); err != nil {
		t.Fatal(err)
	}
	if d := read(s) - before; d < 2 || d > 6 {
		t.Fatalf("a cycle cost %d server requests, want 2 to 6 (transaction and delete, plus the session's lease grant)", d)
	}
	if err := client.Close(); err != nil {
		t.Fatal(err)
	}

	// The floor costs at least its transaction and delete.
	before = read(s)
	if err := s.FloorCycle(ctx, "f"); err != nil {
		t.Fatal(err)
	}
	if err := s.FloorCycle(ctx, "f"); err != nil {
		t.Fatalf("second FloorCycle on the same key: %v", err)
	}
	if d := read(s) - before; d < 4 {
		t.Fatalf("two floor cycles cost %d server requests, want at least 4", d)
	}

	// Given explicitly, the same page gives the same count.
	u, _ := url.Parse(srv.URL("ops"))
	q := u.Query()
	q.Set("metrics", "http://"+srv.Endpoint()+"/metrics")
	u.RawQuery = q.Encode()
	if n := read(openEtcdStore(t, u.String())); n < before {
		t.Fatalf("Ops with metrics=: %d, want at least %d", n, before)
	}

	// A page that cannot be read fails Ops, and nothing else.
	port := testserver.FreePort(t)
	q.Set("metrics", "http://127.0.0.1:"+strconv.Itoa(port)+"/metrics")
	u.RawQuery = q.Encode()
	broken := openEtcdStore(t, u.String())
	if _, err := broken.Ops(ctx); err == nil {
		t.Fatal("Ops from a closed port succeeded")
	}
	if err := broken.FloorCycle(ctx, "g"); err != nil {
		t.Fatalf("FloorCycle with an unreadable metrics page: %v", err)
	}
	// So does a page that is not etcd's metrics.
	q.Set("metrics", "http://"+srv.Endpoint()+"/version")
	u.RawQuery = q.Encode()
	if _, err := openEtcdStore(t, u.String()).Ops(ctx); err == nil {
		t.Fatal("Ops from /version succeeded")
	}

	// Without a loopback plain-http endpoint and without metrics=, there is no page.
	if ms := etcdLoopbackMetrics([]string{"http://localhost.invalid:2379"}); ms != nil {
		t.Fatalf("metrics pages of a non-loopback endpoint: %v", ms)
	}
	nopage := &etcdStore{}
	if _, err := nopage.Ops(ctx); !errors.Is(err, errors.ErrUnsupported) {
		t.Fatalf("Ops without a metrics page: %v, want errors.ErrUnsupported", err)
	}
	for _, bad := range []string{"ftp://127.0.0.1/metrics", "127.0.0.1:2379/metrics", "http:///metrics"} {
		q.Set("metrics", bad)
		u.RawQuery = q.Encode()
		s, err := storeops.Open(ctx, u.String())
		if err == nil {
			s.Close()
		}
		if !errors.Is(err, driver.ErrInvalid) {
			t.Fatalf("Open with metrics=%s: %v, want ErrInvalid", bad, err)
		}
	}
	if _, err := s.Ops(ctx); err != nil {
		t.Fatal(err)
	}
}
