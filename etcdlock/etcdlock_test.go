package etcdlock_test

import (
	"context"
	"errors"
	"net/url"
	"strconv"
	"strings"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/goleak"
	"go.uber.org/zap"

	"github.com/dlockio/dlock"
	"github.com/dlockio/dlock/driver"
	"github.com/dlockio/dlock/drivertest"
	"github.com/dlockio/dlock/etcdlock"
	"github.com/dlockio/dlock/internal/storeops"
	_ "github.com/dlockio/dlock/internal/storeops/etcdops" // the store the harness measures with
	"github.com/dlockio/dlock/internal/testserver"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m, leakOptions()...) }

func open(t testing.TB, rawURL string) *etcdlock.Backend {
	t.Helper()
	u, err := url.Parse(rawURL)
	if err != nil {
		t.Fatal(err)
	}
	b, err := etcdlock.Open(context.Background(), u)
	if err != nil {
		t.Fatalf("Open: %v", err)
	}
	return b
}

// rawClient is a plain etcd client, for the harness and for checks behind the
// backend's back.
func rawClient(t testing.TB, endpoints ...string) *clientv3.Client {
	t.Helper()
	cli, err := clientv3.New(clientv3.Config{Endpoints: endpoints, DialTimeout: 5 * time.Second, Logger: zap.NewNop()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cli.Close() })
	return cli
}

func harness(t testing.TB, srv *testserver.Etcd) drivertest.Harness {
	cli := rawClient(t, srv.Endpoint())
	keyer, err := etcdlock.New(context.Background(), cli)
	if err != nil {
		t.Fatal(err)
	}
	ops, err := storeops.Open(context.Background(), srv.URL("dlock"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ops.Close() })
	return drivertest.Harness{
		Open: func(t testing.TB) driver.Backend { return open(t, srv.URL("dlock")) },
		// A crashed holder: its session lease ends on the server.
		Expire: func(t testing.TB, key string) {
			ctx := context.Background()
			resp, err := cli.Get(ctx, keyer.LockPrefix(key), clientv3.WithFirstCreate()...)
			if err != nil {
				t.Fatal(err)
			}
			if len(resp.Kvs) == 0 {
				t.Fatalf("Expire(%q): no holder", key)
			}
			if _, err := cli.Revoke(ctx, clientv3.LeaseID(resp.Kvs[0].Lease)); err != nil {
				t.Fatal(err)
			}
		},
		Fencing:   true,
		FIFO:      true,
		Ops:       ops.Ops,
		Floor:     ops.FloorCycle,
		RoundTrip: func(ctx context.Context) error { _, err := cli.Get(ctx, "ping"); return err },
		Namespace: func(t testing.TB, ns string) (driver.Backend, error) {
			u, err := url.Parse(srv.URL(""))
			if err != nil {
				t.Fatal(err)
			}
			b, err := etcdlock.Open(context.Background(), u, etcdlock.WithPrefix(ns))
			if err != nil {
				return nil, err
			}
			return b, nil
		},
	}
}

func TestConformance(t *testing.T) {
	srv := testserver.StartEtcd(t)
	drivertest.Run(t, harness(t, srv))
}

// A Lock against endpoints where nothing listens fails within its context, with an
// error that says what failed and hides the password.
func TestUnreachable(t *testing.T) {
	port := testserver.FreePort(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	start := time.Now()
	_, err := dlock.Open(ctx, "etcd://user:secretpw@127.0.0.1:"+strconv.Itoa(port)+"/dlock")
	if err == nil {
		t.Fatal("Open of a closed port succeeded")
	}
	if d := time.Since(start); d > 4*time.Second {
		t.Fatalf("Open took %v with a 2s context", d)
	}
	if strings.Contains(err.Error(), "secretpw") {
		t.Fatalf("error shows the password: %v", err)
	}
	if !strings.Contains(err.Error(), "connect") {
		t.Fatalf("error does not say what failed: %v", err)
	}

	// The server dies after Open.
	srv := testserver.StartEtcd(t)
	c, err := dlock.Open(context.Background(), srv.URL("dlock")+"?timeout=500ms")
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	srv.Stop()
	lctx, lcancel := context.WithTimeout(context.Background(), time.Second)
	defer lcancel()
	start = time.Now()
	_, err = c.Lock(lctx, "k")
	if err == nil {
		t.Fatal("Lock succeeded on a dead server")
	}
	if d := time.Since(start); d > 3*time.Second {
		t.Fatalf("Lock took %v with a 1s context", d)
	}
	if !errors.Is(err, context.DeadlineExceeded) || !strings.Contains(err.Error(), "etcdlock") {
		t.Fatalf("Lock on a dead server = %v, want a wrapped etcdlock error and DeadlineExceeded", err)
	}
	// Without a deadline, the request timeout bounds it.
	start = time.Now()
	if _, err := c.TryLock(context.Background(), "k"); err == nil || !strings.Contains(err.Error(), "etcdlock") {
		t.Fatalf("TryLock on a dead server = %v", err)
	}
	if d := time.Since(start); d > 3*time.Second {
		t.Fatalf("TryLock took %v with a 500ms request timeout", d)
	}
}

func TestURLParameters(t *testing.T) {
	srv := testserver.StartEtcd(t)
	ctx := context.Background()
	ep := srv.Endpoint()
	for _, u := range []string{
		"etcd://" + ep + "/dlock?bogus=1",
		"etcd://" + ep + "/dlock?timeout=x",
		"etcd://" + ep + "/dlock?timeout=0s",
		"etcd://" + ep + "/dlock?dial_timeout=-1s",
		"etcd://" + ep + "/dlock?tls=maybe",
		"etcd://" + ep + "/dlock?tls_ca=/nonexistent",
		"etcd://" + ep + "/dlock?tls_cert=c.pem",
		"etcd://" + ep + "/dlock?tls=false&tls_ca=/etc/hostname",
		"etcd://" + ep + ",/dlock",
		"etcd://127.0.0.1:99999/dlock",
		"etcd:///dlock",
		"etcd://user@" + ep + "/dlock",
		"etcd://" + ep + "/dl%01ock",
	} {
		c, err := dlock.Open(ctx, u)
		if err == nil {
			c.Close()
			t.Errorf("Open(%q) succeeded", u)
		} else if !errors.Is(err, dlock.ErrInvalid) {
			t.Errorf("Open(%q) = %v, want ErrInvalid", u, err)
		}
	}
	// Prefixes separate namespaces; ttl from the URL applies; a default port.
	a, err := dlock.Open(ctx, "etcd://"+ep+"/app1?ttl=5s")
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	b, err := dlock.Open(ctx, "etcd://"+ep+"/app/2/?timeout=2s&dial_timeout=2s")
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	la, err := a.TryLock(ctx, "k/with/slashes%")
	if err != nil {
		t.Fatal(err)
	}
	lb, err := b.TryLock(ctx, "k/with/slashes%")
	if err != nil {
		t.Fatalf("prefix app/2 blocked by app1: %v", err)
	}
	if la.TTL() != 5*time.Second {
		t.Fatalf("ttl from URL not applied: %v", la.TTL())
	}
	resp, err := rawClient(t, ep).Get(ctx, "app1/k%2Fwith%2Fslashes%25\x1f", clientv3.WithPrefix())
	if err != nil || len(resp.Kvs) != 1 || resp.Kvs[0].CreateRevision != int64(la.Token()) || string(resp.Kvs[0].Value) != la.Owner() {
		t.Fatalf("member key of app1 not where documented: %v %v", resp, err)
	}
	_ = la.Release(ctx)
	_ = lb.Release(ctx)
	if _, err := etcdlock.New(ctx, rawClient(t, ep), etcdlock.WithAuth("u", "p")); !errors.Is(err, dlock.ErrInvalid) {
		t.Fatalf("New with WithAuth = %v, want ErrInvalid", err)
	}
}

// leakOptions lists goroutines that outlive their owners by design in libraries the
// tests use, none of them started by dlock.
func leakOptions() []goleak.Option { return nil }
