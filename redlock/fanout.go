package redlock

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"
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
		wg.Go(func() { call(i) })
	}
	wg.Wait()
	return r
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
	return errors.Join(joined...)
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
