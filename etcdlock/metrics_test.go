package etcdlock_test

import (
	"context"
	"errors"
	"net/url"
	"strconv"
	"testing"

	"github.com/dlockio/dlock"
	"github.com/dlockio/dlock/driver"
	"github.com/dlockio/dlock/etcdlock"
	"github.com/dlockio/dlock/internal/testserver"
)

// ServerOps counts the requests the etcd server received, from its own metrics page
// (found from a plain loopback endpoint): reading it costs nothing, a Lock+Release
// cycle costs a few requests, and a backend whose metrics page cannot be read says
// so from ServerOps only.
func TestServerOps(t *testing.T) {
	srv := testserver.StartEtcd(t)
	ctx := context.Background()
	b := open(t, srv.URL("ops"))
	defer b.Close()
	var oc driver.OpsCounter = b
	read := func() int64 {
		t.Helper()
		n, err := oc.ServerOps(ctx)
		if err != nil {
			t.Fatalf("ServerOps: %v", err)
		}
		return n
	}
	a, c := read(), read()
	if a <= 0 {
		t.Fatalf("ServerOps = %d after Open's read, want > 0", a)
	}
	if c != a {
		t.Fatalf("ServerOps moved from %d to %d between two reads with nothing else running", a, c)
	}
	// One driver-level cycle: a creating transaction and a delete.
	req := driver.Request{Key: "k", Owner: "o", TTL: 10e9}
	if _, err := b.Acquire(ctx, req); err != nil {
		t.Fatal(err)
	}
	if err := b.Release(ctx, "k", "o"); err != nil {
		t.Fatal(err)
	}
	if d := read() - c; d < 2 || d > 6 {
		t.Fatalf("a cycle cost %d server requests, want 2 to 6 (transaction and delete, plus the session's lease grant)", d)
	}

	// Another client's requests count too: the counter is the server's.
	other, err := dlock.Open(ctx, srv.URL("ops"))
	if err != nil {
		t.Fatal(err)
	}
	before := read()
	l, err := other.Lock(ctx, "k2")
	if err != nil {
		t.Fatal(err)
	}
	if err := l.Release(ctx); err != nil {
		t.Fatal(err)
	}
	if d := read() - before; d < 2 {
		t.Fatalf("another client's cycle cost %d server requests, want at least 2", d)
	}
	if err := other.Close(); err != nil {
		t.Fatal(err)
	}

	// Given explicitly, the same page gives the same count.
	u, _ := url.Parse(srv.URL("ops"))
	q := u.Query()
	q.Set("metrics", "http://"+srv.Endpoint()+"/metrics")
	u.RawQuery = q.Encode()
	explicit := open(t, u.String())
	defer explicit.Close()
	if n, err := explicit.ServerOps(ctx); err != nil || n < before {
		t.Fatalf("ServerOps with metrics=: %d, %v; want at least %d", n, err, before)
	}

	// A page that cannot be read fails ServerOps, and nothing else.
	port := testserver.FreePort(t)
	q.Set("metrics", "http://127.0.0.1:"+strconv.Itoa(port)+"/metrics")
	u.RawQuery = q.Encode()
	broken := open(t, u.String())
	defer broken.Close()
	if _, err := broken.ServerOps(ctx); err == nil {
		t.Fatal("ServerOps from a closed port succeeded")
	}
	if _, err := broken.Acquire(ctx, req); err != nil {
		t.Fatalf("Acquire with an unreadable metrics page: %v", err)
	}
	if err := broken.Release(ctx, "k", "o"); err != nil {
		t.Fatal(err)
	}
	// So does a page that is not etcd's metrics.
	q.Set("metrics", "http://"+srv.Endpoint()+"/version")
	u.RawQuery = q.Encode()
	notMetrics := open(t, u.String())
	defer notMetrics.Close()
	if _, err := notMetrics.ServerOps(ctx); err == nil {
		t.Fatal("ServerOps from /version succeeded")
	}

	// Without a loopback plain-http endpoint and without metrics=, there is no page:
	// New on a client whose endpoint is not loopback.
	cli := rawClient(t, "http://localhost.invalid:2379")
	nb, err := etcdlock.New(cli)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := nb.ServerOps(ctx); !errors.Is(err, driver.ErrUnsupported) {
		t.Fatalf("ServerOps without a metrics page: %v, want ErrUnsupported", err)
	}
	if err := nb.Close(); err != nil {
		t.Fatal(err)
	}
	for _, bad := range []string{"ftp://127.0.0.1/metrics", "127.0.0.1:2379/metrics", "http:///metrics"} {
		q.Set("metrics", bad)
		u.RawQuery = q.Encode()
		if _, err := etcdlock.Open(ctx, u); !errors.Is(err, driver.ErrInvalid) {
			t.Fatalf("Open with metrics=%s: %v, want ErrInvalid", bad, err)
		}
	}
	if _, err := b.ServerOps(ctx); err != nil {
		t.Fatal(err)
	}
}

// A waiting attempt that queues reports the members ahead of its own, the holder not
// counted (driver.HeldError.Ahead), read from the count of the reply it gets anyway.
func TestPlaceInQueue(t *testing.T) {
	srv := testserver.StartEtcd(t)
	ctx := context.Background()
	b := open(t, srv.URL("place"))
	defer b.Close()
	if _, err := b.Acquire(ctx, driver.Request{Key: "k", Owner: "holder", TTL: 10e9}); err != nil {
		t.Fatal(err)
	}
	for i, w := range []string{"w0", "w1", "w2"} {
		_, err := b.Acquire(ctx, driver.Request{Key: "k", Owner: w, TTL: 10e9, Wait: true, Patience: 10e9})
		var held *driver.HeldError
		if !errors.As(err, &held) {
			t.Fatalf("%s: %v, want a *driver.HeldError", w, err)
		}
		if held.Ahead != i {
			t.Fatalf("%s queued with %d ahead, want %d", w, held.Ahead, i)
		}
	}
	for _, o := range []string{"holder", "w0", "w1", "w2"} {
		if err := b.Release(ctx, "k", o); err != nil {
			t.Fatalf("release %s: %v", o, err)
		}
	}
}
