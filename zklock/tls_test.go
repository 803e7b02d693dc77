package zklock_test

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
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/dlockio/dlock"
	"github.com/dlockio/dlock/internal/testserver"
	"github.com/dlockio/dlock/zklock"
)

// testPKI writes a CA, a server certificate for 127.0.0.1 and a client certificate
// into dir, and returns their paths.
type testPKI struct{ ca, server, clientCert, clientKey string }

func newPKI(t testing.TB) testPKI {
	t.Helper()
	dir := t.TempDir()
	newKey := func() *ecdsa.PrivateKey {
		k, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
		if err != nil {
			t.Fatal(err)
		}
		return k
	}
	caKey := newKey()
	caTmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "dlock test CA"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(24 * time.Hour),
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign}
	caDER, err := x509.CreateCertificate(rand.Reader, caTmpl, caTmpl, &caKey.PublicKey, caKey)
	if err != nil {
		t.Fatal(err)
	}
	caCert, _ := x509.ParseCertificate(caDER)
	issue := func(serial int64, cn string, usage x509.ExtKeyUsage, ips []net.IP) (certPEM, keyPEM []byte) {
		k := newKey()
		tmpl := &x509.Certificate{SerialNumber: big.NewInt(serial), Subject: pkix.Name{CommonName: cn},
			NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(24 * time.Hour),
			KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{usage}, IPAddresses: ips}
		der, err := x509.CreateCertificate(rand.Reader, tmpl, caCert, &k.PublicKey, caKey)
		if err != nil {
			t.Fatal(err)
		}
		p8, err := x509.MarshalPKCS8PrivateKey(k)
		if err != nil {
			t.Fatal(err)
		}
		return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: p8})
	}
	write := func(name string, data ...[]byte) string {
		p := filepath.Join(dir, name)
		var all []byte
		for _, d := range data {
			all = append(all, d...)
		}
		if err := os.WriteFile(p, all, 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	srvCert, srvKey := issue(2, "127.0.0.1", x509.ExtKeyUsageServerAuth, []net.IP{net.ParseIP("127.0.0.1")})
	cliCert, cliKey := issue(3, "dlock client", x509.ExtKeyUsageClientAuth, nil)
	return testPKI{
		ca:         write("ca.pem", pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: caDER})),
		server:     write("server.pem", srvKey, srvCert),
		clientCert: write("client.pem", cliCert),
		clientKey:  write("client.key", cliKey),
	}
}

// TLS to the server's secure port, with a client certificate the server requires.
func TestTLS(t *testing.T) {
	pki := newPKI(t)
	srv := testserver.StartZooKeeperTLS(t, testserver.ZooKeeperTLS{KeyCertPEM: pki.server, CAPEM: pki.ca, ClientAuth: true})
	ctx := ctxT(t, time.Minute)
	base := "zk://" + srv.SecureAddr() + "/dlock?session_timeout=10s&"
	c, err := dlock.Open(ctx, base+"tls_ca="+pki.ca+"&tls_cert="+pki.clientCert+"&tls_key="+pki.clientKey)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	l, err := c.Lock(ctx, "tls")
	if err != nil {
		t.Fatal(err)
	}
	if err := l.Release(ctx); err != nil {
		t.Fatal(err)
	}

	// The Go option does the same.
	cert, err := tls.LoadX509KeyPair(pki.clientCert, pki.clientKey)
	if err != nil {
		t.Fatal(err)
	}
	caPEM, _ := os.ReadFile(pki.ca)
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(caPEM)
	b, err := zklock.Dial(ctx, []string{srv.SecureAddr()}, zklock.WithTLS(&tls.Config{RootCAs: pool, Certificates: []tls.Certificate{cert}}))
	if err != nil {
		t.Fatal(err)
	}
	b.Close()

	for _, tc := range []struct{ url, says string }{
		{base + "tls_ca=" + pki.ca, "certificate"},                                   // no client certificate
		{base + "tls=true", "certificate"},                                           // server not trusted
		{"zk://" + srv.Addr() + "/dlock?session_timeout=3s&tls_ca=" + pki.ca, "TLS"}, // plain port
	} {
		octx, cancel := context.WithTimeout(ctx, 1500*time.Millisecond)
		c, err := dlock.Open(octx, tc.url)
		cancel()
		if err == nil {
			c.Close()
			t.Errorf("Open(%s) succeeded", tc.url)
			continue
		}
		t.Logf("Open(%s): %v", tc.url, err)
		if !strings.Contains(err.Error(), tc.says) || !errors.Is(err, context.DeadlineExceeded) && !strings.Contains(err.Error(), "session") {
			t.Errorf("Open(%s) = %v", tc.url, err)
		}
	}
}
