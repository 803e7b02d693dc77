package testserver

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"time"
)

// StartRedisNodes starts n independent redis-server masters (for Redlock), each with
// the extra arguments.
func StartRedisNodes(t TB, n int, extra ...string) []*Redis {
	t.Helper()
	nodes := make([]*Redis, n)
	for i := range nodes {
		nodes[i] = StartRedis(t, extra...)
	}
	return nodes
}

// RedlockURL returns redlock://host:port,host:port,...[/0][?query] for the nodes.
func RedlockURL(nodes []*Redis, query string) string {
	addrs := make([]string, len(nodes))
	for i, n := range nodes {
		addrs[i] = n.Addr()
	}
	u := "redlock://" + strings.Join(addrs, ",") + "/0"
	if query != "" {
		u += "?" + query
	}
	return u
}

// TLSFiles are PEM files for a test CA and a server certificate it signed, valid for
// 127.0.0.1 and localhost.
type TLSFiles struct {
	CA, Cert, Key string
}

// NewTLSFiles writes a fresh CA and server certificate into a temporary directory.
func NewTLSFiles(t TB) TLSFiles {
	t.Helper()
	dir := t.TempDir()
	caKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	now := time.Now()
	caTmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "dlock test CA"},
		NotBefore: now.Add(-time.Hour), NotAfter: now.Add(24 * time.Hour),
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign,
	}
	caDER, err := x509.CreateCertificate(rand.Reader, caTmpl, caTmpl, &caKey.PublicKey, caKey)
	if err != nil {
		t.Fatal(err)
	}
	ca, err := x509.ParseCertificate(caDER)
	if err != nil {
		t.Fatal(err)
	}
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(2), Subject: pkix.Name{CommonName: "localhost"},
		NotBefore: now.Add(-time.Hour), NotAfter: now.Add(24 * time.Hour),
		DNSNames: []string{"localhost"}, IPAddresses: []net.IP{net.ParseIP("127.0.0.1")},
		KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca, &key.PublicKey, caKey)
	if err != nil {
		t.Fatal(err)
	}
	keyDER, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	f := TLSFiles{CA: filepath.Join(dir, "ca.pem"), Cert: filepath.Join(dir, "server.pem"), Key: filepath.Join(dir, "server.key")}
	write := func(path, typ string, b []byte) {
		if err := os.WriteFile(path, pem.EncodeToMemory(&pem.Block{Type: typ, Bytes: b}), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	write(f.CA, "CERTIFICATE", caDER)
	write(f.Cert, "CERTIFICATE", der)
	write(f.Key, "EC PRIVATE KEY", keyDER)
	return f
}

// StartRedisTLS starts a redis-server that also listens for TLS on the returned port
// (clients need not present a certificate). Its plain port stays open for readiness
// checks and test inspection.
func StartRedisTLS(t TB, f TLSFiles, extra ...string) (*Redis, int) {
	t.Helper()
	port := FreePort(t)
	args := append([]string{"--tls-port", strconv.Itoa(port), "--tls-cert-file", f.Cert, "--tls-key-file", f.Key,
		"--tls-ca-cert-file", f.CA, "--tls-auth-clients", "no"}, extra...)
	return StartRedis(t, args...), port
}

// StartDelayProxy forwards TCP connections from a new loopback port to target,
// delaying every chunk by oneWay in each direction (a round trip costs 2*oneWay
// more), so that benchmarks on one machine can show how a protocol behaves when
// round trips, not CPU, dominate. It returns the proxy's host:port and stops, with
// every connection, when the test ends.
func StartDelayProxy(t TB, target string, oneWay time.Duration) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatalf("delay proxy: %v", err)
	}
	p := &delayProxy{}
	p.wg.Go(func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			s, err := net.Dial("tcp", target)
			if err != nil {
				c.Close()
				continue
			}
			if !p.track(c, s) {
				return
			}
			p.pipe(s, c, oneWay)
			p.pipe(c, s, oneWay)
		}
	})
	t.Cleanup(func() {
		ln.Close()
		p.closeAll()
		p.wg.Wait()
	})
	return ln.Addr().String()
}

type delayProxy struct {
	wg     sync.WaitGroup
	mu     sync.Mutex
	closed bool
	conns  []net.Conn
}

func (p *delayProxy) track(cs ...net.Conn) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		for _, c := range cs {
			c.Close()
		}
		return false
	}
	p.conns = append(p.conns, cs...)
	return true
}

func (p *delayProxy) closeAll() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.closed = true
	for _, c := range p.conns {
		c.Close()
	}
}

// pipe copies src to dst, each chunk written oneWay after it was read; order is kept
// and reading goes on while chunks wait, so the delay does not limit throughput.
func (p *delayProxy) pipe(dst, src net.Conn, oneWay time.Duration) {
	type chunk struct {
		b  []byte
		at time.Time
	}
	ch := make(chan chunk, 4096)
	p.wg.Go(func() {
		defer close(ch)
		for {
			buf := make([]byte, 4<<10)
			n, err := src.Read(buf)
			if n > 0 {
				ch <- chunk{buf[:n], time.Now().Add(oneWay)}
			}
			if err != nil {
				return
			}
		}
	})
	p.wg.Go(func() {
		defer dst.Close()
		defer src.Close()
		for c := range ch {
			if d := time.Until(c.at); d > 0 {
				time.Sleep(d)
			}
			if _, err := dst.Write(c.b); err != nil {
				src.Close() // stops the reader
				for range ch {
				}
				return
			}
		}
	})
}
