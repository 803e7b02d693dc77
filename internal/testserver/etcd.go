package testserver

import (
	"context"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/dlockio/dlock/internal/devserver"
)

// Etcd is an etcd member embedded in the test process (go.etcd.io/etcd/server/v3/embed),
// so the etcd tests need nothing installed. It listens on free loopback ports with
// its data in a temporary directory, and stops when the test ends.
type Etcd struct {
	*devserver.Member
}

// URL returns an etcd:// URL for the member with the given key prefix.
func (e *Etcd) URL(prefix string) string { return "etcd://" + e.Endpoint() + "/" + prefix }

// StartEtcd starts a single-member etcd.
func StartEtcd(t testing.TB) *Etcd {
	t.Helper()
	return StartEtcdTLS(t, "", "", "")
}

// StartEtcdTLS starts a single-member etcd whose client port serves TLS with the
// given certificate and key (PEM files), and, when clientCA is not empty, requires
// client certificates signed by that CA. Empty certFile means no TLS.
func StartEtcdTLS(t testing.TB, certFile, keyFile, clientCA string) *Etcd {
	t.Helper()
	dir := t.TempDir()
	var last error
	for attempt := range 3 { // a free port may be taken before etcd binds it
		m, err := devserver.NewMember(devserver.Config{
			Dir: filepath.Join(dir, strconv.Itoa(attempt)), Name: "etcd-test",
			CertFile: certFile, KeyFile: keyFile, ClientCAFile: clientCA,
		})
		if err != nil {
			t.Fatalf("start etcd: %v", err)
		}
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		last = m.Start(ctx)
		cancel()
		if last == nil {
			t.Cleanup(m.Stop)
			return &Etcd{Member: m}
		}
	}
	t.Fatalf("start etcd: %v", last)
	return nil
}

// EtcdCluster is a cluster of embedded etcd members whose members can be stopped,
// killed and restarted one at a time.
type EtcdCluster struct {
	*devserver.Cluster
}

// URL returns an etcd:// URL listing every member, with the given key prefix.
func (c *EtcdCluster) URL(prefix string) string {
	return "etcd://" + strings.Join(c.Endpoints(), ",") + "/" + prefix
}

// StartEtcdCluster starts an n-member cluster with the given Raft heartbeat and
// election timeout (0 for etcd's defaults).
func StartEtcdCluster(t testing.TB, n int, tickMs, electionMs uint) *EtcdCluster {
	t.Helper()
	dir := t.TempDir()
	var last error
	for attempt := range 3 {
		c, err := devserver.NewCluster(filepath.Join(dir, strconv.Itoa(attempt)), n, tickMs, electionMs)
		if err != nil {
			t.Fatalf("start etcd cluster: %v", err)
		}
		ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
		last = c.Start(ctx)
		cancel()
		if last == nil {
			t.Cleanup(c.Stop)
			return &EtcdCluster{Cluster: c}
		}
		c.Stop()
	}
	t.Fatalf("start etcd cluster: %v", last)
	return nil
}
