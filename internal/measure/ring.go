package measure

import (
	"context"
	"fmt"
	"os"
	"strconv"
	"strings"
	"sync"
	"time"
)

// Ring measures a bare fair handoff, without dlock: workers take a key in a fixed
// order (turn t is worker t mod workers), each waiting with the store's own wake-up
// and passing the key on with the store's own write. It bounds what any fair lock
// built on that wake-up and write can reach on the machine, beside which a backend's
// hot key shows what its own statements cost (see the ceiling benchmarks of pglock
// and mysqllock).
//
// Worker w runs its turns w, w+workers, ... below turns: for each it calls wait (not
// for turn 0), which returns once the turn's predecessor has passed the key, then
// pass, which hands the key to turn+1 and wakes its worker. A worker stops when its
// next turn is not below turns, so every wait called is matched by a pass. Ring
// returns the time from the first turn's start to the last pass. After an error it
// cancels the context it gives wait and pass, whose blocking calls must then return.
func Ring(ctx context.Context, workers int, turns int64, wait, pass func(ctx context.Context, w int, turn int64) error) (time.Duration, error) {
	if workers < 2 || turns < 1 {
		return 0, fmt.Errorf("measure: a ring needs 2 workers or more and a turn (got %d, %d)", workers, turns)
	}
	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	start := time.Now()
	var wg sync.WaitGroup
	for w := range workers {
		wg.Go(func() {
			for t := int64(w); t < turns; t += int64(workers) {
				if t > 0 {
					if err := wait(ctx, w, t); err != nil {
						cancel(fmt.Errorf("wait for turn %d: %w", t, err))
						return
					}
				}
				if err := pass(ctx, w, t); err != nil {
					cancel(fmt.Errorf("pass turn %d: %w", t, err))
					return
				}
			}
		})
	}
	wg.Wait()
	return time.Since(start), context.Cause(ctx)
}

// Polled measures the unfair lock that most peers are: each worker tries to take
// the key, and while it is taken sleeps poll and tries again. try reports whether
// worker w took it; release gives it back. Polled runs until n acquisitions are made
// and returns the time they took. A worker that took the key always gives it back,
// so the key is free when Polled returns without an error.
func Polled(ctx context.Context, workers int, n int64, poll time.Duration, try func(ctx context.Context, w int) (bool, error), release func(ctx context.Context, w int) error) (time.Duration, error) {
	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	cnt := newCounter(Limit{N: n})
	done := make(chan struct{})
	var finish sync.Once
	var took time.Duration
	start := time.Now()
	var wg sync.WaitGroup
	for w := range workers {
		wg.Go(func() {
			for {
				select {
				case <-done:
					return
				case <-ctx.Done():
					return
				default:
				}
				ok, err := try(ctx, w)
				if err != nil {
					cancel(err)
					return
				}
				if !ok {
					select {
					case <-time.After(poll):
					case <-done:
					case <-ctx.Done():
					}
					continue
				}
				if err := release(ctx, w); err != nil {
					cancel(err)
					return
				}
				if !cnt.take() {
					finish.Do(func() {
						took = time.Since(start)
						close(done)
					})
					return
				}
			}
		})
	}
	wg.Wait()
	if err := context.Cause(ctx); err != nil {
		return 0, err
	}
	return took, nil
}

// MachineCPU returns the CPU time the whole machine has spent busy (every state but
// idle and I/O wait, over all CPUs) since boot, from Linux's /proc/stat; false where
// that cannot be read. The difference of two readings over an operation count is
// what the operations cost the machine: client, servers and kernel together.
func MachineCPU() (time.Duration, bool) {
	b, err := os.ReadFile("/proc/stat")
	if err != nil {
		return 0, false
	}
	line, _, _ := strings.Cut(string(b), "\n")
	f := strings.Fields(line)
	if len(f) < 5 || f[0] != "cpu" {
		return 0, false
	}
	var busy int64
	for i, s := range f[1:] {
		v, err := strconv.ParseInt(s, 10, 64)
		if err != nil {
			return 0, false
		}
		if i != 3 && i != 4 { // idle, iowait
			busy += v
		}
	}
	// The kernel counts in USER_HZ ticks, 100 per second on every Linux platform Go runs on.
	return time.Duration(busy) * 10 * time.Millisecond, true
}
