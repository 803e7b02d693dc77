package testserver

import (
	"context"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"
)

// RedisCluster is a Redis Cluster of redis-server processes started for a test.
type RedisCluster struct {
	Nodes    []*Redis // the masters first, then each master's replicas in turn
	t        TB
	replicas int // how many of the nodes are replicas
}

// clusterSlots is the number of hash slots of a Redis Cluster.
const clusterSlots = 16384

// StartRedisCluster starts masters redis-server processes with replicasPerMaster
// replicas each, on free loopback ports in temporary directories, assigns the
// slots evenly to the masters and waits until every node reports cluster_state:ok.
// Extra arguments go to every node.
func StartRedisCluster(t TB, masters, replicasPerMaster int, extra ...string) *RedisCluster {
	t.Helper()
	if masters < 1 {
		t.Fatalf("StartRedisCluster: %d masters", masters)
	}
	n := masters * (1 + replicasPerMaster)
	c := &RedisCluster{t: t, replicas: n - masters}
	bus := make([]int, n)
	for i := range n {
		bus[i] = FreePort(t)
		args := append([]string{"--cluster-enabled", "yes", "--cluster-config-file", "nodes.conf",
			"--cluster-node-timeout", "2000", "--cluster-port", strconv.Itoa(bus[i]),
			"--cluster-replica-validity-factor", "0"}, extra...)
		c.Nodes = append(c.Nodes, StartRedis(t, args...))
	}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	ids := make([]string, n)
	for i, node := range c.Nodes {
		cl := c.client(node)
		id, err := cl.ClusterMyID(ctx).Result()
		if err != nil {
			t.Fatalf("CLUSTER MYID on %s: %v", node.Addr(), err)
		}
		ids[i] = id
		if i < masters {
			lo, hi := i*clusterSlots/masters, (i+1)*clusterSlots/masters-1
			if err := cl.Do(ctx, "CLUSTER", "ADDSLOTSRANGE", lo, hi).Err(); err != nil {
				t.Fatalf("CLUSTER ADDSLOTSRANGE on %s: %v", node.Addr(), err)
			}
		}
		if i > 0 {
			// The bus port is not the port + 10000: MEET names it.
			if err := cl.Do(ctx, "CLUSTER", "MEET", "127.0.0.1", c.Nodes[0].Port, bus[0]).Err(); err != nil {
				t.Fatalf("CLUSTER MEET on %s: %v", node.Addr(), err)
			}
		}
	}
	// Every node must know every other before a replica can name its master.
	c.waitFor(ctx, "every node to know the others", func(cl *redis.Client) bool {
		s, err := cl.ClusterNodes(ctx).Result()
		return err == nil && strings.Count(strings.TrimSpace(s), "\n")+1 == n && !strings.Contains(s, "handshake")
	})
	for i := masters; i < n; i++ {
		m := (i - masters) % masters
		if err := c.client(c.Nodes[i]).Do(ctx, "CLUSTER", "REPLICATE", ids[m]).Err(); err != nil {
			t.Fatalf("CLUSTER REPLICATE on %s: %v", c.Nodes[i].Addr(), err)
		}
	}
	c.waitOK(ctx)
	return c
}

// client returns a client of node, closed when the test ends.
func (c *RedisCluster) client(node *Redis) *redis.Client {
	cl := redis.NewClient(&redis.Options{Addr: node.Addr(), MaxRetries: -1})
	c.t.Cleanup(func() { cl.Close() })
	return cl
}

// waitFor waits until ok holds on every node.
func (c *RedisCluster) waitFor(ctx context.Context, what string, ok func(*redis.Client) bool) {
	c.t.Helper()
	c.waitOn(ctx, c.Nodes, what, ok)
}

// waitOn waits until ok holds on each of nodes.
func (c *RedisCluster) waitOn(ctx context.Context, nodes []*Redis, what string, ok func(*redis.Client) bool) {
	c.t.Helper()
	if err := awaitOn(ctx, nodes, what, ok); err != nil {
		c.t.Fatalf("%v", err)
	}
}

// awaitOn waits until ok holds on each of nodes, or returns an error when ctx ends.
func awaitOn(ctx context.Context, nodes []*Redis, what string, ok func(*redis.Client) bool) error {
	cls := make([]*redis.Client, len(nodes))
	for i, n := range nodes {
		cls[i] = redis.NewClient(&redis.Options{Addr: n.Addr(), MaxRetries: -1})
		defer cls[i].Close()
	}
	for {
		all := true
		for _, cl := range cls {
			if !ok(cl) {
				all = false
				break
			}
		}
		if all {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("cluster: timed out waiting for %s", what)
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// waitOK waits until every node reports cluster_state:ok, agrees on the owner of
// every slot, and every replica's link to its master is up.
func (c *RedisCluster) waitOK(ctx context.Context) {
	c.t.Helper()
	if err := c.AwaitOK(ctx); err != nil {
		c.t.Fatalf("%v", err)
	}
}

// AwaitOK is waitOK that returns an error instead of failing the test (when ctx
// ends first), for callers outside the test's goroutine (dlock check's faults).
func (c *RedisCluster) AwaitOK(ctx context.Context) error {
	var want string
	return awaitOn(ctx, c.Nodes, "cluster_state:ok and one slot map on every node", func(cl *redis.Client) bool {
		info, err := cl.ClusterInfo(ctx).Result()
		if err != nil || !strings.Contains(info, "cluster_state:ok") {
			return false
		}
		repl, err := cl.Info(ctx, "replication").Result()
		if err != nil || strings.Contains(repl, "role:slave") && !strings.Contains(repl, "master_link_status:up") {
			return false
		}
		// Every node sees every replica as one, with no failure flags.
		nodes, err := cl.ClusterNodes(ctx).Result()
		if err != nil || strings.Contains(nodes, "fail") || strings.Contains(nodes, "handshake") {
			return false
		}
		replicas := 0
		for line := range strings.Lines(nodes) {
			if f := strings.Fields(line); len(f) > 2 && strings.Contains(f[2], "slave") {
				replicas++
			}
		}
		if replicas != c.replicas {
			return false
		}
		m, err := slotMap(ctx, cl)
		if err != nil {
			return false
		}
		if want == "" {
			want = m
		}
		if m != want {
			want = m // start over: another node saw a different map
			return false
		}
		return true
	})
}

// slotRange is one range of slots and its master, as a node sees them.
type slotRange struct {
	start, end int
	addr, id   string // the master's
	replicas   int
}

// slotRanges returns the slot ranges cl knows of, from CLUSTER SHARDS.
func slotRanges(ctx context.Context, cl *redis.Client) ([]slotRange, error) {
	shards, err := cl.ClusterShards(ctx).Result()
	if err != nil {
		return nil, err
	}
	var rs []slotRange
	for _, sh := range shards {
		var r slotRange
		for _, n := range sh.Nodes {
			if n.Role == "master" {
				r.addr, r.id = n.IP+":"+strconv.FormatInt(n.Port, 10), n.ID
			} else {
				r.replicas++
			}
		}
		for _, sr := range sh.Slots {
			if r.id == "" {
				return nil, fmt.Errorf("slots %d-%d without a master", sr.Start, sr.End)
			}
			r.start, r.end = int(sr.Start), int(sr.End)
			rs = append(rs, r)
		}
	}
	return rs, nil
}

// slotMap returns the slot ranges and their masters as a node sees them.
func slotMap(ctx context.Context, cl *redis.Client) (string, error) {
	rs, err := slotRanges(ctx, cl)
	if err != nil {
		return "", err
	}
	slices.SortFunc(rs, func(a, b slotRange) int { return a.start - b.start })
	var b strings.Builder
	for _, r := range rs {
		fmt.Fprintf(&b, "%d-%d:%s,%d ", r.start, r.end, r.addr, r.replicas)
	}
	return b.String(), nil
}

// URL returns redis+cluster://host:port,.../ naming every node, with query if
// not empty.
func (c *RedisCluster) URL(query string) string {
	addrs := make([]string, len(c.Nodes))
	for i, n := range c.Nodes {
		addrs[i] = n.Addr()
	}
	u := "redis+cluster://" + strings.Join(addrs, ",") + "/"
	if query != "" {
		u += "?" + query
	}
	return u
}

// Slot returns the hash slot of key, as the cluster computes it.
func (c *RedisCluster) Slot(key string) int {
	c.t.Helper()
	n, err := c.client(c.live()).ClusterKeySlot(context.Background(), key).Result()
	if err != nil {
		c.t.Fatalf("CLUSTER KEYSLOT: %v", err)
	}
	return int(n)
}

// Master returns the node that masters slot now, and its node id.
func (c *RedisCluster) Master(slot int) (*Redis, string) {
	c.t.Helper()
	ctx := context.Background()
	if addr, id := slotOwner(ctx, c.client(c.live()), slot); id != "" {
		return c.node(addr), id
	}
	c.t.Fatalf("no master for slot %d", slot)
	return nil, ""
}

// live returns a node that answers PING.
func (c *RedisCluster) live() *Redis {
	for _, n := range c.Nodes {
		if redisPing(n.Port) == nil {
			return n
		}
	}
	c.t.Fatalf("no cluster node answers")
	return nil
}

func (c *RedisCluster) node(addr string) *Redis {
	c.t.Helper()
	for _, n := range c.Nodes {
		if n.Addr() == addr {
			return n
		}
	}
	c.t.Fatalf("no node %s in the cluster", addr)
	return nil
}

// Failover promotes a replica of the master that owns the slot of key (CLUSTER
// FAILOVER on the replica: the coordinated manual failover, in which the replica
// first catches up with the master), waits until every node agrees and returns
// the new master.
func (c *RedisCluster) Failover(key string) *Redis {
	c.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	slot := c.Slot(key)
	old, id := c.Master(slot)
	var replica *Redis
	nodes, err := c.client(old).ClusterNodes(ctx).Result()
	if err != nil {
		c.t.Fatalf("CLUSTER NODES: %v", err)
	}
	for line := range strings.Lines(nodes) {
		if f := strings.Fields(line); len(f) > 3 && strings.Contains(f[2], "slave") && f[3] == id {
			replica = c.node(strings.Split(f[1], "@")[0])
			break
		}
	}
	if replica == nil {
		c.t.Fatalf("no replica of %s (%s) to fail over to", old.Addr(), id)
	}
	if err := c.client(replica).Do(ctx, "CLUSTER", "FAILOVER").Err(); err != nil {
		c.t.Fatalf("CLUSTER FAILOVER on %s: %v", replica.Addr(), err)
	}
	c.waitFor(ctx, "the replica to own the slot", func(cl *redis.Client) bool {
		m, err := slotMap(ctx, cl)
		return err == nil && strings.Contains(m, replica.Addr()+",")
	})
	c.waitOK(ctx)
	return replica
}

// KillMaster kills (SIGKILL) the master that owns the slot of key and waits
// until the other nodes have failed over to its replica (after the
// cluster-node-timeout of 2s) and report cluster_state:ok; it returns the
// killed node and the new master. The killed node stays down.
func (c *RedisCluster) KillMaster(key string) (killed, promoted *Redis) {
	c.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	slot := c.Slot(key)
	old, _ := c.Master(slot)
	var rest []*Redis
	for _, n := range c.Nodes {
		if n != old {
			rest = append(rest, n)
		}
	}
	old.Kill()
	var addr string
	c.waitOn(ctx, rest, "a replica to take over the killed master's slot", func(cl *redis.Client) bool {
		info, err := cl.ClusterInfo(ctx).Result()
		if err != nil || !strings.Contains(info, "cluster_state:ok") {
			return false
		}
		a, _ := slotOwner(ctx, cl, slot)
		if a == "" || a == old.Addr() || addr != "" && a != addr {
			addr = ""
			return false
		}
		addr = a
		return true
	})
	return old, c.node(addr)
}

// MoveSlot moves the slot of key, with its keys, from its master to another
// master (CLUSTER SETSLOT IMPORTING/MIGRATING, MIGRATE, SETSLOT NODE), as a
// resharding does, and returns the new master.
func (c *RedisCluster) MoveSlot(key string) *Redis {
	c.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	slot := c.Slot(key)
	src, srcID := c.Master(slot)
	var dst *Redis
	var dstID string
	for s := 0; s < clusterSlots && dst == nil; s += 97 {
		if n, id := c.Master(s); n != src {
			dst, dstID = n, id
		}
	}
	if dst == nil {
		c.t.Fatalf("one master only: nowhere to move slot %d", slot)
	}
	sc, dc := c.client(src), c.client(dst)
	must := func(err error, what string) {
		if err != nil {
			c.t.Fatalf("move slot %d: %s: %v", slot, what, err)
		}
	}
	must(dc.Do(ctx, "CLUSTER", "SETSLOT", slot, "IMPORTING", srcID).Err(), "IMPORTING")
	must(sc.Do(ctx, "CLUSTER", "SETSLOT", slot, "MIGRATING", dstID).Err(), "MIGRATING")
	for {
		keys, err := sc.ClusterGetKeysInSlot(ctx, slot, 100).Result()
		must(err, "GETKEYSINSLOT")
		if len(keys) == 0 {
			break
		}
		args := []any{"MIGRATE", "127.0.0.1", dst.Port, "", 0, 5000, "KEYS"}
		for _, k := range keys {
			args = append(args, k)
		}
		must(sc.Do(ctx, args...).Err(), "MIGRATE")
	}
	for _, n := range c.Nodes {
		if m, _ := c.isMaster(ctx, n); m {
			must(c.client(n).Do(ctx, "CLUSTER", "SETSLOT", slot, "NODE", dstID).Err(), "SETSLOT NODE on "+n.Addr())
		}
	}
	c.waitFor(ctx, "the new owner of the slot", func(cl *redis.Client) bool {
		_, id := slotOwner(ctx, cl, slot)
		return id == dstID
	})
	c.waitOK(ctx)
	return dst
}

func (c *RedisCluster) isMaster(ctx context.Context, n *Redis) (bool, error) {
	info, err := c.client(n).Info(ctx, "replication").Result()
	return strings.Contains(info, "role:master"), err
}

// slotOwner returns the address and id of the master of slot as cl sees it.
func slotOwner(ctx context.Context, cl *redis.Client, slot int) (string, string) {
	rs, err := slotRanges(ctx, cl)
	if err != nil {
		return "", ""
	}
	for _, r := range rs {
		if slot >= r.start && slot <= r.end {
			return r.addr, r.id
		}
	}
	return "", ""
}

// NodeAt returns the node at addr (host:port), or nil if there is none.
func (c *RedisCluster) NodeAt(addr string) *Redis {
	for _, n := range c.Nodes {
		if n.Addr() == addr {
			return n
		}
	}
	return nil
}

// Replicas returns the nodes that are replicas now, as the node from answers
// CLUSTER NODES, without failing the test: roles change with every failover.
func (c *RedisCluster) Replicas(ctx context.Context, from *Redis) ([]*Redis, error) {
	cl := redis.NewClient(&redis.Options{Addr: from.Addr(), MaxRetries: -1})
	defer cl.Close()
	nodes, err := cl.ClusterNodes(ctx).Result()
	if err != nil {
		return nil, fmt.Errorf("CLUSTER NODES on %s: %w", from.Addr(), err)
	}
	var rs []*Redis
	for line := range strings.Lines(nodes) {
		if f := strings.Fields(line); len(f) > 2 && strings.Contains(f[2], "slave") {
			if n := c.NodeAt(strings.Split(f[1], "@")[0]); n != nil {
				rs = append(rs, n)
			}
		}
	}
	return rs, nil
}

// Shard returns the master of the slot of key and its replicas, as the node from
// sees them, without failing the test.
func (c *RedisCluster) Shard(ctx context.Context, from *Redis, key string) (master *Redis, replicas []*Redis, err error) {
	cl := redis.NewClient(&redis.Options{Addr: from.Addr(), MaxRetries: -1})
	defer cl.Close()
	slot, err := cl.ClusterKeySlot(ctx, key).Result()
	if err != nil {
		return nil, nil, fmt.Errorf("CLUSTER KEYSLOT on %s: %w", from.Addr(), err)
	}
	addr, id := slotOwner(ctx, cl, int(slot))
	if master = c.NodeAt(addr); master == nil {
		return nil, nil, fmt.Errorf("%s knows no master of slot %d", from.Addr(), slot)
	}
	nodes, err := cl.ClusterNodes(ctx).Result()
	if err != nil {
		return nil, nil, fmt.Errorf("CLUSTER NODES on %s: %w", from.Addr(), err)
	}
	for line := range strings.Lines(nodes) {
		if f := strings.Fields(line); len(f) > 3 && strings.Contains(f[2], "slave") && f[3] == id {
			if n := c.NodeAt(strings.Split(f[1], "@")[0]); n != nil {
				replicas = append(replicas, n)
			}
		}
	}
	return master, replicas, nil
}

// AwaitSlotOwner waits until every node of nodes names owner as the master of the
// slot of key, or returns an error when ctx ends.
func (c *RedisCluster) AwaitSlotOwner(ctx context.Context, nodes []*Redis, key string, owner *Redis) error {
	cl := redis.NewClient(&redis.Options{Addr: owner.Addr(), MaxRetries: -1})
	defer cl.Close()
	slot, err := cl.ClusterKeySlot(ctx, key).Result()
	if err != nil {
		return fmt.Errorf("CLUSTER KEYSLOT on %s: %w", owner.Addr(), err)
	}
	return awaitOn(ctx, nodes, fmt.Sprintf("every node to name %s the master of slot %d", owner.Addr(), slot), func(cl *redis.Client) bool {
		addr, _ := slotOwner(ctx, cl, int(slot))
		return addr == owner.Addr()
	})
}
