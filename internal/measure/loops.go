// Package measure holds the measuring loops and statistics that the backends' Go
// benchmarks (through drivertest) and the dlock bench command share, so that a
// developer's benchmark and a user's side-by-side run measure the same thing: cycles,
// handoffs, contention, the cost of a handoff as waiters grow, and counting wrappers
// around a driver.Backend.
package measure

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
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

// nextOp decides the fate of a worker's next operation: run it uncounted (not every
// worker has started yet: each does at once, so this phase is short), run and count
// it (it takes one from the limit), or stop. The limit's Duration runs from the
// moment every worker has started, as the run's Elapsed does, not from the counter's
// creation.
func (c *counter) nextOp(st *starter) (run, counted bool) {
	if !st.counting() {
		return true, false
	}
	if c.lim.N > 0 && c.next.Add(1) > c.lim.N {
		return false, false
	}
	if c.lim.Duration > 0 && st.elapsed() >= c.lim.Duration {
		return false, false
	}
	return true, true
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
// backend's floor, the raw driver (its Acquire and Release called directly with a
// fresh owner id per cycle, as the core makes them, to tell the driver's cost from
// the core's), and other clients' cycles (Others).
type CyclePeers struct {
	Floor     Floor
	FloorKey  string
	Driver    driver.Backend
	DriverKey string
	Others    []*Paired
}

// Paired is one more client whose Lock+Release cycles on Key Cycles pairs dlock's
// cycles with, timed into Samples: in cmd/dlock's bench, another lock library on
// the same store wrapped as a dlock.Client, so that it is measured in the same loop
// as dlock, cycle by cycle, rather than in a loop of its own (on an idle machine a
// loop's shape alone can change a round trip's latency several times over; see
// docs/benchmarks.md). A paired client whose cycle fails leaves the rotation with
// its error in Err; the other cycles go on.
type Paired struct {
	Client  *dlock.Client
	Key     string
	Samples Samples
	Err     error
}

// Cycles runs uncontended Lock+Release cycles of key on c until lim is reached and
// adds their latencies to run.Dlock. Each dlock cycle is paired with one cycle of
// every peer given, so that all see the same machine load and their ratios mean
// something on a busy machine; lim.N then counts such groups. The order within a
// group is shuffled each time, so that no cycle always runs right after the same
// other one: on an idle machine, what ran just before (a client that started
// goroutines, say, whose threads were still spinning) can change a round trip's
// latency.
func Cycles(ctx context.Context, c *dlock.Client, key string, peers CyclePeers, lim Limit, run *CycleRun) error {
	if err := lim.check(); err != nil {
		return err
	}
	steps := []func() error{func() error { return lockOnce(ctx, c, key, &run.Dlock) }}
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
	for _, p := range peers.Others {
		steps = append(steps, func() error {
			if p.Err == nil {
				p.Err = lockOnce(ctx, p.Client, p.Key, &p.Samples)
			}
			return nil
		})
	}
	order := make([]int, len(steps))
	for i := range order {
		order[i] = i
	}
	cnt := newCounter(lim)
	for cnt.take() {
		rand.Shuffle(len(order), func(a, b int) { order[a], order[b] = order[b], order[a] })
		for _, k := range order {
			if err := ctx.Err(); err != nil {
				return err
			}
			if err := steps[k](); err != nil {
				return err
			}
		}
	}
	return nil
}

// Floor takes and releases key the cheapest way a store allows, without dlock (the
// least correct lock): the baseline dlock's cycle is compared with.
type Floor func(ctx context.Context, key string) error

// lockOnce times one Lock+Release of key through c into s.
func lockOnce(ctx context.Context, c *dlock.Client, key string, s *Samples) error {
	t0 := time.Now()
	l, err := c.Lock(ctx, key)
	if err != nil {
		return fmt.Errorf("bench: lock %q: %w", key, err)
	}
	if err := l.Release(ctx); err != nil {
		return fmt.Errorf("bench: release %q: %w", key, err)
	}
	s.Add(time.Since(t0))
	return nil
}

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
