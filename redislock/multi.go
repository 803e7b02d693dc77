package redislock

import (
	"context"
	"fmt"
	"slices"
	"time"

	"github.com/dlockio/dlock/driver"
)

var _ driver.MultiAcquirer = (*Backend)(nil)

// AcquireAll implements driver.MultiAcquirer with one script call
// (acquire_all.lua) over the lock keys of the whole set: if every key is free as
// a plain Acquire without Reenter would find it, it grants each as Acquire grants
// a free key (its own token, the TTL, a holder-change message), else it changes
// nothing and returns an error matching driver.ErrLocked that names the first
// taken key. Every request must have the first one's owner and TTL, and be a
// plain exclusive attempt (no Wait, Reenter, value, limit above 1 or Shared), as
// the core makes them.
func (b *Backend) AcquireAll(ctx context.Context, reqs []driver.Request) ([]driver.Grant, error) {
	if b.closed.Load() {
		return nil, driver.ErrClosed
	}
	if len(reqs) == 0 {
		return nil, nil
	}
	owner, ttl := reqs[0].Owner, reqs[0].TTL
	if b.cluster {
		names := make([]string, len(reqs))
		for i, r := range reqs {
			names[i] = r.Key
		}
		if !b.AtomicSet(names) {
			return nil, fmt.Errorf("redislock: acquire %q and %d more keys: %w: keys in several Redis Cluster hash slots", reqs[0].Key, len(reqs)-1, driver.ErrUnsupported)
		}
	}
	keys := make([]string, len(reqs))
	for i, r := range reqs {
		if r.Owner != owner || r.TTL != ttl || r.Wait || r.Reenter || len(r.Value) > 0 || r.Limit > 1 || r.Shared {
			return nil, fmt.Errorf("redislock: acquire %q: %w: a set's requests must be plain ones of one owner and TTL", r.Key, driver.ErrInvalid)
		}
		keys[i] = b.LockKey(r.Key)
	}
	cmd, err := b.runScript(ctx, acquireAllScript, keys, owner, b.ttlBox(ms(ttl)))
	ns, cerr := cmd.Int64Slice()
	if cerr == nil && len(ns) == 3 && ns[0] == 0 && ns[1] >= 1 && ns[1] <= int64(len(reqs)) {
		// Refused, which changed nothing, whatever the replicas say.
		key := reqs[ns[1]-1].Key
		b.hot.Mark(key)
		held := &driver.HeldError{}
		if ns[2] > 0 {
			held.RetryAfter = time.Duration(ns[2]) * time.Millisecond
		}
		return nil, fmt.Errorf("redislock: %q: %w", key, held)
	}
	if err == nil && cerr == nil && (len(ns) != len(reqs) || slices.Min(ns) <= 0) {
		cerr = fmt.Errorf("unexpected reply %v for %d keys", ns, len(reqs))
	}
	if err == nil {
		err = cerr
	}
	if err != nil {
		// The outcome may be unknown (or, with WithReplicas, the set granted but
		// not replicated): the core then releases every key of the set.
		return nil, fmt.Errorf("redislock: acquire %q and %d more keys: %w", reqs[0].Key, len(reqs)-1, err)
	}
	gs := make([]driver.Grant, len(reqs))
	for i, n := range ns {
		gs[i].Token = uint64(n)
	}
	return gs, nil
}
