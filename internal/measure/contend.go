package measure

import (
	"context"
	"fmt"
	mrand "math/rand/v2"
	"sync"
	"sync/atomic"
	"time"

	"github.com/dlockio/dlock"
	"github.com/dlockio/dlock/driver"
)

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
	now     func() time.Time // time.Now; a test's clock
	entered atomic.Int64
	allIn   atomic.Int64 // ns since base when the last worker started; 0 before
}

func newStarter(workers int) *starter {
	return &starter{workers: int64(workers), base: time.Now(), now: time.Now}
}

// since is the time since base.
func (s *starter) since() time.Duration { return s.now().Sub(s.base) }

// enter is called by each worker once, before its first operation.
func (s *starter) enter() {
	if s.entered.Add(1) == s.workers {
		s.allIn.Store(max(int64(s.since()), 1))
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
	return s.since() - time.Duration(t)
}

// Contend runs one worker per client, each looping Lock+Release on a key drawn
// uniformly from keys (a single key makes it a hot key), until lim is reached: lim.N
// counts the acquisitions made once every worker has started, and lim.Duration runs
// from then, so a slow start (goroutines that a loaded machine schedules late) does
// not eat the measured time. Every client should have its own connection, as
// separate processes would.
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
						d := st.since() - time.Duration(t)
						hmu.Lock()
						run.Handoff.Add(d)
						hmu.Unlock()
					}
					run.Counts[w]++
				}
				inside[k].Add(-1)
				if len(keys) == 1 {
					lastRelease.Store(int64(st.since()))
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
