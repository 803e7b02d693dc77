package bench

import (
	"fmt"
	"slices"
	"strconv"
	"strings"

	"github.com/dlockio/dlock/internal/testserver"
)

// Server kinds that StartServers knows.
const (
	ServerRedis    = "redis"    // one redis-server
	ServerRedlock  = "redlock"  // five redis-server masters
	ServerEtcd     = "etcd"     // one etcd member, a process of its own
	ServerZK       = "zk"       // one ZooKeeper server (Debian package zookeeper)
	ServerPostgres = "postgres" // one PostgreSQL cluster (Debian package postgresql)
)

// ServerKinds lists the kinds StartServers knows, in the order it starts them.
var ServerKinds = []string{ServerRedis, ServerRedlock, ServerEtcd, ServerZK, ServerPostgres}

// PostgresMaxConnections is the max_connections of a started PostgreSQL.
const PostgresMaxConnections = 300

// RedlockNodes is how many masters a started Redlock gets.
const RedlockNodes = 5

// Servers are local servers started by StartServers.
type Servers struct {
	// Targets are the started servers' backends, in the order of ServerKinds.
	Targets []Target
	// Skipped says, per kind, why it was not started (not installed, failed).
	Skipped map[string]string

	host *testserver.Host
}

// StartServers starts a local server for every kind in kinds (nil means all of
// ServerKinds) that is installed, the way the tests do: on free 127.0.0.1 ports, in a
// temporary directory, with no persistence for Redis and ZooKeeper and PostgreSQL's
// default settings (fsync on). A kind that is not installed or fails to start is
// listed in Skipped and the others still start. Stop stops them all; they are also
// killed if this process dies. Servers inherit this process's CPU affinity (see Pin).
func StartServers(kinds []string) (*Servers, error) {
	if kinds == nil {
		kinds = ServerKinds
	}
	for _, k := range kinds {
		if !slices.Contains(ServerKinds, k) {
			return nil, fmt.Errorf("unknown server kind %q (known: %s)", k, strings.Join(ServerKinds, ", "))
		}
	}
	host, err := testserver.NewHost("dlock-bench")
	if err != nil {
		return nil, err
	}
	s := &Servers{Skipped: map[string]string{}, host: host}
	for _, kind := range ServerKinds {
		if !slices.Contains(kinds, kind) {
			continue
		}
		t, err := testserver.Try(s.host, func(tb testserver.TB) Target { return start(tb, kind) })
		if err != nil {
			s.Skipped[kind] = err.Error()
			continue
		}
		s.Targets = append(s.Targets, t)
	}
	return s, nil
}

func start(tb testserver.TB, kind string) Target {
	switch kind {
	case ServerRedis:
		r := testserver.StartRedis(tb)
		return Target{Name: "redis", URL: r.URL(), Note: "redis-server started by dlock bench, no persistence"}
	case ServerRedlock:
		nodes := testserver.StartRedisNodes(tb, RedlockNodes)
		return Target{Name: "redlock", URL: testserver.RedlockURL(nodes, "node_timeout=1s"),
			Note: fmt.Sprintf("%d redis-server masters started by dlock bench", RedlockNodes)}
	case ServerEtcd:
		e := testserver.StartEtcd(tb)
		return Target{Name: "etcd", URL: e.URL("dlock"), Note: "one etcd member (dlock started as an etcd member)"}
	case ServerZK:
		z := testserver.StartZooKeeper(tb)
		return Target{Name: "zk", URL: z.URL("/dlock"), Note: "standalone ZooKeeper started by dlock bench, forceSync=no"}
	case ServerPostgres:
		// Room for the peers' connections (dlock bench --peers) beside the
		// hundred or so that pglock's clients reach with 256 waiters.
		p := testserver.StartPostgres(tb, "-c", "max_connections="+strconv.Itoa(PostgresMaxConnections))
		return Target{Name: "postgres", URL: p.URL(), Note: fmt.Sprintf("PostgreSQL started by dlock bench, default settings (fsync on) but max_connections=%d", PostgresMaxConnections)}
	}
	panic("unknown kind " + kind)
}

// Stop stops every server and removes their directories.
func (s *Servers) Stop() {
	if s != nil && s.host != nil {
		s.host.Close()
	}
}
