package check

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"strconv"
	"strings"
	"time"

	toxiproxy "github.com/Shopify/toxiproxy/v2"
	"github.com/redis/go-redis/v9"

	"github.com/dlockio/dlock/cmd/dlock/internal/check/history"
	"github.com/dlockio/dlock/internal/testserver"
)

// Fault names.
const (
	FaultNone            = "none"              // no fault: the baseline
	FaultKill            = "kill"              // kill -9 the server, restart it
	FaultFailover        = "failover"          // the replica lags, a lock is taken on the master, kill -9 the master, promote the replica
	FaultLeader          = "leader"            // kill -9 the leader of the etcd cluster or ZooKeeper ensemble, restart it later
	FaultDrop            = "drop"              // a holder on a bare Redlock majority; one of its nodes drops its lock keys early (its clock jumped)
	FaultPause           = "pause"             // SIGSTOP a lock holder past its TTL
	FaultPauseAfterCheck = "pause-after-check" // SIGSTOP a holder right after it checked its lease, before its write
	FaultPartition       = "partition"         // cut one holder's connection (both ways) for 2 TTL while it goes on working
	FaultDelay           = "delay"             // add TTL/4 latency each way to one client's connection for 2 TTL
	FaultClock           = "clock"             // a holder's clock jumps back 2 TTL, then its connection is cut while it goes on working
)

// fault is an injectable fault: inject hits once and heals, recording both.
type fault struct {
	name, doc string
	// setups it applies to; nil means every setup, proxiedOnly every proxied one.
	setups      []string
	proxiedOnly bool
	// recovers: after each heal the scheduler waits until every worker wrote again
	// before it counts down to the next injection (a failover slower than the
	// interval would otherwise be hit again before it is over).
	recovers bool
	inject   func(ctx context.Context, r *run) error
}

func (f *fault) appliesTo(s *setup) bool {
	switch {
	case f.name == FaultNone:
		return true
	case f.proxiedOnly:
		return s.proxied
	case f.setups != nil:
		return slices.Contains(f.setups, s.name)
	}
	return true
}

func (f *fault) setupsFor() []string {
	var out []string
	for _, n := range Setups() {
		if f.appliesTo(setups[n]) {
			out = append(out, n)
		}
	}
	return out
}

var faults = map[string]*fault{}

// Faults lists the fault names in order.
func Faults() []string {
	names := make([]string, 0, len(faults))
	for n := range faults {
		names = append(names, n)
	}
	slices.Sort(names)
	return names
}

// FaultDoc returns a one-line description of a fault.
func FaultDoc(name string) string {
	if f, ok := faults[name]; ok {
		return f.doc
	}
	return ""
}

// SetupDoc returns a one-line description of a setup.
func SetupDoc(name string) string {
	if s, ok := setups[name]; ok {
		return s.describe
	}
	return ""
}

// AppliesTo reports whether fault can be injected into setup.
func AppliesTo(setupName, faultName string) bool {
	s, ok1 := setups[setupName]
	f, ok2 := faults[faultName]
	return ok1 && ok2 && f.appliesTo(s)
}

func addFault(f *fault) { faults[f.name] = f }

func init() {
	addFault(&fault{name: FaultNone, doc: "no fault: the baseline"})
	addFault(&fault{name: FaultKill, doc: "kill -9 the server and restart it at once", setups: []string{"redis", "redis-aof", "postgres", "mariadb"}, inject: injectKill})
	addFault(&fault{name: FaultFailover, doc: "cut the replication stream so the replica lags, let a worker lock on the master meanwhile, kill -9 the master, promote the lagging replica, point clients at it (on the sentinel setups the sentinels promote it and clients find it through them; on the cluster setups every replica is stopped and cut off, the master of a fresh grant's slot killed, its replica resumed and promoted with CLUSTER FAILOVER TAKEOVER, and clients follow the slot map); the old master returns as a replica", setups: []string{"redis-replica", "redis-async", "sentinel-replica", "sentinel-async", "cluster-replica", "cluster-async"}, inject: injectFailover})
	addFault(&fault{name: FaultLeader, doc: "kill -9 the leader of the etcd cluster or ZooKeeper ensemble; restart it after 2 TTL", setups: []string{"etcd", "zk"}, recovers: true, inject: injectLeader})
	addFault(&fault{name: FaultDrop, doc: "cut one worker off 2 of the 5 Redlock nodes, so its grants hold a bare majority; once it holds one, a node of its 3 drops every lock key early, as if its clock jumped forward", setups: []string{"redlock"}, inject: injectDrop})
	addFault(&fault{name: FaultPause, doc: "SIGSTOP a worker inside its critical section (a long GC pause) for 1.5 TTL and until another worker wrote its key (at most 5 TTL), then SIGCONT", inject: injectPause})
	addFault(&fault{name: FaultPauseAfterCheck, doc: "a worker stops right after it checked that its lease is valid, before its write, for 1.5 TTL and until another worker wrote its key (at most 5 TTL)", inject: injectPauseAfterCheck})
	addFault(&fault{name: FaultPartition, doc: "cut a holder's connection to the server both ways for 2 TTL while its critical section goes on", proxiedOnly: true, inject: injectPartition})
	addFault(&fault{name: FaultDelay, doc: "add TTL/4 latency each way to a holder's connection for 2 TTL", proxiedOnly: true, inject: injectDelay})
	addFault(&fault{name: FaultClock, doc: "a holder's clock jumps back 2 TTL, then its connection is cut for 2.5 TTL while its critical section goes on", proxiedOnly: true, inject: injectClock})
}

// schedule injects f every Interval (with jitter) until ctx ends or, for a run with
// a target, the target is met after an injection.
func (r *run) schedule(ctx context.Context, f *fault) error {
	var errs []error
	for {
		if r.targetMet() {
			return errors.Join(errs...)
		}
		wait := r.cfg.Interval/2 + time.Duration(r.rnd.Int64N(int64(r.cfg.Interval)))
		select {
		case <-ctx.Done():
			return errors.Join(errs...)
		case <-time.After(wait):
		}
		r.mu.Lock()
		before := r.faultEvents
		r.mu.Unlock()
		if err := f.inject(ctx, r); err != nil {
			r.event(history.Note, f.name, "", "injection failed: "+err.Error())
			errs = append(errs, fmt.Errorf("%s: %w", f.name, err))
			if len(errs) > 3 {
				return errors.Join(errs...)
			}
		} else if ctx.Err() == nil {
			// Count it if it injected anything (it may find no holder to hit).
			r.mu.Lock()
			hit := r.faultEvents > before
			if hit {
				r.injected++
			}
			r.mu.Unlock()
			if hit && f.recovers {
				r.awaitRecovery(ctx, history.Now(), recoveryWait(r.ttl))
			}
		}
	}
}

// recoveryWait bounds how long the scheduler waits for the workload to write
// again after a heal before it starts counting down to the next injection. A
// heal that the backend never recovers from shows as a long gap, not a hang.
func recoveryWait(ttl time.Duration) time.Duration { return max(10*time.Second, 10*ttl) }

// sleep waits d or until ctx ends.
func sleep(ctx context.Context, d time.Duration) {
	select {
	case <-ctx.Done():
	case <-time.After(d):
	}
}

func injectKill(_ context.Context, r *run) error {
	tg := r.tg
	if tg.pg != nil {
		r.event(history.Fault, FaultKill, "postgres", "kill -9 the postmaster and its children")
		tg.pg.Kill()
		err := tg.pg.Restart()
		for try := 0; err != nil && try < 5; try++ {
			// The killed server's children may still hold its shared memory.
			time.Sleep(500 * time.Millisecond)
			err = tg.pg.Restart()
		}
		r.event(history.Heal, FaultKill, "postgres", "restarted")
		return err
	}
	if tg.mariadb != nil {
		r.event(history.Fault, FaultKill, "mariadb", "kill -9 mariadbd")
		tg.mariadb.Kill()
		err := tg.mariadb.Restart()
		r.event(history.Heal, FaultKill, "mariadb", "restarted")
		return err
	}
	if p := r.holder(context.Background()); p != nil {
		p.send(ctlLinger) // a long critical section spans the restart
	}
	r.event(history.Fault, FaultKill, "redis", "kill -9 redis-server")
	tg.redis.Kill()
	err := tg.redis.Restart()
	r.event(history.Heal, FaultKill, "redis", "restarted")
	return err
}

// freshHolder waits up to wait for a worker (among ps, or any) that holds a lease
// whose acquire attempt began at or after t, and returns it with that acquire.
func (r *run) freshHolder(ctx context.Context, ps []*proc, t int64, wait time.Duration) (*proc, history.Op) {
	if ps == nil {
		ps = r.workers
	}
	deadline := time.Now().Add(wait)
	for ctx.Err() == nil && time.Now().Before(deadline) {
		for _, p := range ps {
			if op, holding, _ := p.lease(); holding && op.Attempt >= t {
				return p, op
			}
		}
		time.Sleep(time.Millisecond)
	}
	return nil, history.Op{}
}

// freshHolderOf is freshHolder over every worker, for a grant that ok accepts.
func (r *run) freshHolderOf(ctx context.Context, t int64, wait time.Duration, ok func(history.Op) bool) (*proc, history.Op) {
	deadline := time.Now().Add(wait)
	for ctx.Err() == nil && time.Now().Before(deadline) {
		for _, p := range r.workers {
			if op, holding, _ := p.lease(); holding && op.Attempt >= t && ok(op) {
				return p, op
			}
		}
		time.Sleep(time.Millisecond)
	}
	return nil, history.Op{}
}

// heldKeys returns the keys some worker holds now.
func (r *run) heldKeys() map[string]bool {
	held := map[string]bool{}
	for _, p := range r.workers {
		if op, holding, _ := p.lease(); holding {
			held[op.Key] = true
		}
	}
	return held
}

func injectLeader(ctx context.Context, r *run) error {
	tg := r.tg
	if tg.etcd != nil {
		m := tg.etcd.Leader(5 * time.Second)
		if m == nil {
			return errors.New("no etcd leader")
		}
		r.event(history.Fault, FaultLeader, "etcd "+m.Name(), "kill -9 the leader (no leadership transfer)")
		m.Kill()
		sleep(ctx, 2*r.ttl)
		err := m.Restart() // waits up to 30 s for the member to serve again
		r.event(history.Heal, FaultLeader, "etcd "+m.Name(), "restarted")
		return err
	}
	z := tg.zk.Leader()
	if z == nil {
		return errors.New("no ZooKeeper leader")
	}
	r.event(history.Fault, FaultLeader, "zk "+z.Addr(), "kill -9 the leader")
	z.Kill()
	sleep(ctx, 2*r.ttl)
	err := z.Restart()
	r.event(history.Heal, FaultLeader, "zk "+z.Addr(), "restarted")
	return err
}

// injectDrop reproduces "a holder with a bare majority, and one of its nodes
// forgets": it cuts one worker's links to 2 of the 5 Redlock nodes, so that its
// grants hold exactly 3 nodes, waits for such a grant, makes the holder linger,
// waits until the 2 cut nodes no longer hold the key (the worker's older grants
// there expired), and right after one of the holder's renewals it deletes every
// key with a TTL on one of the holder's 3 nodes: what a forward jump of that node's
// clock does. Until the holder's next renewal puts the key back, another worker can
// get the 2 cut nodes and the forgetful one, a majority, while the first still
// holds its 3. The links are restored after the holder's lingering ends.
func injectDrop(ctx context.Context, r *run) error {
	tg := r.tg
	n := len(tg.nodes)
	q := n/2 + 1
	p := r.workers[r.rnd.IntN(len(r.workers))]
	perm := r.rnd.Perm(n)
	cut, forget := perm[:n-q], tg.nodes[perm[n-q]]
	var names []string
	for _, i := range cut {
		if err := setToxic(tg.nodeProxies[p.id-1][i], "cut-upstream", "upstream", true); err != nil {
			return err
		}
		if err := setToxic(tg.nodeProxies[p.id-1][i], "cut-downstream", "downstream", true); err != nil {
			return err
		}
		names = append(names, tg.nodes[i].Addr())
	}
	since := history.Now()
	r.event(history.Fault, FaultDrop, workerName(p), fmt.Sprintf("links to nodes %s cut: its grants hold a bare majority (%d of %d nodes)", strings.Join(names, ", "), q, n))
	defer func() {
		for _, i := range cut {
			_ = setToxic(tg.nodeProxies[p.id-1][i], "cut-upstream", "upstream", false)
			_ = setToxic(tg.nodeProxies[p.id-1][i], "cut-downstream", "downstream", false)
		}
		r.event(history.Heal, FaultDrop, workerName(p), "links to every node restored")
	}()
	// A writer's grant (with --rw, three grants in four are readers'): once a node
	// drops it, anyone's grant may come beside it, where beside a reader's only a
	// writer's could.
	var op history.Op
	for deadline := time.Now().Add(8 * r.ttl); ctx.Err() == nil; since = op.Attempt + 1 {
		_, op = r.freshHolder(ctx, []*proc{p}, since, time.Until(deadline))
		if op.Lease == 0 || !op.Shared {
			break
		}
	}
	if op.Lease == 0 {
		r.event(history.Note, FaultDrop, workerName(p), "no grant with a bare majority came")
		return nil
	}
	p.send(ctlLinger)
	lockKey := "redlock:lock\x1f" + op.Key // redlock.Backend.LockKey under the default prefix
	// The holder's owner id, from a node it holds the key on.
	owner, err := nodeHolder(forget, lockKey)
	if err != nil {
		return err
	}
	// Wait for the cut nodes to let the holder's grant go (the key free there, or
	// handed to a queued waiter), then for a renewal of the lease.
	deadline := time.Now().Add(3 * r.ttl)
	free := false
	var renewed int64
	for ctx.Err() == nil && time.Now().Before(deadline) {
		cur, holding, rn := p.lease()
		if !holding || cur.Lease != op.Lease {
			break
		}
		if !free {
			free = owner != ""
			for _, i := range cut {
				if h, err := nodeHolder(tg.nodes[i], lockKey); err != nil || h == owner {
					free = false
				}
			}
			if free {
				renewed = rn
			}
		} else if rn > renewed {
			renewed = -1
			break
		}
		time.Sleep(time.Millisecond)
	}
	if renewed != -1 {
		r.event(history.Note, FaultDrop, workerName(p), fmt.Sprintf("lease %d on %s ended before the cut nodes let the key go", op.Lease, op.Key))
		return nil
	}
	dropped, err := dropTTLKeys(forget)
	if err != nil {
		return err
	}
	r.event(history.Note, FaultDrop, "redlock node "+forget.Addr(), fmt.Sprintf("dropped %d keys with a TTL (its clock jumped), among them %s, held by %s lease %d on a bare majority", dropped, op.Key, workerName(p), op.Lease))
	// Keep the links cut while the holder lingers on its bare majority.
	for ctx.Err() == nil {
		if cur, holding, _ := p.lease(); !holding || cur.Lease != op.Lease {
			break
		}
		time.Sleep(5 * time.Millisecond)
	}
	return nil
}

// nodeHolder returns the owner id in the Redlock lock value at key on one node
// ("OWNER", "OWNER TOKEN" or "OWNER TOKEN VALUE"), "" when there is none.
func nodeHolder(n *testserver.Redis, key string) (string, error) {
	c := redis.NewClient(&redis.Options{Addr: n.Addr()})
	defer c.Close()
	v, err := c.Get(context.Background(), key).Result()
	if errors.Is(err, redis.Nil) {
		return "", nil
	}
	owner, _, _ := strings.Cut(v, " ")
	return owner, err
}

// dropTTLKeys deletes the keys that have a TTL (the lock keys and waiter marks, not
// the token registers) on one node.
func dropTTLKeys(n *testserver.Redis) (int, error) {
	c := redis.NewClient(&redis.Options{Addr: n.Addr()})
	defer c.Close()
	ctx := context.Background()
	keys, err := c.Keys(ctx, "*").Result()
	if err != nil {
		return 0, err
	}
	dropped := 0
	for _, k := range keys {
		if ttl, err := c.PTTL(ctx, k).Result(); err == nil && ttl > 0 {
			if c.Del(ctx, k).Err() == nil {
				dropped++
			}
		}
	}
	return dropped, nil
}

// holder picks a worker that holds a lease now, waiting up to a TTL for one.
func (r *run) holder(ctx context.Context) *proc {
	deadline := time.Now().Add(r.ttl)
	for ctx.Err() == nil && time.Now().Before(deadline) {
		var hs []*proc
		for _, p := range r.workers {
			if p.isHolding() {
				hs = append(hs, p)
			}
		}
		if len(hs) > 0 {
			return hs[rand.IntN(len(hs))]
		}
		time.Sleep(time.Millisecond)
	}
	return nil
}

func workerName(p *proc) string { return "worker " + strconv.Itoa(p.id) }

// pauseLong keeps a stopped worker stopped for at least 1.5 TTL (its lease has
// expired on the server by then) and then until another worker has written to key
// since the pause began, up to 5 TTL: the story is a holder that wakes up after
// someone else took the lock and used it.
func (r *run) pauseLong(ctx context.Context, p *proc, key string, since int64) {
	sleep(ctx, r.ttl*3/2)
	deadline := time.Now().Add(r.ttl * 7 / 2)
	for ctx.Err() == nil && time.Now().Before(deadline) && !r.wroteSince(key, p, since) {
		time.Sleep(2 * time.Millisecond)
	}
}

// injectPause stops a holder at a random moment of its critical section. A holder
// checks its lease before each write, and on resuming its core sees at once that
// the validity deadline passed, so the pause shows as a stale write only when it
// fell between a check and the write that follows (pause-after-check forces that).
func injectPause(ctx context.Context, r *run) error {
	p := r.holder(ctx)
	if p == nil {
		return nil
	}
	op, _, _ := p.lease()
	since := history.Now()
	p.signal(sigStop)
	r.event(history.Fault, FaultPause, workerName(p), fmt.Sprintf("SIGSTOP while holding %s (lease %d)", op.Key, op.Lease))
	r.pauseLong(ctx, p, op.Key, since)
	p.signal(sigCont)
	r.event(history.Heal, FaultPause, workerName(p), "SIGCONT")
	return nil
}

func injectPauseAfterCheck(ctx context.Context, r *run) error {
	p := r.workers[r.rnd.IntN(len(r.workers))]
	select { // drop a stale notice
	case <-p.paused:
	default:
	}
	p.send(ctlPause)
	select {
	case <-p.paused:
	case <-ctx.Done():
		return nil
	case <-time.After(10 * r.ttl):
		return nil // it never got to a write: nothing to do
	}
	p.signal(sigStop)
	op, _, _ := p.lease()
	since := history.Now()
	r.event(history.Fault, FaultPauseAfterCheck, workerName(p), fmt.Sprintf("SIGSTOP right after its lease check on %s (lease %d), before its write", op.Key, op.Lease))
	r.pauseLong(ctx, p, op.Key, since)
	p.signal(sigCont)
	p.send(ctlResume)
	r.event(history.Heal, FaultPauseAfterCheck, workerName(p), "SIGCONT")
	return nil
}

func (r *run) cut(p *proc, on bool) error {
	px := r.tg.proxies[p.id-1]
	for _, stream := range []string{"upstream", "downstream"} {
		if err := setToxic(px, "cut-"+stream, stream, on); err != nil {
			return err
		}
	}
	return nil
}

// setToxic adds (on) or removes a cutToxic on one direction of a proxy: it drops
// every byte sent that way until it is removed, and closes nothing, so the peers
// see silence, as behind a cut cable. The bytes are lost, so removing it closes
// that direction of each connection it covered (clients reconnect).
func setToxic(px *toxiproxy.Proxy, name, stream string, on bool) error {
	if !on {
		return px.Toxics.RemoveToxic(context.Background(), name)
	}
	registerCutToxic()
	js := fmt.Sprintf(`{"name":%q,"type":%q,"stream":%q}`, name, cutToxicType, stream)
	_, err := px.Toxics.AddToxicJson(strings.NewReader(js))
	return err
}

func injectPartition(ctx context.Context, r *run) error {
	p := r.holder(ctx)
	if p == nil {
		return nil
	}
	p.send(ctlLinger)
	if err := r.cut(p, true); err != nil {
		return err
	}
	r.event(history.Fault, FaultPartition, workerName(p), "connection to the server cut both ways; the worker goes on writing while its lease is valid")
	sleep(ctx, 2*r.ttl)
	err := r.cut(p, false)
	r.event(history.Heal, FaultPartition, workerName(p), "connection restored")
	return err
}

func injectDelay(ctx context.Context, r *run) error {
	p := r.holder(ctx)
	if p == nil {
		return nil
	}
	px := r.tg.proxies[p.id-1]
	ms := (r.ttl / 4).Milliseconds()
	for _, stream := range []string{"upstream", "downstream"} {
		js := fmt.Sprintf(`{"name":"delay-%s","type":"latency","stream":%q,"attributes":{"latency":%d}}`, stream, stream, ms)
		if _, err := px.Toxics.AddToxicJson(strings.NewReader(js)); err != nil {
			return err
		}
	}
	r.event(history.Fault, FaultDelay, workerName(p), fmt.Sprintf("%dms added each way", ms))
	sleep(ctx, 2*r.ttl)
	var errs []error
	for _, stream := range []string{"upstream", "downstream"} {
		errs = append(errs, px.Toxics.RemoveToxic(context.Background(), "delay-"+stream))
	}
	r.event(history.Heal, FaultDelay, workerName(p), "latency removed")
	return errors.Join(errs...)
}

func injectClock(ctx context.Context, r *run) error {
	p := r.holder(ctx)
	if p == nil {
		return nil
	}
	jump := 2 * r.ttl
	p.send(ctlJump + " -" + jump.String())
	p.send(ctlLinger)
	if err := r.cut(p, true); err != nil {
		return err
	}
	r.event(history.Fault, FaultClock, workerName(p), fmt.Sprintf("its clock jumped back %v, then its connection was cut; it goes on writing while it believes its lease valid", jump))
	sleep(ctx, 5*r.ttl/2)
	err := r.cut(p, false)
	p.send(ctlJump + " " + jump.String())
	r.event(history.Heal, FaultClock, workerName(p), "connection restored, clock set right")
	return err
}
