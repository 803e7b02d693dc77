package redlock

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/dlockio/dlock/driver"
)

// results holds one fan-out's replies, indexed like Backend.nodes.
type results[T any] struct {
	vals []T
	errs []error // nil for a node that answered (or was not asked)
	sent []bool
}

// fanout calls f on the listed nodes in parallel, each bounded by the node timeout,
// and waits for all of them.
func fanout[T any](ctx context.Context, b *Backend, idx []int, f func(context.Context, *node) (T, error)) results[T] {
	r := results[T]{vals: make([]T, len(b.nodes)), errs: make([]error, len(b.nodes)), sent: make([]bool, len(b.nodes))}
	call := func(i int) {
		nctx, cancel := context.WithTimeout(ctx, b.cfg.nodeTimeout)
		r.vals[i], r.errs[i] = f(nctx, b.nodes[i])
		cancel()
	}
	var wg sync.WaitGroup
	for j, i := range idx {
		r.sent[i] = true
		if j == len(idx)-1 {
			call(i) // the last one on this goroutine
			break
		}
		wg.Add(1)
		b.callers.Go(func() {
			defer wg.Done()
			call(i)
		})
	}
	wg.Wait()
	return r
}

// errPending marks, in the results of a fan-out that returned early (see race), a
// node whose reply had not come yet.
var errPending = errors.New("reply still pending")

// flight is the calls of one holder still under way after a fan-out returned early:
// done[i] is closed once node i's call and its late handling are over (nil for a
// node with nothing pending). The next calls for the holder on node i wait for it,
// so that every node runs one holder's scripts in the order they were made (a
// release never overtakes the acquire it undoes). An acquire also waits for the
// releases of the key's other holders through this client (release set): a Lock
// right after another owner's Release here, the usual loop, would otherwise reach
// a slow node before that release did, find the key held there, and hold the lock
// on fewer nodes (and withdraw its place there, a script more).
type flight struct {
	done    []chan struct{}
	release bool
}

// fanoutFor is fanout for the calls of holder h: on each node, it waits for the
// holder's calls still under way there (see flight) before calling; with no owner
// in h, for those of every owner of the key.
func fanoutFor[T any](ctx context.Context, b *Backend, h driver.Holder, idx []int, f func(context.Context, *node) (T, error)) results[T] {
	return race(ctx, b, h, idx, f, nil, nil, callOther)
}

// callKind tells race what its calls are, for the order of calls on each node (see
// flight).
type callKind int

const (
	callOther   callKind = iota
	callAcquire          // waits for the key's releases through this client too
	callRelease          // a release: later acquires of the key wait for it
)

// race is fanoutFor that returns as soon as decided, called after each reply, says
// the replies so far settle the outcome; nodes still to answer then have errs[i] ==
// errPending. Their calls complete in the background (bounded by the node timeout;
// Close waits for them; the caller's cancellation no longer reaches them), late is
// called with each of their replies, and the holder's next calls on those nodes wait
// until then. With decided nil it waits for every reply.
func race[T any](ctx context.Context, b *Backend, h driver.Holder, idx []int, f func(context.Context, *node) (T, error),
	decided func(*results[T]) bool, late func(i int, v T, err error), kind callKind) results[T] {
	prev := b.flightsOf(h, kind == callAcquire)
	if len(prev) == 0 && decided == nil {
		return fanout(ctx, b, idx, f)
	}
	r := results[T]{vals: make([]T, len(b.nodes)), errs: make([]error, len(b.nodes)), sent: make([]bool, len(b.nodes))}
	if err := ctx.Err(); err != nil {
		// A caller already gone: every call fails at once, as fanout's do (the
		// calls below run on a context the caller's cancellation reaches only
		// through AfterFunc, in its own goroutine, after they may have answered).
		for _, i := range idx {
			r.sent[i], r.errs[i] = true, err
		}
		return r
	}
	// One deadline for the round; the caller's cancellation reaches the calls only
	// while the caller waits for them.
	cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), b.cfg.nodeTimeout)
	stop := context.AfterFunc(ctx, cancel)
	type reply struct {
		i   int
		v   T
		err error
	}
	ch := make(chan reply, len(idx))
	for _, i := range idx {
		r.sent[i], r.errs[i] = true, errPending
		b.callers.Go(func() {
			for _, p := range prev {
				if p.done[i] == nil {
					continue
				}
				select {
				case <-p.done[i]:
				case <-cctx.Done():
					var zero T
					ch <- reply{i, zero, cctx.Err()}
					return
				}
			}
			v, err := f(cctx, b.nodes[i])
			ch <- reply{i, v, err}
		})
	}
	for got := 1; got <= len(idx); got++ {
		rp := <-ch
		if rp.err != nil && ctx.Err() != nil {
			rp.err = ctx.Err()
		}
		r.vals[rp.i], r.errs[rp.i] = rp.v, rp.err
		if got < len(idx) && decided != nil && decided(&r) {
			stop()
			fl := &flight{done: make([]chan struct{}, len(b.nodes)), release: kind == callRelease}
			for i, err := range r.errs {
				if err == errPending {
					fl.done[i] = make(chan struct{})
				}
			}
			rest := len(idx) - got
			drain := func() {
				for range rest {
					rp := <-ch
					if late != nil {
						late(rp.i, rp.v, rp.err)
					}
					close(fl.done[rp.i])
				}
				cancel()
				b.mu.Lock()
				if b.flights[h] == fl {
					delete(b.flights, h)
				}
				b.mu.Unlock()
			}
			b.mu.Lock()
			b.flights[h] = fl
			closed := b.closed
			if !closed {
				b.bg.Add(1)
			}
			b.mu.Unlock()
			if closed {
				drain()
			} else {
				go func() {
					defer b.bg.Done()
					drain()
				}()
			}
			return r
		}
	}
	stop()
	cancel()
	return r
}

// flightsOf returns the holder's calls still under way, and with releases those of
// the releases of the key's other holders; for a holder with no owner (force
// release, inspect: calls about the key, whatever its owner), those of every
// holder of the key.
func (b *Backend) flightsOf(h driver.Holder, releases bool) []*flight {
	b.mu.Lock()
	defer b.mu.Unlock()
	var fs []*flight
	if h.Owner != "" {
		if f := b.flights[h]; f != nil {
			fs = append(fs, f)
		}
		if !releases {
			return fs
		}
	}
	for k, f := range b.flights {
		if k.Key == h.Key && k != h && (h.Owner == "" || f.release) {
			fs = append(fs, f)
		}
	}
	return fs
}

// all returns the indexes of every node.
func (b *Backend) all() []int {
	s := make([]int, len(b.nodes))
	for i := range s {
		s[i] = i
	}
	return s
}

// nodeErrors joins the errors of a fan-out as *NodeError values, or returns nil.
func (b *Backend) nodeErrors(errs []error) error {
	var joined []error
	for i, err := range errs {
		if err != nil {
			joined = append(joined, &NodeError{Addr: b.nodes[i].addr, Err: err})
		}
	}
	return driver.Join(joined...)
}

// ms is d in whole milliseconds, rounded up, at least 1.
func ms(d time.Duration) int64 { return max(int64((d+time.Millisecond-1)/time.Millisecond), 1) }

// validity is how long a grant or renewal made at start stays trustworthy.
func (b *Backend) validity(ttl time.Duration, start time.Time) time.Duration {
	return ttl - time.Since(start) - (time.Duration(float64(ttl)*b.cfg.drift) + b.cfg.driftFixed)
}

// usedUp is the note of a QuorumError whose majority came too late.
func usedUp(start time.Time) string {
	return fmt.Sprintf("but the validity was used up (%v elapsed)", time.Since(start).Round(time.Microsecond))
}
