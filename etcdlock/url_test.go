package etcdlock_test

import (
	"context"
	"errors"
	"net/url"
	"strings"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"

	"github.com/dlockio/dlock"
	"github.com/dlockio/dlock/driver"
	"github.com/dlockio/dlock/etcdlock"
	"github.com/dlockio/dlock/internal/testserver"
)

// Issue 17 item 5: malformed parameters were dropped (?timeout=1s% gave 5s).
func TestOpenRejectsMalformedQuery(t *testing.T) {
	srv := testserver.StartEtcd(t)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	for _, q := range []string{"timeout=1s%", "tls=false;x=1", "dial_timeout=1s&timeout=2s%zz"} {
		u, err := url.Parse(srv.URL("dlock") + "?" + q)
		if err != nil {
			t.Fatal(err)
		}
		b, err := etcdlock.Open(ctx, u)
		if err == nil {
			b.Close()
			t.Errorf("Open(?%s) succeeded", q)
			continue
		}
		if !errors.Is(err, driver.ErrInvalid) {
			t.Errorf("Open(?%s) = %v, want ErrInvalid", q, err)
		}
	}
}

// Issue 17 item 11: the README's etcd://h1:2379,h2/prefix did not parse.
func TestOpenHostList(t *testing.T) {
	srv := testserver.StartEtcd(t)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	// The second entry (port 2379) is no server: the client uses the first.
	c, err := dlock.Open(ctx, "etcd://"+srv.Endpoint()+",127.0.0.2/hosts")
	if err != nil {
		t.Fatalf("Open with a host list: %v", err)
	}
	lockOnce(t, c)
	c.Close()
	u, err := driver.ParseURL("etcd://" + srv.Endpoint() + ",localhost/hosts")
	if err != nil {
		t.Fatalf("ParseURL: %v", err)
	}
	if u.Host != srv.Endpoint()+",localhost" || u.Path != "/hosts" {
		t.Fatalf("ParseURL: host %q, path %q", u.Host, u.Path)
	}
}

// Issue 17 item 11: TLS failures said only "context deadline exceeded", after the
// whole dial timeout, where the other backends name the cause.
func TestOpenTLSFailureNamesCause(t *testing.T) {
	cs := makeCerts(t)
	srv := testserver.StartEtcdTLS(t, cs.serverCert, cs.serverKey, cs.ca)
	base := "etcd://" + srv.Endpoint() + "/dlock?dial_timeout=5s"
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()

	_, err := dlock.Open(ctx, base+"&tls=true") // the system roots do not know the CA
	if err == nil || !strings.Contains(err.Error(), "x509") {
		t.Errorf("Open without the CA = %v, want the x509 cause", err)
	}
	_, err = dlock.Open(ctx, base+"&tls_ca="+url.QueryEscape(cs.ca)) // no client certificate
	if !errors.Is(err, dlock.ErrAuth) || !strings.Contains(err.Error(), "certificate") {
		t.Errorf("Open without a client certificate = %v, want ErrAuth naming the certificate", err)
	}
}

// Issue 17 item 11: refused credentials were reported as the backend being
// unreachable.
func TestOpenAuthFailure(t *testing.T) {
	srv := testserver.StartEtcd(t)
	ctx := context.Background()
	root := rawClient(t, srv.Endpoint())
	for _, step := range []func() error{
		func() error { _, err := root.UserAdd(ctx, "root", "root-secret"); return err },
		func() error { _, err := root.UserGrantRole(ctx, "root", "root"); return err },
		func() error { _, err := root.UserAdd(ctx, "app", "app-secret"); return err },
		func() error { _, err := root.AuthEnable(ctx); return err },
	} {
		if err := step(); err != nil {
			t.Fatal(err)
		}
	}
	for _, raw := range []string{
		"etcd://app:wrong-secret@" + srv.Endpoint() + "/app", // wrong password
		"etcd://" + srv.Endpoint() + "/app",                  // no credentials
		"etcd://app:app-secret@" + srv.Endpoint() + "/app",   // no permission on the prefix
	} {
		octx, cancel := context.WithTimeout(ctx, 10*time.Second)
		c, err := dlock.Open(octx, raw)
		cancel()
		if err == nil {
			c.Close()
			t.Errorf("Open(%s) succeeded", raw)
			continue
		}
		if !errors.Is(err, dlock.ErrAuth) {
			t.Errorf("Open(%s) = %v, want ErrAuth", raw, err)
		}
		if strings.Contains(err.Error(), "wrong-secret") {
			t.Errorf("the error shows the password: %v", err)
		}
	}
	// Let the server's shutdown and other tests not trip on auth.
	cli, err := clientv3.New(clientv3.Config{Endpoints: []string{srv.Endpoint()}, Username: "root", Password: "root-secret", Logger: zap.NewNop()})
	if err != nil {
		t.Fatal(err)
	}
	defer cli.Close()
	if _, err := cli.AuthDisable(ctx); err != nil {
		t.Fatal(err)
	}
}
