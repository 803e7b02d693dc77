package check

import (
	"context"
	"fmt"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"time"

	toxiproxy "github.com/Shopify/toxiproxy/v2"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/redis/go-redis/v9"
	"github.com/rs/zerolog"

	"github.com/dlockio/dlock/driver"
	"github.com/dlockio/dlock/internal/testserver"
)

// setup is a backend with its servers, as a check run starts them.
type setup struct {
	name, describe string
	proxied        bool // workers reach the server through their own TCP proxy
	hold           func(ttl time.Duration) time.Duration
	roundTTL       func(ttl time.Duration) time.Duration
	start          func(tb testserver.TB, ttl time.Duration) *target
}

func fullTTL(ttl time.Duration) time.Duration { return ttl }

// halfTTL is the hold promise of session backends (etcd, ZooKeeper): their
// keep-alives are not in the history, so a grant is only known to live for part of
// its TTL after the attempt that made it.
func halfTTL(ttl time.Duration) time.Duration { return ttl / 2 }

func asIs(ttl time.Duration) time.Duration { return ttl }

func wholeSeconds(ttl time.Duration) time.Duration {
	return max(time.Second, (ttl+time.Second-1)/time.Second*time.Second)
}

var setups = map[string]*setup{}

func addSetup(s *setup) { setups[s.name] = s }

// Setups lists the setup names in order.
func Setups() []string {
	names := make([]string, 0, len(setups))
	for n := range setups {
		names = append(names, n)
	}
	slices.Sort(names)
	return names
}

func init() {
	redisSetup := func(name, describe string, extra ...string) *setup {
		return &setup{name: name, describe: describe, proxied: true, hold: fullTTL, roundTTL: asIs,
			start: func(tb testserver.TB, _ time.Duration) *target {
				r := testserver.StartRedis(tb, extra...)
				return &target{upstream: r.Addr(), url: redisURL(""), redis: r}
			}}
	}
	addSetup(redisSetup("redis", "one redis-server, appendonly no (a restart loses every key)"))
	addSetup(redisSetup("redis-aof", "one redis-server, appendonly yes, appendfsync always", "--appendonly", "yes", "--appendfsync", "always"))
	replicated := func(name, describe, query string) *setup {
		return &setup{name: name, describe: describe, proxied: true, hold: fullTTL, roundTTL: asIs,
			start: func(tb testserver.TB, _ time.Duration) *target {
				m := testserver.StartRedis(tb)
				r := testserver.StartRedis(tb)
				t := &target{upstream: m.Addr(), url: redisURL(query), redis: m, replica: r}
				tb.Cleanup(t.stopProxies)
				if err := t.linkReplica(); err != nil {
					tb.Fatalf("%v", err)
				}
				return t
			}}
	}
	addSetup(replicated("redis-replica", "redis-server master + replica, the lock waits for 1 replica ack (WAIT), no persistence", "replicas=1&replica_timeout=100ms"))
	addSetup(replicated("redis-async", "redis-server master + replica, asynchronous replication (no WAIT), no persistence", ""))
	sentinel := func(name, describe, query string) *setup {
		return &setup{name: name, describe: describe, hold: fullTTL, roundTTL: sentinelTTL,
			start: func(tb testserver.TB, _ time.Duration) *target {
				s := testserver.StartSentinel(tb, 1, 3)
				u := s.URL("")
				if query != "" {
					u += "?" + query
				}
				t := &target{direct: u, sentinel: s, redis: s.Master, replica: s.Replicas[0]}
				tb.Cleanup(t.stopProxies)
				if err := t.tuneSentinels(); err != nil {
					tb.Fatalf("%v", err)
				}
				if err := t.linkReplica(); err != nil {
					tb.Fatalf("%v", err)
				}
				return t
			}}
	}
	addSetup(sentinel("sentinel-replica", "redis-server master + replica + 3 sentinels (quorum 2) that fail over (down after 500ms), the lock waits for 1 replica ack (WAIT), no persistence, TTL at least 10s", "replicas=1&replica_timeout=100ms"))
	addSetup(sentinel("sentinel-async", "redis-server master + replica + 3 sentinels (quorum 2) that fail over (down after 500ms), asynchronous replication (no WAIT), no persistence, TTL at least 10s", ""))
	cluster := func(name, describe, query string) *setup {
		return &setup{name: name, describe: describe, hold: fullTTL, roundTTL: clusterTTL,
			start: func(tb testserver.TB, _ time.Duration) *target {
				c := testserver.StartRedisCluster(tb, 3, 1)
				return &target{direct: c.URL(query), cluster: c}
			}}
	}
	addSetup(cluster("cluster-replica", "Redis Cluster, 3 masters with 1 replica each (node timeout 2s), the lock waits for 1 replica ack (WAIT), no persistence, TTL at least 3s", "replicas=1&replica_timeout=100ms"))
	addSetup(cluster("cluster-async", "Redis Cluster, 3 masters with 1 replica each (node timeout 2s), asynchronous replication (no WAIT), no persistence, TTL at least 3s", ""))
	addSetup(&setup{name: "redlock", describe: "Redlock over 5 redis-server masters, no persistence; each worker reaches each node through its own TCP proxy", hold: fullTTL, roundTTL: asIs,
		start: func(tb testserver.TB, _ time.Duration) *target {
			nodes := testserver.StartRedisNodes(tb, 5)
			return &target{direct: testserver.RedlockURL(nodes, redlockQuery), nodes: nodes}
		}})
	addSetup(&setup{name: "etcd", describe: "etcd, 3 members (each a process), election timeout 500ms", hold: halfTTL, roundTTL: wholeSeconds,
		start: func(tb testserver.TB, _ time.Duration) *target {
			c := testserver.StartEtcdCluster(tb, 3, 50, 500)
			return &target{direct: c.URL("dlock-check"), etcd: c}
		}})
	addSetup(&setup{name: "zk", describe: "ZooKeeper, 3-node ensemble, session timeout = TTL", hold: halfTTL, roundTTL: func(ttl time.Duration) time.Duration { return max(ttl, time.Second) },
		start: func(tb testserver.TB, ttl time.Duration) *target {
			e := testserver.StartZooKeeperEnsemble(tb, 3)
			return &target{direct: e.URL("/dlock-check") + "?session_timeout=" + ttl.String(), zk: e}
		}})
	addSetup(&setup{name: "postgres", describe: "PostgreSQL, default settings (fsync on)", proxied: true, hold: fullTTL, roundTTL: asIs,
		start: func(tb testserver.TB, _ time.Duration) *target {
			p := testserver.StartPostgres(tb)
			u, _ := url.Parse(p.URL()) // a URL testserver built
			return &target{upstream: p.Addr(), pg: p, url: func(addr string) string {
				v := *u
				v.Host = addr
				return v.String()
			}}
		}})
	addSetup(&setup{name: "mariadb", describe: "MariaDB (the mysql:// backend), default settings (innodb_flush_log_at_trx_commit=1)", proxied: true, hold: fullTTL, roundTTL: asIs,
		start: func(tb testserver.TB, _ time.Duration) *target {
			m := testserver.StartMariaDB(tb)
			u, _ := url.Parse(m.URL()) // a URL testserver built
			return &target{upstream: m.Addr(), mariadb: m, url: func(addr string) string {
				v := *u
				v.Host = addr
				return v.String()
			}}
		}})
}

func redisURL(query string) func(addr string) string {
	return func(addr string) string {
		u := "redis://" + addr + "/0"
		if query != "" {
			u += "?" + query
		}
		return u
	}
}

const redlockQuery = "node_timeout=100ms"

// linkReplica makes t.replica a replica of t.redis through a TCP proxy of its own
// (t.repl), so that the failover fault can cut the replication stream, and waits
// until the replica is in sync.
func (t *target) linkReplica() error {
	px := toxiproxy.NewProxy(t.toxi(), "replication", "127.0.0.1:0", t.redis.Addr())
	if err := px.Start(); err != nil {
		return fmt.Errorf("replication proxy: %w", err)
	}
	t.repl = px
	_, port, _ := strings.Cut(px.Listen, ":")
	c := redis.NewClient(&redis.Options{Addr: t.replica.Addr()})
	defer c.Close()
	ctx := context.Background()
	if err := c.Do(ctx, "REPLICAOF", "127.0.0.1", port).Err(); err != nil {
		return fmt.Errorf("replica %s: REPLICAOF: %w", t.replica.Addr(), err)
	}
	deadline := time.Now().Add(20 * time.Second)
	for time.Now().Before(deadline) {
		info, err := c.Info(ctx, "replication").Result()
		if err == nil && strings.Contains(info, "master_link_status:up") {
			return nil
		}
		time.Sleep(20 * time.Millisecond)
	}
	return fmt.Errorf("replica %s did not sync with its master %s within 20s", t.replica.Addr(), t.redis.Addr())
}

// Sentinel timing of the sentinel setups. sentinelDownAfter is how long the
// master must be silent before a sentinel thinks it is down: short, so that the
// sentinels promote the replica well within sentinelMinTTL. sentinelFailoverTimeout
// stays at the launcher's 10s: a sentinel whose failover attempt failed (a split
// vote) tries again after twice that. It is also how long a sentinel leaves alone
// a replica that replicates from an address it does not know, as the replica does
// through the checker's proxy (linkReplica), before pointing it at the master
// (+fix-slave-config): the failover fault checks the link and restores the proxy
// before it stalls it (relinkReplica).
const (
	sentinelDownAfter       = 500 * time.Millisecond
	sentinelFailoverTimeout = 10 * time.Second
	// sentinelMinTTL is the shortest TTL of the sentinel setups: longer than the
	// sentinels take to notice a dead master and promote its replica, so that a
	// grant lost with the master may still be held when the new master grants
	// the key again.
	sentinelMinTTL = 10 * time.Second
)

func sentinelTTL(ttl time.Duration) time.Duration { return max(ttl, sentinelMinTTL) }

// clusterMinTTL is the shortest TTL of the cluster setups: longer than the
// failover fault takes from the kill of a slot's master to its replica's
// takeover, and the clients to find the new master, so that a grant lost with
// the master may still be held when the new master grants the key again.
const clusterMinTTL = 3 * time.Second

func clusterTTL(ttl time.Duration) time.Duration { return max(ttl, clusterMinTTL) }

// tuneSentinels sets the sentinels' down-after-milliseconds and failover-timeout
// (SENTINEL SET, on every sentinel).
func (t *target) tuneSentinels() error {
	for _, sn := range t.sentinel.Sentinels {
		c := redis.NewClient(&redis.Options{Addr: sn.Addr()})
		err := c.Do(context.Background(), "SENTINEL", "SET", t.sentinel.Name,
			"down-after-milliseconds", strconv.FormatInt(sentinelDownAfter.Milliseconds(), 10),
			"failover-timeout", strconv.FormatInt(sentinelFailoverTimeout.Milliseconds(), 10)).Err()
		c.Close()
		if err != nil {
			return fmt.Errorf("sentinel %s: SENTINEL SET: %w", sn.Addr(), err)
		}
	}
	return nil
}

// relinkReplica makes the replica replicate through a new replication proxy again
// if the sentinels pointed it at the master directly, and reports whether it did.
func (t *target) relinkReplica() (bool, error) {
	c := redis.NewClient(&redis.Options{Addr: t.replica.Addr()})
	info, err := c.Info(context.Background(), "replication").Result()
	c.Close()
	if err != nil {
		return false, fmt.Errorf("replica %s: INFO: %w", t.replica.Addr(), err)
	}
	_, port, _ := strings.Cut(t.repl.Listen, ":")
	if strings.Contains(info, "master_port:"+port+"\r\n") && strings.Contains(info, "master_link_status:up") {
		return false, nil
	}
	t.repl.Stop()
	return true, t.linkReplica()
}

// target is a started setup: its servers, the URL each worker uses, and the
// workers' proxies.
type target struct {
	direct   string                   // URL of unproxied setups
	url      func(addr string) string // URL for an address, for proxied setups
	upstream string                   // the address proxies forward to

	redis, replica *testserver.Redis
	sentinel       *testserver.Sentinel     // sentinel setups: redis is the master, replica its replica
	cluster        *testserver.RedisCluster // cluster setups
	healed         int64                    // sentinel and cluster setups: when the last failover healed (history time)
	nodes          []*testserver.Redis
	etcd           *testserver.EtcdCluster
	zk             *testserver.ZooKeeperEnsemble
	pg             *testserver.Postgres
	mariadb        *testserver.MariaDB

	toxiproxy   *toxiproxy.ApiServer
	proxies     []*toxiproxy.Proxy   // one per worker, in worker order
	nodeProxies [][]*toxiproxy.Proxy // redlock: per worker, one per node (in t.nodes order)
	repl        *toxiproxy.Proxy     // the replica's link to its master (replicated setups)
}

// toxi returns the toxiproxy server of the target's proxies.
func (t *target) toxi() *toxiproxy.ApiServer {
	if t.toxiproxy == nil {
		t.toxiproxy = toxiproxy.NewServer(toxiproxy.NewMetricsContainer(prometheus.NewRegistry()), zerolog.Nop())
	}
	return t.toxiproxy
}

// urlFor returns the URL worker id uses.
func (t *target) urlFor(id int) string {
	if t.nodeProxies != nil {
		addrs := make([]string, len(t.nodeProxies[id-1]))
		for i, p := range t.nodeProxies[id-1] {
			addrs[i] = p.Listen
		}
		return "redlock://" + strings.Join(addrs, ",") + "/0?" + redlockQuery
	}
	if t.proxies != nil {
		return t.url(t.proxies[id-1].Listen)
	}
	if t.url != nil {
		return t.url(t.upstream)
	}
	return t.direct
}

// redacted is the URL of the setup for the history, without secrets.
func (t *target) redactedURL() string {
	raw := t.direct
	if raw == "" {
		raw = t.url(t.upstream)
	}
	u, err := url.Parse(raw)
	if err != nil {
		return "(unparsable URL)"
	}
	return driver.Redact(u)
}

func (t *target) startProxies(n int) error {
	for i := 1; i <= n; i++ {
		p := toxiproxy.NewProxy(t.toxi(), "worker-"+strconv.Itoa(i), "127.0.0.1:0", t.upstream)
		if err := p.Start(); err != nil {
			t.stopProxies()
			return fmt.Errorf("proxy for worker %d: %w", i, err)
		}
		t.proxies = append(t.proxies, p)
	}
	return nil
}

// startNodeProxies gives each of n workers its own proxy to each Redlock node, so
// that the drop fault can cut one worker off a minority of the nodes.
func (t *target) startNodeProxies(n int) error {
	for i := 1; i <= n; i++ {
		var ps []*toxiproxy.Proxy
		for j, node := range t.nodes {
			p := toxiproxy.NewProxy(t.toxi(), fmt.Sprintf("worker-%d-node-%d", i, j), "127.0.0.1:0", node.Addr())
			if err := p.Start(); err != nil {
				t.stopProxies()
				return fmt.Errorf("proxy for worker %d to node %s: %w", i, node.Addr(), err)
			}
			ps = append(ps, p)
		}
		t.nodeProxies = append(t.nodeProxies, ps)
	}
	return nil
}

func (t *target) stopProxies() {
	for _, p := range t.proxies {
		p.Stop()
	}
	for _, ps := range t.nodeProxies {
		for _, p := range ps {
			p.Stop()
		}
	}
	if t.repl != nil {
		t.repl.Stop()
	}
}

// retarget points every proxy at a new upstream (after a failover); open
// connections are closed and clients reconnect through the same address.
func (t *target) retarget(upstream string) error {
	t.upstream = upstream
	for _, p := range t.proxies {
		if err := p.Update(&toxiproxy.Proxy{Listen: p.Listen, Upstream: upstream, Enabled: true}); err != nil {
			return err
		}
	}
	return nil
}
