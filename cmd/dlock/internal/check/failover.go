package check

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/dlockio/dlock/cmd/dlock/internal/check/history"
	"github.com/dlockio/dlock/internal/testserver"
)

// injectFailover reproduces "the master dies before replicating": it cuts the
// master's replication stream to the replica (the replica falls behind; the
// replication proxy drops what the master sends), waits up to a TTL for a worker
// to be granted a lock on the master meanwhile and makes that holder linger, then
// kills the master, discards the link with what it never delivered, promotes the
// lagging replica and points every client at it. With asynchronous replication the
// holder's key is not on the new master, so another worker gets it while the first
// still holds it; with WAIT (redis-replica) no grant completes during the lag,
// since the replica never acknowledges it, and nothing is lost.
func injectFailover(ctx context.Context, r *run) error {
	tg := r.tg
	if tg.sentinel != nil {
		return injectSentinelFailover(ctx, r)
	}
	if tg.cluster != nil {
		return injectClusterFailover(ctx, r)
	}
	old, next := tg.redis, tg.replica
	if err := setToxic(tg.repl, "stall", "downstream", true); err != nil {
		return err
	}
	cut := history.Now()
	r.event(history.Fault, FaultFailover, "redis master", "replication stream from "+old.Addr()+" to "+next.Addr()+" cut: the replica falls behind")
	if p, op := r.freshHolder(ctx, nil, cut, r.ttl); p != nil {
		p.send(ctlLinger)
		r.event(history.Note, FaultFailover, workerName(p), fmt.Sprintf("granted %s (lease %d, token %d) on the master while the replica lags", op.Key, op.Lease, op.Token))
	} else {
		r.event(history.Note, FaultFailover, "redis master", "no lock was granted while the replica lagged")
	}
	r.event(history.Note, FaultFailover, "redis master", "kill -9 the master at "+old.Addr())
	old.Kill()
	tg.repl.Stop() // what the master sent meanwhile is gone with it
	c := redis.NewClient(&redis.Options{Addr: next.Addr()})
	defer c.Close()
	if err := c.Do(context.Background(), "REPLICAOF", "NO", "ONE").Err(); err != nil {
		return fmt.Errorf("promote %s: %w", next.Addr(), err)
	}
	if err := tg.retarget(next.Addr()); err != nil {
		return err
	}
	r.event(history.Heal, FaultFailover, "redis master", "promoted the replica "+next.Addr()+"; clients follow it")
	// The old master comes back empty as a replica of the new one, ready for the
	// next failover.
	if err := old.Restart(); err != nil {
		return err
	}
	tg.redis, tg.replica = next, old
	return tg.linkReplica()
}

// injectSentinelFailover is injectFailover on a sentinel setup, where the
// sentinels promote the replica and the clients find it through them: it stalls
// the replication stream, waits up to a TTL for a fresh grant on the master and
// makes its holder linger, kills the master, and waits until every sentinel
// reports the replica as the master and the replica says so. The old master
// restarts empty and becomes a replica of the new one through a new replication
// proxy (the REPLICAOF the sentinels would send it some seconds later, aimed at
// the proxy), ready for the next injection; the workers are left to recover.
func injectSentinelFailover(ctx context.Context, r *run) error {
	tg := r.tg
	if tg.healed == 0 {
		// A worker opens its client once: one that starts while the master is
		// dead fails. Let every worker write once before the first kill.
		r.awaitRecovery(ctx, 1, recoveryWait(r.ttl))
	}
	if relinked, err := tg.relinkReplica(); err != nil {
		return err
	} else if relinked {
		r.event(history.Note, FaultFailover, "redis replica", "the sentinels had pointed the replica at the master directly (+fix-slave-config): it replicates through the checker's proxy again")
	}
	old, next := tg.redis, tg.replica
	// The story is a key free on both nodes, granted on the master only. A key
	// held when the stream stops may be released and granted again on the master
	// meanwhile, but the replica still shows the earlier grant, which keeps the
	// key for its TTL after the promotion: such a grant is not the one to lose.
	held := r.heldKeys()
	time.Sleep(20 * time.Millisecond) // a release just before: replicated by now
	for k := range r.heldKeys() {
		held[k] = true
	}
	if err := setToxic(tg.repl, "stall", "downstream", true); err != nil {
		return err
	}
	cut := history.Now()
	r.event(history.Fault, FaultFailover, "redis master", "replication stream from "+old.Addr()+" to "+next.Addr()+" cut: the replica falls behind")
	if p, op := r.freshHolderOf(ctx, cut, r.ttl, func(op history.Op) bool { return !held[op.Key] }); p != nil {
		p.send(ctlLinger)
		r.event(history.Note, FaultFailover, workerName(p), fmt.Sprintf("granted %s (lease %d, token %d) on the master while the replica lags; the key was free when the stream stopped", op.Key, op.Lease, op.Token))
	} else {
		r.event(history.Note, FaultFailover, "redis master", "no lock on a key free when the stream stopped was granted while the replica lagged")
	}
	r.event(history.Note, FaultFailover, "redis master", "kill -9 the master at "+old.Addr()+"; the sentinels are to promote the replica")
	killed := time.Now()
	old.Kill()
	tg.repl.Stop() // what the master sent meanwhile is gone with it
	if err := tg.awaitPromotion(ctx, next, 45*time.Second); err != nil {
		if ctx.Err() != nil {
			return nil // the run is over
		}
		return err
	}
	tg.healed = history.Now()
	r.event(history.Heal, FaultFailover, "redis master", fmt.Sprintf("the sentinels promoted the replica %s, %v after the kill; clients find it through them", next.Addr(), time.Since(killed).Round(time.Millisecond)))
	if err := old.Restart(); err != nil {
		return err
	}
	tg.redis, tg.replica = next, old
	return tg.linkReplica()
}

// injectClusterFailover is injectFailover on a cluster setup, without a proxy
// (cluster replicas dial the address their master announces): it stops every
// replica (SIGSTOP) and has every master drop its replication links (CLIENT KILL
// TYPE replica), so that what the masters write from then on reaches no replica:
// the stopped replicas cannot reconnect, and a link dropped before a grant carries
// nothing of it to be read after SIGCONT. It waits up to a TTL for a fresh grant
// on a key free when the links dropped and makes its holder linger, kills -9 the
// master of that key's slot, resumes the replicas, promotes the dead master's
// replica with CLUSTER FAILOVER TAKEOVER and waits until every live node names it
// the slot's master. The old master restarts empty, rejoins as a replica of the
// new one, and the fault waits until the whole cluster is in order again, ready
// for the next injection. With replicas=1 no grant completes while the replicas
// are cut off (WAIT gets no ack: ErrNotReplicated) and nothing is lost.
func injectClusterFailover(ctx context.Context, r *run) error {
	tg, c := r.tg, r.tg.cluster
	if tg.healed == 0 {
		// A worker opens its client once: one that starts while a master is dead
		// fails. Let every worker write once before the first kill.
		r.awaitRecovery(ctx, 1, recoveryWait(r.ttl))
	}
	parent := ctx
	ctx, cancel := context.WithTimeout(ctx, 60*time.Second)
	defer cancel()
	var replicas []*testserver.Redis
	var err error
	for _, n := range c.Nodes { // the first that answers
		if replicas, err = c.Replicas(ctx, n); err == nil {
			break
		}
	}
	if err != nil {
		return err
	}
	var masters []*testserver.Redis
	for _, n := range c.Nodes {
		if !slices.Contains(replicas, n) {
			masters = append(masters, n)
		}
	}
	// As on Sentinel, the story is a key free on every node, granted on its
	// master only (a key held when the links drop is on the replica already).
	held := r.heldKeys()
	time.Sleep(20 * time.Millisecond) // a release just before: replicated by now
	for k := range r.heldKeys() {
		held[k] = true
	}
	for _, n := range replicas {
		n.Pause()
	}
	stopped := true
	resume := func() {
		if stopped {
			for _, n := range replicas {
				n.Resume()
			}
			stopped = false
		}
	}
	defer resume()
	for _, m := range masters {
		cl := redis.NewClient(&redis.Options{Addr: m.Addr(), MaxRetries: -1})
		err := cl.Do(ctx, "CLIENT", "KILL", "TYPE", "replica").Err()
		cl.Close()
		if err != nil {
			return fmt.Errorf("master %s: CLIENT KILL TYPE replica: %w", m.Addr(), err)
		}
	}
	cut := history.Now()
	r.event(history.Fault, FaultFailover, "redis cluster", fmt.Sprintf("%d replicas stopped (SIGSTOP), their links to the masters dropped: they fall behind", len(replicas)))
	p, op := r.freshHolderOf(ctx, cut, r.ttl, func(op history.Op) bool { return !held[op.Key] })
	key := op.Key
	if p != nil {
		p.send(ctlLinger)
	} else {
		// Fail over the master of a key of the workload all the same: its
		// waiters and holders must come through it.
		key = fmt.Sprintf("k%d", r.rnd.IntN(r.cfg.Keys)) // the workers' key names
	}
	slotKey := "{=" + key + "}" // hashes like every name of the lock (redislock's cluster layout)
	old, next, err := c.Shard(ctx, masters[0], slotKey)
	if err != nil {
		return err
	}
	if len(next) != 1 || !slices.Contains(replicas, next[0]) {
		return fmt.Errorf("the master %s of %s has replicas %v, want one stopped replica", old.Addr(), key, next)
	}
	if p != nil {
		r.event(history.Note, FaultFailover, workerName(p), fmt.Sprintf("granted %s (lease %d, token %d) on the master %s while its replica %s is cut off; the key was free when the links dropped", op.Key, op.Lease, op.Token, old.Addr(), next[0].Addr()))
	} else {
		r.event(history.Note, FaultFailover, "redis cluster", fmt.Sprintf("no lock on a key free when the links dropped was granted while the replicas were cut off; failing over the master %s of %s all the same", old.Addr(), key))
	}
	r.event(history.Note, FaultFailover, "redis cluster", "kill -9 the master at "+old.Addr())
	killed := time.Now()
	old.Kill()
	resume()
	promoted := next[0]
	cl := redis.NewClient(&redis.Options{Addr: promoted.Addr(), MaxRetries: -1})
	err = cl.Do(ctx, "CLUSTER", "FAILOVER", "TAKEOVER").Err()
	cl.Close()
	if err != nil {
		return fmt.Errorf("CLUSTER FAILOVER TAKEOVER on %s: %w", promoted.Addr(), err)
	}
	var live []*testserver.Redis
	for _, n := range c.Nodes {
		if n != old {
			live = append(live, n)
		}
	}
	if err := c.AwaitSlotOwner(ctx, live, slotKey, promoted); err != nil {
		if parent.Err() != nil {
			return nil // the run is over
		}
		return err
	}
	tg.healed = history.Now()
	r.event(history.Heal, FaultFailover, "redis cluster", fmt.Sprintf("replicas resumed; %s took over the slots of %s, every live node agrees %v after the kill", promoted.Addr(), old.Addr(), time.Since(killed).Round(time.Millisecond)))
	// The old master comes back empty and rejoins as a replica of the new one.
	if err := old.Restart(); err != nil {
		return err
	}
	if err := c.AwaitOK(ctx); err != nil {
		if parent.Err() != nil {
			return nil
		}
		return err
	}
	r.event(history.Note, FaultFailover, "redis cluster", fmt.Sprintf("%s rejoined as a replica; the cluster is in order %v after the kill", old.Addr(), time.Since(killed).Round(time.Millisecond)))
	return nil
}

// awaitPromotion waits until every sentinel reports n as the master and n reports
// the master role.
func (t *target) awaitPromotion(ctx context.Context, n *testserver.Redis, wait time.Duration) error {
	want := t.sentinel.AnnouncedAddr(n)
	deadline := time.Now().Add(wait)
	var last error
	for ctx.Err() == nil && time.Now().Before(deadline) {
		last = func() error {
			for _, sn := range t.sentinel.Sentinels {
				c := redis.NewClient(&redis.Options{Addr: sn.Addr(), MaxRetries: -1})
				a, err := c.Do(ctx, "SENTINEL", "GET-MASTER-ADDR-BY-NAME", t.sentinel.Name).StringSlice()
				c.Close()
				if err != nil {
					return fmt.Errorf("sentinel %s: %w", sn.Addr(), err)
				}
				if len(a) != 2 || a[0]+":"+a[1] != want {
					return fmt.Errorf("sentinel %s reports the master at %v", sn.Addr(), a)
				}
			}
			c := redis.NewClient(&redis.Options{Addr: n.Addr(), MaxRetries: -1})
			defer c.Close()
			info, err := c.Info(ctx, "replication").Result()
			if err != nil {
				return err
			}
			if !strings.Contains(info, "role:master") {
				return fmt.Errorf("%s is not a master yet", n.Addr())
			}
			return nil
		}()
		if last == nil {
			return nil
		}
		sleep(ctx, 20*time.Millisecond)
	}
	if ctx.Err() != nil {
		return ctx.Err()
	}
	return fmt.Errorf("the sentinels did not promote %s within %v: %w", n.Addr(), wait, last)
}
