package etcdlock_test

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"math/big"
	"net"
	"net/url"
	"os"
	"path/filepath"
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

// certs writes a CA, a server certificate for 127.0.0.1 and a client certificate,
// all signed by the CA, as PEM files in dir.
type certs struct{ ca, serverCert, serverKey, clientCert, clientKey string }

func makeCerts(t *testing.T) certs {
	t.Helper()
	dir := t.TempDir()
	caKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	caTmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "dlock test CA"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign,
	}
	caDER, err := x509.CreateCertificate(rand.Reader, caTmpl, caTmpl, &caKey.PublicKey, caKey)
	if err != nil {
		t.Fatal(err)
	}
	caCert, _ := x509.ParseCertificate(caDER)
	write := func(name, typ string, der []byte) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, pem.EncodeToMemory(&pem.Block{Type: typ, Bytes: der}), 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	leaf := func(name string, serial int64, usage x509.ExtKeyUsage) (string, string) {
		key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
		if err != nil {
			t.Fatal(err)
		}
		tmpl := &x509.Certificate{
			SerialNumber: big.NewInt(serial), Subject: pkix.Name{CommonName: name},
			NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
			KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{usage},
			IPAddresses: []net.IP{net.IPv4(127, 0, 0, 1)},
		}
		der, err := x509.CreateCertificate(rand.Reader, tmpl, caCert, &key.PublicKey, caKey)
		if err != nil {
			t.Fatal(err)
		}
		kder, err := x509.MarshalECPrivateKey(key)
		if err != nil {
			t.Fatal(err)
		}
		return write(name+".pem", "CERTIFICATE", der), write(name+"-key.pem", "EC PRIVATE KEY", kder)
	}
	c := certs{ca: write("ca.pem", "CERTIFICATE", caDER)}
	c.serverCert, c.serverKey = leaf("server", 2, x509.ExtKeyUsageServerAuth)
	c.clientCert, c.clientKey = leaf("client", 3, x509.ExtKeyUsageClientAuth)
	return c
}

func lockOnce(t *testing.T, c *dlock.Client) {
	t.Helper()
	ctx := context.Background()
	l, err := c.Lock(ctx, "k")
	if err != nil {
		t.Fatal(err)
	}
	if err := l.Release(ctx); err != nil {
		t.Fatal(err)
	}
}

// A TLS server that requires client certificates: the tls_* URL parameters and the
// WithTLS option reach it; without a client certificate, or without the CA, the
// connection fails.
func TestTLS(t *testing.T) {
	cs := makeCerts(t)
	srv := testserver.StartEtcdTLS(t, cs.serverCert, cs.serverKey, cs.ca)
	ctx := context.Background()
	base := "etcd://" + srv.Endpoint() + "/dlock?dial_timeout=2s"
	c, err := dlock.Open(ctx, base+"&tls_ca="+url.QueryEscape(cs.ca)+"&tls_cert="+url.QueryEscape(cs.clientCert)+"&tls_key="+url.QueryEscape(cs.clientKey))
	if err != nil {
		t.Fatalf("Open with tls_ca, tls_cert, tls_key: %v", err)
	}
	defer c.Close()
	lockOnce(t, c)

	pair, err := tls.LoadX509KeyPair(cs.clientCert, cs.clientKey)
	if err != nil {
		t.Fatal(err)
	}
	pool := x509.NewCertPool()
	pem, _ := os.ReadFile(cs.ca)
	pool.AppendCertsFromPEM(pem)
	u, _ := url.Parse(base)
	b, err := etcdlock.Open(ctx, u, etcdlock.WithTLS(&tls.Config{RootCAs: pool, Certificates: []tls.Certificate{pair}}))
	if err != nil {
		t.Fatalf("Open with WithTLS: %v", err)
	}
	c2, err := dlock.New(b)
	if err != nil {
		t.Fatal(err)
	}
	defer c2.Close()
	lockOnce(t, c2)

	for _, u := range []string{
		base + "&tls_ca=" + url.QueryEscape(cs.ca), // no client certificate
		base + "&tls=true",                         // the system roots do not know the CA
		base,                                       // plain text to a TLS port
	} {
		ctx, cancel := context.WithTimeout(ctx, time.Second)
		c, err := dlock.Open(ctx, u)
		cancel()
		if err == nil {
			c.Close()
			t.Errorf("Open(%s) succeeded", u)
		}
	}
}

// With authentication on, the user and password from the URL are used (never
// shown in errors), and a user with read-write access to the prefix only can lock.
func TestAuth(t *testing.T) {
	srv := testserver.StartEtcd(t)
	ctx := context.Background()
	root := rawClient(t, srv.Endpoint())
	steps := []func() error{
		func() error { _, err := root.UserAdd(ctx, "root", "root-secret"); return err },
		func() error { _, err := root.UserGrantRole(ctx, "root", "root"); return err },
		func() error { _, err := root.RoleAdd(ctx, "locker"); return err },
		func() error {
			_, err := root.RoleGrantPermission(ctx, "locker", "app/", clientv3.GetPrefixRangeEnd("app/"), clientv3.PermissionType(clientv3.PermReadWrite))
			return err
		},
		func() error { _, err := root.UserAdd(ctx, "app", "app-secret"); return err },
		func() error { _, err := root.UserGrantRole(ctx, "app", "locker"); return err },
		func() error { _, err := root.AuthEnable(ctx); return err },
	}
	for _, step := range steps {
		if err := step(); err != nil {
			t.Fatal(err)
		}
	}
	t.Cleanup(func() {
		cli, err := clientv3.New(clientv3.Config{Endpoints: []string{srv.Endpoint()}, Username: "root", Password: "root-secret", Logger: zap.NewNop()})
		if err == nil {
			_, _ = cli.AuthDisable(ctx)
			cli.Close()
		}
	})

	c, err := dlock.Open(ctx, "etcd://app:app-secret@"+srv.Endpoint()+"/app")
	if err != nil {
		t.Fatalf("Open as app: %v", err)
	}
	defer c.Close()
	lockOnce(t, c)
	// Waiting, inspecting and the session's checks work with those rights too.
	l, err := c.Lock(ctx, "w")
	if err != nil {
		t.Fatal(err)
	}
	if info, err := c.Backend().(driver.Inspector).Inspect(ctx, "w"); err != nil || info.TTL <= 0 || info.Owner != l.Owner() {
		t.Fatalf("Inspect as app = %+v, %v", info, err)
	}
	waited := make(chan error, 1)
	go func() {
		l2, err := c.Lock(ctx, "w")
		if err == nil {
			err = l2.Release(ctx)
		}
		waited <- err
	}()
	time.Sleep(100 * time.Millisecond)
	if err := l.Release(ctx); err != nil {
		t.Fatal(err)
	}
	if err := <-waited; err != nil {
		t.Fatalf("waiting Lock as app: %v", err)
	}
	// So do values and holder watches.
	hw, err := c.Backend().(driver.HolderWatcher).WatchHolder(ctx, "v")
	if err != nil {
		t.Fatalf("WatchHolder as app: %v", err)
	}
	lv, err := c.Campaign(ctx, "v", []byte("x"))
	if err != nil {
		t.Fatal(err)
	}
	if err := lv.Proclaim(ctx, []byte("y")); err != nil {
		t.Fatalf("Proclaim as app: %v", err)
	}
	<-hw.C()
	hw.Stop()
	if err := lv.Resign(ctx); err != nil {
		t.Fatal(err)
	}

	for _, u := range []string{
		"etcd://app:wrong-secret@" + srv.Endpoint() + "/app",
		"etcd://" + srv.Endpoint() + "/app", // no credentials
	} {
		ctx, cancel := context.WithTimeout(ctx, 3*time.Second)
		c, err := dlock.Open(ctx, u)
		cancel()
		if err == nil {
			c.Close()
			t.Errorf("Open(%s) succeeded", u)
			continue
		}
		if strings.Contains(err.Error(), "wrong-secret") {
			t.Errorf("error shows the password: %v", err)
		}
	}
	// Outside its prefix, the user is refused.
	appCli, err := clientv3.New(clientv3.Config{Endpoints: []string{srv.Endpoint()}, Username: "app", Password: "app-secret", Logger: zap.NewNop()})
	if err != nil {
		t.Fatal(err)
	}
	defer appCli.Close()
	ob, err := etcdlock.New(ctx, appCli, etcdlock.WithPrefix("other"))
	if err != nil {
		t.Fatal(err)
	}
	defer ob.Close()
	start := time.Now()
	if _, err := ob.WatchHolder(ctx, "k"); !errors.Is(err, dlock.ErrAuth) || time.Since(start) > 3*time.Second {
		t.Fatalf("WatchHolder outside the user's prefix = %v after %v, want ErrAuth at once", err, time.Since(start))
	}
	other, err := dlock.Open(ctx, "etcd://app:app-secret@"+srv.Endpoint()+"/other")
	if err == nil {
		defer other.Close()
		if _, err := other.TryLock(ctx, "k"); err == nil || errors.Is(err, dlock.ErrLocked) {
			t.Fatalf("TryLock outside the user's prefix = %v", err)
		}
	}
}
