package check

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/dlockio/dlock/check/history"
)

// Fault names.
const (
	FaultNone            = "none"              // no fault: the baseline
	FaultKill            = "kill"              // kill -9 the server, restart it
	FaultFailover        = "failover"          // kill -9 the Redis master, promote its replica
	FaultLeader          = "leader"            // kill -9 the leader of the etcd cluster or ZooKeeper ensemble, restart it later
	FaultDrop            = "drop"              // one Redlock node drops its lock keys early (its clock jumped)
	FaultPause           = "pause"             // SIGSTOP a lock holder for 1.5 TTL
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
	inject      func(ctx context.Context, r *run) error
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
	addFault(&fault{name: FaultKill, doc: "kill -9 the server and restart it at once", setups: []string{"redis", "redis-aof", "postgres"}, inject: injectKill})
	addFault(&fault{name: FaultFailover, doc: "kill -9 the Redis master, promote its replica, point clients at it; the old master returns as a replica", setups: []string{"redis-replica", "redis-async"}, inject: injectFailover})
	addFault(&fault{name: FaultLeader, doc: "kill -9 the leader of the etcd cluster or ZooKeeper ensemble; restart it after 2 TTL", setups: []string{"etcd", "zk"}, inject: injectLeader})
	addFault(&fault{name: FaultDrop, doc: "one Redlock node drops every lock key early, as if its clock jumped forward", setups: []string{"redlock"}, inject: injectDrop})
	addFault(&fault{name: FaultPause, doc: "SIGSTOP a worker that holds a lease for 1.5 TTL (a long GC pause), then SIGCONT", inject: injectPause})
	addFault(&fault{name: FaultPauseAfterCheck, doc: "a worker stops right after it checked that its lease is valid, before its write, for 1.5 TTL", inject: injectPauseAfterCheck})
	addFault(&fault{name: FaultPartition, doc: "cut a holder's connection to the server both ways for 2 TTL while its critical section goes on", proxiedOnly: true, inject: injectPartition})
	addFault(&fault{name: FaultDelay, doc: "add TTL/4 latency each way to a holder's connection for 2 TTL", proxiedOnly: true, inject: injectDelay})
	addFault(&fault{name: FaultClock, doc: "a holder's clock jumps back 2 TTL, then its connection is cut for 2.5 TTL while its critical section goes on", proxiedOnly: true, inject: injectClock})
}

// schedule injects f every Interval (with jitter) until ctx ends.
func (r *run) schedule(ctx context.Context, f *fault) error {
	var errs []error
	for {
		wait := r.cfg.Interval/2 + time.Duration(r.rnd.Int64N(int64(r.cfg.Interval)))
		select {
		case <-ctx.Done():
			return errors.Join(errs...)
		case <-time.After(wait):
		}
		if err := f.inject(ctx, r); err != nil {
			r.event(history.Note, f.name, "", "injection failed: "+err.Error())
			errs = append(errs, fmt.Errorf("%s: %w", f.name, err))
			if len(errs) > 3 {
				return errors.Join(errs...)
			}
		}
	}
}

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
	if p := r.holder(context.Background()); p != nil {
		p.send(ctlLinger) // a long critical section spans the restart
	}
	r.event(history.Fault, FaultKill, "redis", "kill -9 redis-server")
	tg.redis.Kill()
	err := tg.redis.Restart()
	r.event(history.Heal, FaultKill, "redis", "restarted")
	return err
}

func injectFailover(ctx context.Context, r *run) error {
	tg := r.tg
	old, next := tg.redis, tg.replica
	r.event(history.Fault, FaultFailover, "redis master", "kill -9 the master at "+old.Addr())
	old.Kill()
	c := redis.NewClient(&redis.Options{Addr: next.Addr()})
	defer c.Close()
	if err := c.Do(context.Background(), "REPLICAOF", "NO", "ONE").Err(); err != nil {
		return fmt.Errorf("promote %s: %w", next.Addr(), err)
	}
	if err := tg.retarget(next.Addr()); err != nil {
		return err
	}
	r.event(history.Heal, FaultFailover, "redis replica", "promoted "+next.Addr()+"; clients follow it")
	// The old master comes back empty as a replica of the new one, ready for the
	// next failover.
	if err := old.Restart(); err != nil {
		return err
	}
	oc := redis.NewClient(&redis.Options{Addr: old.Addr()})
	defer oc.Close()
	if err := oc.Do(context.Background(), "REPLICAOF", "127.0.0.1", strconv.Itoa(next.Port)).Err(); err != nil {
		return err
	}
	deadline := time.Now().Add(10 * time.Second)
	for {
		info, err := oc.Info(context.Background(), "replication").Result()
		if err == nil && strings.Contains(info, "master_link_status:up") {
			break
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			return fmt.Errorf("old master %s did not sync as a replica", old.Addr())
		}
		time.Sleep(20 * time.Millisecond)
	}
	tg.redis, tg.replica = next, old
	return nil
}

func injectLeader(ctx context.Context, r *run) error {
	tg := r.tg
	if tg.etcd != nil {
		m := tg.etcd.Leader(5 * time.Second)
		if m == nil {
			return errors.New("no etcd leader")
		}
		r.event(history.Fault, FaultLeader, "etcd "+m.Name(), "kill the leader (hard stop, no leadership transfer)")
		m.Kill()
		sleep(ctx, 2*r.ttl)
		sctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		err := m.Start(sctx)
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

// injectDrop deletes the keys that have a TTL (the lock keys, not the token
// registers) on one Redlock node: what a forward jump of that node's clock does.
func injectDrop(_ context.Context, r *run) error {
	n := r.tg.nodes[r.rnd.IntN(len(r.tg.nodes))]
	c := redis.NewClient(&redis.Options{Addr: n.Addr()})
	defer c.Close()
	ctx := context.Background()
	keys, err := c.Keys(ctx, "*").Result()
	if err != nil {
		return err
	}
	dropped := 0
	for _, k := range keys {
		if ttl, err := c.PTTL(ctx, k).Result(); err == nil && ttl > 0 {
			if c.Del(ctx, k).Err() == nil {
				dropped++
			}
		}
	}
	r.event(history.Fault, FaultDrop, "redlock node "+n.Addr(), fmt.Sprintf("dropped %d keys with a TTL", dropped))
	r.event(history.Heal, FaultDrop, "redlock node "+n.Addr(), "")
	return nil
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

func injectPause(ctx context.Context, r *run) error {
	p := r.holder(ctx)
	if p == nil {
		return nil
	}
	p.signal(syscall.SIGSTOP)
	r.event(history.Fault, FaultPause, workerName(p), "SIGSTOP while holding a lease")
	sleep(ctx, r.ttl*3/2)
	p.signal(syscall.SIGCONT)
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
	p.signal(syscall.SIGSTOP)
	r.event(history.Fault, FaultPauseAfterCheck, workerName(p), "SIGSTOP right after its lease check, before its write")
	sleep(ctx, r.ttl*3/2)
	p.signal(syscall.SIGCONT)
	p.send(ctlResume)
	r.event(history.Heal, FaultPauseAfterCheck, workerName(p), "SIGCONT")
	return nil
}

func (r *run) cut(p *proc, on bool) error {
	px := r.tg.proxies[p.id-1]
	for _, stream := range []string{"upstream", "downstream"} {
		name := "cut-" + stream
		if !on {
			if err := px.Toxics.RemoveToxic(context.Background(), name); err != nil {
				return err
			}
			continue
		}
		// A timeout toxic with timeout 0 holds all data until it is removed: a
		// partition, after which TCP delivers what was sent.
		js := fmt.Sprintf(`{"name":%q,"type":"timeout","stream":%q,"attributes":{"timeout":0}}`, name, stream)
		if _, err := px.Toxics.AddToxicJson(strings.NewReader(js)); err != nil {
			return err
		}
	}
	return nil
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
