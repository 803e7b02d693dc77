package measure

import (
	"context"
	"errors"
	"fmt"
	mrand "math/rand/v2"
	"sync"
	"sync/atomic"
	"time"

	"github.com/dlockio/dlock"
	"github.com/dlockio/dlock/driver"
)

// Limit bounds a measuring loop: it stops after N operations or after Duration,
// whichever comes first. At least one of them must be set; every loop also stops when
// its context ends.
type Limit struct {
	N        int64         // operations; 0 = no bound on the count
	Duration time.Duration // 0 = no bound on time
}

func (l Limit) check() error {
	if l.N <= 0 && l.Duration <= 0 {
		return fmt.Errorf("%w: bench: a limit needs a count or a duration", driver.ErrInvalid)
	}
	return nil
}

// counter hands out operation numbers and says when the limit is reached. It is safe
// for concurrent use.
type counter struct {
	lim   Limit
	start time.Time
	next  atomic.Int64
}

func newCounter(l Limit) *counter { return &counter{lim: l, start: time.Now()} }

// take reserves one more operation, or reports false when the limit is reached.
func (c *counter) take() bool {
	if c.lim.N > 0 && c.next.Add(1) > c.lim.N {
		return false
	}
	return !c.expired()
}

// expired reports whether the time limit has passed.
func (c *counter) expired() bool {
	return c.lim.Duration > 0 && time.Since(c.start) >= c.lim.Duration
}

// next decides the fate of a worker's next operation: run and count it (it takes
// one from the limit), run it uncounted (not every worker has started yet), or stop.
func (c *counter) nextOp(st *starter) (run, counted bool) {
	if !st.counting() {
		return !c.expired(), false
	}
	ok := c.take()
	return ok, ok
}

// CycleRun holds the latencies of uncontended cycles: Lock+Release through dlock,
// the same through the backend driver alone (Acquire+Release, none of the core), and
// the store's floor cycle (see Floor).
type CycleRun struct {
	Dlock  Samples
	Driver Samples
	Floor  Samples
}

// CyclePeers are what Cycles pairs the dlock cycles with, each optional: the
// backend's floor, and the raw driver (its Acquire and Release called directly with
// a fresh owner id per cycle, as the core makes them, to tell the driver's cost from
// the core's).
type CyclePeers struct {
	Floor     Floor
	FloorKey  string
	Driver    driver.Backend
	DriverKey string
}

// Cycles runs uncontended Lock+Release cycles of key on c until lim is reached and
// adds their latencies to run.Dlock. Each dlock cycle is paired with one cycle of
// every peer given, in rotating order, so that all see the same machine load and
// their ratios mean something on a busy machine; lim.N then counts such groups.
func Cycles(ctx context.Context, c *dlock.Client, key string, peers CyclePeers, lim Limit, run *CycleRun) error {
	if err := lim.check(); err != nil {
		return err
	}
	steps := []func() error{func() error {
		t0 := time.Now()
		l, err := c.Lock(ctx, key)
		if err != nil {
			return fmt.Errorf("bench: lock %q: %w", key, err)
		}
		if err := l.Release(ctx); err != nil {
			return fmt.Errorf("bench: release %q: %w", key, err)
		}
		run.Dlock.Add(time.Since(t0))
		return nil
	}}
	if peers.Floor != nil {
		steps = append(steps, func() error { return floorOnce(ctx, peers.Floor, peers.FloorKey, &run.Floor) })
	}
	if peers.Driver != nil {
		// Reenter as the core sets it for its generated owner ids (a fresh one
		// per cycle here too), so the driver does what it does under the core.
		req := driver.Request{Key: peers.DriverKey, TTL: dlock.DefaultTTL, Reenter: true}
		steps = append(steps, func() error {
			t0 := time.Now()
			req.Owner = driver.RandomHex(16) // a fresh value per cycle, as the core and the floor
			if _, err := peers.Driver.Acquire(ctx, req); err != nil {
				return fmt.Errorf("bench: driver acquire %q: %w", req.Key, err)
			}
			if err := peers.Driver.Release(ctx, req.Key, req.Owner); err != nil {
				return fmt.Errorf("bench: driver release %q: %w", req.Key, err)
			}
			run.Driver.Add(time.Since(t0))
			return nil
		})
	}
	cnt := newCounter(lim)
	for i := 0; cnt.take(); i++ {
		for j := range steps {
			if err := ctx.Err(); err != nil {
				return err
			}
			if err := steps[(i+j)%len(steps)](); err != nil {
				return err
			}
		}
	}
	return nil
}

// Floor takes and releases key the cheapest way a store allows, without dlock (the
// least correct lock): the baseline dlock's cycle is compared with.
type Floor func(ctx context.Context, key string) error

func floorOnce(ctx context.Context, f Floor, key string, s *Samples) error {
	t0 := time.Now()
	if err := f(ctx, key); err != nil {
		return fmt.Errorf("bench: floor cycle %q: %w", key, err)
	}
	s.Add(time.Since(t0))
	return nil
}

// FloorCycles runs floor cycles of key until lim is reached and adds their latencies
// to s.
func FloorCycles(ctx context.Context, f Floor, key string, lim Limit, s *Samples) error {
	if err := lim.check(); err != nil {
		return err
	}
	cnt := newCounter(lim)
	for cnt.take() {
		if err := ctx.Err(); err != nil {
			return err
		}
		if err := floorOnce(ctx, f, key, s); err != nil {
			return err
		}
	}
	return nil
}

// HandoffOptions are the optional parts of Handoff.
type HandoffOptions struct {
	// Inspector shows when the next client's Lock is queued on the server; without
	// it Handoff gives the waiter a millisecond.
	Inspector driver.Inspector
	// Ops reads a running total of server operations; when set, HandoffRun.Ops
	// counts those made by the timed part of the handoffs.
	Ops func(context.Context) (int64, error)
	// Pause and Resume, when set, are called around the untimed set-up of each
	// handoff (a Go benchmark stops and starts its timer there).
	Pause, Resume func()
	// RoundTrip, when set, is timed once per handoff, in the untimed set-up right
	// before the release, so that HandoffRun.RTT sees the machine in the same state
	// as the handoff (after the same idle wait) and the two can be divided.
	RoundTrip func(context.Context) error
}

// HandoffRun is the outcome of Handoff.
type HandoffRun struct {
	Latency  Samples // from a Release call to the waiting client's Lock returning
	RTT      Samples // one RoundTrip per handoff, when HandoffOptions.RoundTrip is set
	Handoffs int64
	Ops      int64 // server operations during the timed parts, when counted
}

// Handoff passes key back and forth between two clients until lim is reached: one
// holds it, the other waits in Lock, the holder releases. Each handoff's latency runs
// from the Release call to the waiter's Lock returning; the wait for the waiter to
// queue is not timed.
func Handoff(ctx context.Context, a, b *dlock.Client, key string, lim Limit, o HandoffOptions) (HandoffRun, error) {
	var run HandoffRun
	if err := lim.check(); err != nil {
		return run, err
	}
	pause, resume := o.Pause, o.Resume
	if pause == nil || resume == nil {
		pause, resume = func() {}, func() {}
	}
	clients := [2]*dlock.Client{a, b}
	l, err := a.Lock(ctx, key)
	if err != nil {
		return run, fmt.Errorf("bench: lock %q: %w", key, err)
	}
	type result struct {
		l   *dlock.Lease
		at  time.Time
		err error
	}
	turn := make(chan result, 1)
	cnt := newCounter(lim)
	for i := 0; cnt.take(); i++ {
		next := clients[(i+1)%2]
		go func() {
			nl, err := next.Lock(ctx, key)
			turn <- result{nl, time.Now(), err}
		}()
		pause()
		waitQueued(ctx, o.Inspector, key, 1)
		if o.RoundTrip != nil {
			t := time.Now()
			if err := o.RoundTrip(ctx); err == nil {
				run.RTT.Add(time.Since(t))
			}
		}
		var before int64
		if o.Ops != nil {
			if before, err = o.Ops(ctx); err != nil {
				resume()
				_ = l.Release(ctx)
				<-turn
				return run, fmt.Errorf("bench: server ops: %w", err)
			}
		}
		resume()
		released := time.Now()
		relErr := l.Release(ctx)
		r := <-turn
		if relErr != nil || r.err != nil {
			if r.l != nil {
				_ = r.l.Release(ctx)
			}
			return run, fmt.Errorf("bench: handoff of %q: %w", key, errors.Join(relErr, r.err))
		}
		run.Latency.Add(r.at.Sub(released))
		run.Handoffs++
		l = r.l
		if o.Ops != nil {
			pause()
			after, err := o.Ops(ctx)
			resume()
			if err != nil {
				_ = l.Release(ctx)
				return run, fmt.Errorf("bench: server ops: %w", err)
			}
			run.Ops += after - before
		}
	}
	if err := l.Release(ctx); err != nil {
		return run, fmt.Errorf("bench: release %q: %w", key, err)
	}
	return run, nil
}

// waitQueued waits, for at most a few seconds, until in shows n waiters queued on
// key; without an Inspector (or one that does not count waiters) it gives the
// waiters a millisecond.
func waitQueued(ctx context.Context, in driver.Inspector, key string, n int) {
	if in == nil {
		sleep(ctx, time.Millisecond)
		return
	}
	deadline := time.Now().Add(5 * time.Second)
	for ctx.Err() == nil && time.Now().Before(deadline) {
		info, err := in.Inspect(ctx, key)
		if err == nil && (info.Waiters >= n || info.Waiters < 0) {
			if info.Waiters < 0 {
				sleep(ctx, time.Millisecond)
			}
			return
		}
		sleep(ctx, 20*time.Microsecond)
	}
}

func sleep(ctx context.Context, d time.Duration) {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
	case <-ctx.Done():
	}
}

// ContendRun is the outcome of Contend and FloorContend. Its counts start when the
// last worker has started: a worker that starts first would otherwise run alone for
// a while (on a busy machine, or with GOMAXPROCS=1, for a whole scheduler time slice)
// and look favoured when the lock is fair.
type ContendRun struct {
	Counts       []int64 // acquisitions per worker, once every worker has started
	Acquisitions int64   // their sum
	All          int64   // every acquisition, counted or not
	Elapsed      time.Duration
	// Handoff holds, for a single hot key, the time from a Release call to the
	// next holder's Lock returning (whichever worker that is).
	Handoff Samples
	// Overlaps counts acquisitions that found another worker still inside the
	// same key: a mutual exclusion failure, expected to be 0.
	Overlaps int64
}

// starter tells when every worker has started.
type starter struct {
	workers int64
	base    time.Time
	entered atomic.Int64
	allIn   atomic.Int64 // ns since base when the last worker started; 0 before
}

func newStarter(workers int) *starter { return &starter{workers: int64(workers), base: time.Now()} }

// enter is called by each worker once, before its first operation.
func (s *starter) enter() {
	if s.entered.Add(1) == s.workers {
		s.allIn.Store(max(int64(time.Since(s.base)), 1))
	}
}

// counting reports whether every worker has started.
func (s *starter) counting() bool { return s.allIn.Load() != 0 }

// elapsed is the time since every worker started, 0 if they never all did.
func (s *starter) elapsed() time.Duration {
	t := s.allIn.Load()
	if t == 0 {
		return 0
	}
	return time.Since(s.base) - time.Duration(t)
}

// Contend runs one worker per client, each looping Lock+Release on a key drawn
// uniformly from keys (a single key makes it a hot key), until lim is reached (lim.N
// counts the acquisitions made once every worker has started). Every client should
// have its own connection, as separate processes would.
func Contend(ctx context.Context, clients []*dlock.Client, keys []string, lim Limit) (ContendRun, error) {
	run := ContendRun{Counts: make([]int64, len(clients))}
	if err := lim.check(); err != nil {
		return run, err
	}
	if len(clients) == 0 || len(keys) == 0 {
		return run, fmt.Errorf("%w: bench: Contend needs clients and keys", driver.ErrInvalid)
	}
	inside := make([]atomic.Int32, len(keys))
	st := newStarter(len(clients))
	var lastRelease atomic.Int64 // ns since st.base of the latest Release call; hot key only
	var hmu sync.Mutex
	cnt := newCounter(lim)
	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	var wg sync.WaitGroup
	for w, c := range clients {
		wg.Go(func() {
			rng := mrand.New(mrand.NewPCG(uint64(w), 42))
			st.enter()
			for ctx.Err() == nil {
				ok, counted := cnt.nextOp(st)
				if !ok {
					return
				}
				k := 0
				if len(keys) > 1 {
					k = rng.IntN(len(keys))
				}
				l, err := c.Lock(ctx, keys[k])
				if err != nil {
					if ctx.Err() == nil {
						cancel(fmt.Errorf("bench: lock %q: %w", keys[k], err))
					}
					return
				}
				if inside[k].Add(1) != 1 {
					atomic.AddInt64(&run.Overlaps, 1)
				}
				atomic.AddInt64(&run.All, 1)
				if counted {
					if t := lastRelease.Load(); t != 0 && len(keys) == 1 {
						d := time.Since(st.base) - time.Duration(t)
						hmu.Lock()
						run.Handoff.Add(d)
						hmu.Unlock()
					}
					run.Counts[w]++
				}
				inside[k].Add(-1)
				if len(keys) == 1 {
					lastRelease.Store(int64(time.Since(st.base)))
				}
				if err := l.Release(ctx); err != nil {
					cancel(fmt.Errorf("bench: release %q: %w", keys[k], err))
					return
				}
			}
		})
	}
	wg.Wait()
	run.Elapsed = st.elapsed()
	for _, n := range run.Counts {
		run.Acquisitions += n
	}
	if err := context.Cause(ctx); err != nil {
		return run, err
	}
	return run, nil
}

// FloorContend runs one worker per floor (each its own connection), each looping
// floor cycles over perWorker keys of its own, so the floor never meets contention:
// it bounds what the engine does with that many clients in parallel.
func FloorContend(ctx context.Context, floors []Floor, prefix string, perWorker int, lim Limit) (ContendRun, error) {
	run := ContendRun{Counts: make([]int64, len(floors))}
	if err := lim.check(); err != nil {
		return run, err
	}
	perWorker = max(perWorker, 1)
	st := newStarter(len(floors))
	cnt := newCounter(lim)
	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	var wg sync.WaitGroup
	for w, f := range floors {
		wg.Go(func() {
			rng := mrand.New(mrand.NewPCG(uint64(w), 43))
			st.enter()
			for ctx.Err() == nil {
				ok, counted := cnt.nextOp(st)
				if !ok {
					return
				}
				key := fmt.Sprintf("%s.%d.%d", prefix, w, rng.IntN(perWorker))
				if err := f(ctx, key); err != nil {
					if ctx.Err() == nil {
						cancel(fmt.Errorf("bench: floor cycle %q: %w", key, err))
					}
					return
				}
				atomic.AddInt64(&run.All, 1)
				if counted {
					run.Counts[w]++
				}
			}
		})
	}
	wg.Wait()
	run.Elapsed = st.elapsed()
	for _, n := range run.Counts {
		run.Acquisitions += n
	}
	return run, context.Cause(ctx)
}

// GrowthOptions are the optional parts of Growth.
type GrowthOptions struct {
	// Inspector shows the waiters queued on the server.
	Inspector driver.Inspector
	// Ops reads a running total of server operations, and OpsOverhead is what one
	// read itself adds to that total (see OpsOverhead).
	Ops         func(context.Context) (int64, error)
	OpsOverhead int64
	// Calls reads a running total of the driver calls the clients made, and Locked
	// of the attempts answered "locked" (see Counting).
	Calls, Locked func() int64
}

// GrowthRun is the outcome of Growth.
type GrowthRun struct {
	Waiters  int
	Handoffs int64
	Elapsed  time.Duration // from the first Release to the last waiter's Release
	Ops      int64         // server operations over the chain; -1 when not counted
	Calls    int64         // driver calls over the chain; -1 when not counted
	Queued   bool          // every waiter was seen queued before the release
}

// Growth measures what a handoff costs with many waiters: holder takes key, n
// waiters (each its own owner id, spread round-robin over the clients of pool) queue
// behind it, and the holder releases. Each waiter releases as soon as it holds the
// key, so the key passes down the chain to every waiter. The run counts the server
// operations and driver calls made from the first Release to the last, n handoffs in
// all: a backend that wakes only the next waiter costs the same per handoff whatever
// n is; one that wakes every waiter (a herd) costs more per handoff as n grows.
func Growth(ctx context.Context, holder *dlock.Client, pool []*dlock.Client, key string, n int, o GrowthOptions) (GrowthRun, error) {
	run := GrowthRun{Waiters: n, Ops: -1, Calls: -1}
	if n < 1 || len(pool) == 0 {
		return run, fmt.Errorf("%w: bench: Growth needs waiters and clients", driver.ErrInvalid)
	}
	l, err := holder.Lock(ctx, key)
	if err != nil {
		return run, fmt.Errorf("bench: lock %q: %w", key, err)
	}
	var locked0 int64
	if o.Locked != nil {
		locked0 = o.Locked()
	}
	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	var wg sync.WaitGroup
	var done atomic.Int64
	allDone := make(chan struct{})
	for i := range n {
		c := pool[i%len(pool)]
		wg.Go(func() {
			nl, err := c.Lock(ctx, key)
			if err == nil {
				err = nl.Release(ctx)
			}
			if err != nil {
				cancel(fmt.Errorf("bench: waiter %d of %d on %q: %w", i+1, n, key, err))
				return
			}
			if done.Add(1) == int64(n) {
				close(allDone)
			}
		})
	}
	fail := func(err error) (GrowthRun, error) {
		cancel(err)
		rctx, rcancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
		_ = l.Release(rctx)
		rcancel()
		wg.Wait()
		return run, err
	}
	// Every waiter has been told "locked" once (it is queued, or polling).
	for o.Locked != nil && o.Locked()-locked0 < int64(n) {
		if ctx.Err() != nil {
			return fail(context.Cause(ctx))
		}
		sleep(ctx, 200*time.Microsecond)
	}
	if o.Inspector != nil {
		deadline := time.Now().Add(10 * time.Second)
		for ctx.Err() == nil && time.Now().Before(deadline) {
			info, err := o.Inspector.Inspect(ctx, key)
			if err == nil && info.Waiters < 0 {
				break
			}
			if err == nil && info.Waiters >= n {
				run.Queued = true
				break
			}
			sleep(ctx, time.Millisecond)
		}
	} else if o.Locked == nil {
		sleep(ctx, 100*time.Millisecond)
	}
	if ctx.Err() != nil {
		return fail(context.Cause(ctx))
	}
	var ops0, calls0 int64
	if o.Ops != nil {
		if ops0, err = o.Ops(ctx); err != nil {
			return fail(fmt.Errorf("bench: server ops: %w", err))
		}
		// Work a waiter started when it queued may still be under way (etcd sets
		// up a waiter's watch after the attempt that queued it): count from when
		// the server's counter stays put for 10ms (beyond what reading it adds),
		// waiting at most 2s, so that setting up the queue is not charged to the
		// handoffs, however long the queue.
		for deadline := time.Now().Add(2 * time.Second); time.Now().Before(deadline); {
			sleep(ctx, 10*time.Millisecond)
			cur, err := o.Ops(ctx)
			if err != nil {
				return fail(fmt.Errorf("bench: server ops: %w", err))
			}
			settled := cur-ops0 <= o.OpsOverhead
			ops0 = cur
			if settled {
				break
			}
		}
	}
	if o.Calls != nil {
		calls0 = o.Calls()
	}
	t0 := time.Now()
	if err := l.Release(ctx); err != nil {
		return fail(fmt.Errorf("bench: release %q: %w", key, err))
	}
	select {
	case <-allDone:
	case <-ctx.Done():
	}
	run.Elapsed = time.Since(t0)
	wg.Wait()
	if err := context.Cause(ctx); err != nil {
		return run, err
	}
	run.Handoffs = int64(n)
	if o.Calls != nil {
		run.Calls = o.Calls() - calls0
	}
	if o.Ops != nil {
		ops1, err := o.Ops(ctx)
		if err != nil {
			return run, fmt.Errorf("bench: server ops: %w", err)
		}
		run.Ops = max(ops1-ops0-o.OpsOverhead, 0)
	}
	return run, nil
}

// OpsOverhead estimates what one read of ops adds to its own total (a ZooKeeper mntr
// request is itself a packet; a Redis INFO is not counted): the smallest difference
// between two reads in a row, over a few tries.
func OpsOverhead(ctx context.Context, ops func(context.Context) (int64, error)) (int64, error) {
	best := int64(-1)
	for range 5 {
		a, err := ops(ctx)
		if err != nil {
			return 0, err
		}
		b, err := ops(ctx)
		if err != nil {
			return 0, err
		}
		if d := b - a; best < 0 || d < best {
			best = d
		}
	}
	return max(best, 0), nil
}
