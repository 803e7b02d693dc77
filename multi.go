package dlock

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/dlockio/dlock/driver"
)

// MaxKeys bounds how many keys one LockAll or TryLockAll call may take.
const MaxKeys = 64

// LockAll acquires every key of keys, all or nothing, waiting until it has them or
// ctx ends, and returns one lease for the set. Whatever order callers list the keys
// in, they cannot deadlock one another: the keys are taken in ascending byte order.
//
// On a backend that takes several keys in one atomic step (see
// driver.MultiAcquirer: Redis, etcd, ZooKeeper, PostgreSQL, memlock), a free set is
// taken in one request and nobody sees part of it held. Otherwise, and when the set
// is not free, the keys are taken one at a time in that order, waiting for each in
// its queue like Lock; a call that fails or gives up releases what it took before
// it returns, so a set is never left half held.
//
// Options apply to every key (WithShared takes every key shared, WithLimit makes
// each a semaphore). With a stable owner id (WithOwner) the keys are taken one at a
// time, each re-entering a grant the id holds in this Client as Lock would.
// Duplicate keys count once; an empty set, or more than MaxKeys keys, is ErrInvalid.
// When ctx ends first, the error matches both ErrLocked and ctx.Err().
func (c *Client) LockAll(ctx context.Context, keys []string, opts ...Option) (*MultiLease, error) {
	return c.lockAll(ctx, keys, opts, true)
}

// TryLockAll makes one attempt at every key of keys, all or nothing: if any is held
// it returns an error matching ErrLocked that names that key, and holds none of
// them. See LockAll.
func (c *Client) TryLockAll(ctx context.Context, keys []string, opts ...Option) (*MultiLease, error) {
	return c.lockAll(ctx, keys, opts, false)
}

// DoAll acquires every key of keys (waiting, like LockAll), runs fn with a context
// that is cancelled when ctx ends or any key's grant may be lost, and releases the
// set. If a grant was lost while fn ran, the error matches ErrLeaseLost even when fn
// returned nil. The set is released even if fn panics (the panic then continues).
func (c *Client) DoAll(ctx context.Context, keys []string, fn func(ctx context.Context, m *MultiLease) error, opts ...Option) (err error) {
	m, err := c.LockAll(ctx, keys, opts...)
	if err != nil {
		return err
	}
	defer func() {
		rctx, rcancel := context.WithTimeout(context.WithoutCancel(ctx), m.TTL())
		defer rcancel()
		err = driver.Join(err, m.Release(rctx))
	}()
	fctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	stop := context.AfterFunc(m.Context(), func() { cancel(context.Cause(m.Context())) })
	defer stop()
	return fn(fctx, m)
}

// lockAll is LockAll and TryLockAll.
func (c *Client) lockAll(ctx context.Context, keys []string, opts []Option, wait bool) (*MultiLease, error) {
	keys, err := sortedKeys(keys)
	if err != nil {
		return nil, err
	}
	cfg, err := c.callConfig(keys[0], opts)
	if err != nil {
		return nil, err
	}
	owner := cfg.owner
	generated := owner == ""
	if generated {
		owner = c.newOwner()
	}
	if multi, ok := atomicSets(c.b, keys); ok && generated &&
		max(cfg.limit, 1) == 1 && !cfg.shared && len(cfg.value) == 0 {
		m, err := c.acquireAll(ctx, multi, keys, owner, cfg)
		if err == nil || !wait || !errors.Is(err, ErrLocked) {
			return m, err
		}
		// Some key is taken: wait for each in turn.
	}
	leases := make([]*Lease, 0, len(keys))
	for _, key := range keys {
		l, err := c.lockAs(ctx, key, owner, generated, cfg, wait)
		if err == nil && len(leases) > 0 {
			// An earlier key may have been lost while this one was awaited.
			for _, x := range leases {
				if cause := x.Err(); cause != nil {
					err = fmt.Errorf("dlock: %q, taken before %q, ended while that was awaited: %w", x.Key(), key, cause)
					leases = append(leases, l)
					break
				}
			}
		} else if err != nil && len(keys) > 1 {
			err = fmt.Errorf("dlock: key %q of %d: %w", key, len(keys), err)
		}
		if err != nil {
			c.giveBack(ctx, leases)
			return nil, err
		}
		leases = append(leases, l)
	}
	return newMultiLease(keys, owner, leases), nil
}

// atomicSets returns b as a driver.MultiAcquirer if it can take keys (sorted,
// distinct) in one step.
func atomicSets(b driver.Backend, keys []string) (driver.MultiAcquirer, bool) {
	multi, ok := b.(driver.MultiAcquirer)
	if !ok || len(keys) < 2 {
		return nil, false
	}
	if sc, ok := b.(driver.SetChecker); ok && !sc.AtomicSet(keys) {
		return nil, false
	}
	return multi, true
}

// sortedKeys validates keys and returns them sorted, without duplicates, in a slice
// of its own.
func sortedKeys(keys []string) ([]string, error) {
	if len(keys) == 0 {
		return nil, invalid("no keys to lock")
	}
	for _, k := range keys {
		if err := driver.ValidateKey(k); err != nil {
			return nil, err
		}
	}
	keys = slices.Clone(keys)
	slices.Sort(keys)
	keys = slices.Compact(keys)
	if len(keys) > MaxKeys {
		return nil, invalid("%d keys in one lock; the limit is %d", len(keys), MaxKeys)
	}
	return keys, nil
}

// giveBack releases the leases of a multi-key call that failed, even if ctx has
// ended.
func (c *Client) giveBack(ctx context.Context, leases []*Lease) {
	if len(leases) == 0 {
		return
	}
	rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), maxReleaseInClose)
	defer cancel()
	releaseAll(rctx, leases)
}

// releaseAll releases leases at once and returns their errors.
func releaseAll(ctx context.Context, leases []*Lease) []error {
	errs := make([]error, len(leases))
	var wg sync.WaitGroup
	for i, l := range leases[1:] {
		wg.Go(func() { errs[i+1] = l.Release(ctx) })
	}
	errs[0] = leases[0].Release(ctx)
	wg.Wait()
	return errs
}

// acquireAll makes the one atomic attempt at keys (sorted, at least two) for a
// generated owner id. Each key counts as a lock call of its own for the observer.
func (c *Client) acquireAll(ctx context.Context, multi driver.MultiAcquirer, keys []string, owner string, cfg *config) (m *MultiLease, err error) {
	ids := make([]uint64, len(keys))
	if c.obs != nil {
		begun := cfg.clock.Now()
		for i, k := range keys {
			ids[i] = calls.Add(1)
			c.event(ctx, EventRequested, ids[i], 0, k, owner, cfg, 0, 0, nil)
		}
		defer func() {
			took := cfg.clock.Now().Sub(begun)
			for i, k := range keys {
				if err != nil {
					c.event(ctx, EventFailed, ids[i], 0, k, owner, cfg, 0, took, err)
				} else {
					c.event(ctx, EventGranted, ids[i], ids[i], k, owner, cfg, m.leases[i].Token(), took, nil)
				}
			}
		}()
	}
	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		return nil, ErrClosed
	}
	c.wg.Add(1)
	c.mu.Unlock()
	defer c.wg.Done()

	reqs := make([]driver.Request, len(keys))
	for i, k := range keys {
		reqs[i] = driver.Request{Key: k, Owner: owner, TTL: cfg.ttl}
	}
	clk := cfg.clock
	sent := clk.Now()
	grs, err := multi.AcquireAll(ctx, reqs)
	if err == nil && len(grs) != len(keys) {
		err = fmt.Errorf("dlock: backend returned %d grants for %d keys", len(grs), len(keys))
	}
	giveUp := func(err error) (*MultiLease, error) {
		for _, k := range keys {
			c.releaseAsync(k, owner) // the owner id is this call's alone
		}
		return nil, err
	}
	switch {
	case errors.Is(err, ErrLocked):
		return nil, err
	case err != nil && ended(ctx) && !errors.Is(err, ctx.Err()):
		return giveUp(driver.Join(err, context.Cause(ctx)))
	case err != nil:
		return giveUp(err)
	}
	now := clk.Now()
	gs := make([]*grant, len(keys))
	for i, k := range keys {
		deadline, cut := c.bound(k, owner, sent.Add(cfg.validity()), now)
		if !deadline.After(now) {
			return giveUp(fmt.Errorf("%w: %d keys granted %v after the attempt was sent, the lease validity is %v (TTL %v); raise the TTL",
				ErrValidityTooShort, len(keys), now.Sub(sent).Round(time.Microsecond), cfg.validity(), cfg.ttl))
		}
		gs[i] = newGrant(k, owner, cfg, grs[i], sent, deadline, cut)
		gs[i].call = ids[i]
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		return giveUp(ErrClosed)
	}
	leases := make([]*Lease, len(keys))
	for i, g := range gs {
		s := &slot{mapped: true, g: g}
		c.slots[slotKey{g.key, owner}] = s
		g.slot = s
		g.start(c, now)
		leases[i] = g.newLease()
	}
	return newMultiLease(keys, owner, leases), nil
}

// MultiLease is a lock held on a set of keys (LockAll, TryLockAll): one owner id,
// one lease for the set, a fencing token per key. Each key's grant is renewed in
// the background like any lease's; the set's context is cancelled, and Done closed,
// the moment any of them may be lost (cause ErrLeaseLost) or when the set is
// released (cause ErrReleased). Guard each resource with the token of the key that
// protects it (Token). It is safe for concurrent use.
type MultiLease struct {
	keys   []string
	owner  string
	leases []*Lease // by keys

	rmu sync.Mutex // serialises Release
	mu  sync.Mutex // guards ctx
	ctx *cancelCtx
}

func newMultiLease(keys []string, owner string, leases []*Lease) *MultiLease {
	return &MultiLease{keys: keys, owner: owner, leases: leases}
}

// Keys returns the set's keys in ascending order, without duplicates.
func (m *MultiLease) Keys() []string { return slices.Clone(m.keys) }

// Owner returns the owner id that holds every key of the set.
func (m *MultiLease) Owner() string { return m.owner }

// Token returns the fencing token of key's grant: 0 if key is not in the set or the
// backend cannot fence. Tokens of different keys are not comparable.
func (m *MultiLease) Token(key string) Token {
	if i, ok := slices.BinarySearch(m.keys, key); ok {
		return m.leases[i].Token()
	}
	return 0
}

// Tokens returns the fencing tokens in the order of Keys.
func (m *MultiLease) Tokens() []Token {
	t := make([]Token, len(m.leases))
	for i, l := range m.leases {
		t[i] = l.Token()
	}
	return t
}

// TTL returns the time to live on the server of each key's grant.
func (m *MultiLease) TTL() time.Duration { return m.leases[0].TTL() }

// Expiry returns the earliest local validity deadline among the keys' grants.
func (m *MultiLease) Expiry() time.Time {
	e := m.leases[0].Expiry()
	for _, l := range m.leases[1:] {
		if x := l.Expiry(); x.Before(e) {
			e = x
		}
	}
	return e
}

// Context returns a context that is cancelled when any key's grant ends;
// context.Cause tells why (an error matching ErrLeaseLost or ErrReleased). Do the
// work that needs the set under this context.
func (m *MultiLease) Context() context.Context {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.ctx == nil {
		m.ctx = newCancelCtx(context.Background())
		for _, l := range m.leases {
			lctx := l.Context()
			context.AfterFunc(lctx, func() { m.ctx.cancel(context.Cause(lctx)) })
		}
		// AfterFunc runs its function in a goroutine of its own: a set that has
		// ended already is cancelled now, not a moment later.
		if err := m.Err(); err != nil {
			m.ctx.cancel(err)
		}
	}
	return m.ctx.ctx
}

// ended cancels the set's context, if it was made, with the cause of its end,
// before Release returns (the leases' own cancellations reach it asynchronously).
func (m *MultiLease) ended() {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.ctx != nil {
		if err := m.Err(); err != nil {
			m.ctx.cancel(err)
		}
	}
}

// Done is closed when the set's lease ends.
func (m *MultiLease) Done() <-chan struct{} { return m.Context().Done() }

// Err returns nil while every key is held; else an error matching ErrLeaseLost if
// any grant may have been lost, or ErrReleased.
func (m *MultiLease) Err() error {
	var first error
	for _, l := range m.leases {
		if err := l.Err(); errors.Is(err, ErrLeaseLost) {
			return err
		} else if first == nil {
			first = err
		}
	}
	return first
}

// Release gives back every key of the set at once. It returns nil on success; an
// error matching ErrLeaseLost if any grant had been lost (work done under the set
// may have overlapped another holder's); ErrReleased if called again after every key
// was given back. Keys it could not give back (ctx ended while it waited for a lock
// call of the same owner) are given back by calling it again.
func (m *MultiLease) Release(ctx context.Context) error {
	m.rmu.Lock()
	defer m.rmu.Unlock()
	var left []*Lease
	for _, l := range m.leases {
		if !l.done() {
			left = append(left, l)
		}
	}
	if len(left) == 0 {
		return ErrReleased
	}
	errs := releaseAll(ctx, left)
	m.ended()
	for i, err := range errs {
		if errors.Is(err, ErrLeaseLost) {
			// Lost says more than any other error: the set was not held throughout.
			errs[0], errs[i] = err, errs[0]
		}
	}
	return driver.Join(errs...)
}
