// Package memlock is the in-process reference backend (URL scheme mem://NAME).
//
// It keeps the same semantics as the network backends, in memory: leases with a TTL
// on an injectable clock, fencing tokens that rise by one per grant of a key, owner
// checks on refresh and release, re-entry by owner only when the request says so
// (driver.Request.Reenter), and a FIFO queue of waiters to
// which a release hands the key directly, one at a time (no herd, no polling; see
// driver.Waiter). It exists for unit tests of the core (with a fake clock), for tests
// of programs that use dlock, and as the executable statement of what every backend
// should do.
//
// A grant carries the value of its request (driver.Valuer), kept with a queued place
// until the key is handed to it, and every change of a key's holder or value is
// signalled to the key's holder watches (driver.HolderWatcher): a grant, a release,
// a handoff, a force release, a SetValue, and an expiry when the store notices it
// (at the next request for the key, or through Expire).
//
// A key may admit several holders (driver.Semaphorer, dlock.WithLimit): the first
// N owners in FIFO order hold it, each with its own grant and token from the key's
// one sequence, and a release hands the freed permit to the first queued place.
// A key may be read-write locked (driver.Sharer, dlock.WithShared): readers hold
// together, a writer alone, in queue order, so a reader does not pass a queued
// writer. A set of free keys is taken in one step (driver.MultiAcquirer,
// dlock.Client.LockAll).
//
// Safety model: exact within one process and nothing more. All Backends of one Store
// share its state; clients opened with the same mem://NAME share the store NAME. A
// process crash loses every lock and the token counters (tokens restart at 1).
package memlock

import (
	"bytes"
	"context"
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/dlockio/dlock/clock"
	"github.com/dlockio/dlock/driver"
)

// Store is the shared lock state. It is safe for concurrent use.
type Store struct {
	clk clock.Clock

	mu       sync.Mutex
	locks    map[string][]*entry // a key's holders, the oldest grant first
	limits   map[string]int      // a key's holder limit while it has holders or places
	counters map[string]uint64   // last token per key; never reset
	queues   map[string][]place
	watchers map[driver.Holder]*waiter
	holders  map[string]map[*holderWatch]struct{} // holder watches by key
}

type entry struct {
	owner   string
	token   uint64
	expires time.Time
	value   []byte
	shared  bool // a reader of a read-write lock
	// handedTo is the waiter a release handed the permit to, until the owner
	// re-enters it with an attempt of its own; that waiter's Stop without
	// acquiring passes the permit on.
	handedTo *waiter
}

type place struct {
	owner    string
	ttl      time.Duration // of the grant if the key is handed to this place
	deadline time.Time     // dropped if no attempt is seen before
	value    []byte        // of the grant if the key is handed to this place
	shared   bool          // a reader's place
}

// NewStore returns an empty store whose TTLs run on clk.
func NewStore(clk clock.Clock) *Store {
	return &Store{
		clk:      clk,
		locks:    make(map[string][]*entry),
		limits:   make(map[string]int),
		counters: make(map[string]uint64),
		queues:   make(map[string][]place),
		watchers: make(map[driver.Holder]*waiter),
		holders:  make(map[string]map[*holderWatch]struct{}),
	}
}

// Backend returns a new connection to the store.
func (s *Store) Backend() *Backend { return &Backend{s: s} }

// Expire drops key's current grants as if their TTL had run out (a test hook for a
// crashed holder or a server that lost the key).
func (s *Store) Expire(key string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if len(s.locks[key]) > 0 {
		delete(s.locks, key)
		s.changedLocked(key)
		s.tidyLocked(key)
	}
}

// Waiters returns the number of queued places for key (a test hook).
func (s *Store) Waiters(key string) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.pruneLocked(key, s.clk.Now())
	return len(s.queues[key])
}

// liveLocked returns key's live holders, dropping expired grants.
func (s *Store) liveLocked(key string, now time.Time) []*entry {
	hs := s.locks[key]
	n := 0
	for _, e := range hs {
		if now.Before(e.expires) {
			hs[n] = e
			n++
		}
	}
	if n == len(hs) {
		return hs
	}
	clear(hs[n:])
	if n == 0 {
		delete(s.locks, key)
		hs = nil
	} else {
		s.locks[key] = hs[:n]
		hs = hs[:n]
	}
	s.changedLocked(key)
	return hs
}

// heldLocked returns owner's live grant of key, or nil.
func (s *Store) heldLocked(key, owner string, now time.Time) *entry {
	for _, e := range s.liveLocked(key, now) {
		if e.owner == owner {
			return e
		}
	}
	return nil
}

// dropLocked removes e from key's holders.
func (s *Store) dropLocked(key string, e *entry) {
	hs := s.locks[key]
	for i, h := range hs {
		if h == e {
			hs = append(hs[:i:i], hs[i+1:]...)
			break
		}
	}
	if len(hs) == 0 {
		delete(s.locks, key)
	} else {
		s.locks[key] = hs
	}
	s.changedLocked(key)
}

// tidyLocked forgets key's limit once it has neither holders nor places.
func (s *Store) tidyLocked(key string) {
	if len(s.locks[key]) == 0 && len(s.queues[key]) == 0 {
		delete(s.limits, key)
	}
}

// changedLocked tells key's holder watches that its holders or values changed.
func (s *Store) changedLocked(key string) {
	for w := range s.holders[key] {
		select {
		case w.c <- struct{}{}:
		default:
		}
	}
}

// pruneLocked drops queued places whose owner has not been seen in time.
func (s *Store) pruneLocked(key string, now time.Time) {
	q := s.queues[key]
	n := 0
	for _, p := range q {
		if now.Before(p.deadline) {
			q[n] = p
			n++
		}
	}
	if n == 0 {
		delete(s.queues, key)
		s.tidyLocked(key)
		return
	}
	s.queues[key] = q[:n]
}

// enqueueLocked keeps req's place in key's queue, or makes one at the end, and
// returns how many places are ahead of it.
func (s *Store) enqueueLocked(key string, req driver.Request, now time.Time) int {
	q := s.queues[key]
	deadline := now.Add(req.Patience)
	for i := range q {
		if q[i].owner == req.Owner {
			q[i].deadline, q[i].ttl, q[i].value, q[i].shared = deadline, req.TTL, clone(req.Value), req.Shared
			return i
		}
	}
	s.queues[key] = append(q, place{req.Owner, req.TTL, deadline, clone(req.Value), req.Shared})
	return len(q)
}

func (s *Store) dequeueLocked(key, owner string) {
	q := s.queues[key]
	for i := range q {
		if q[i].owner == owner {
			s.queues[key] = append(q[:i:i], q[i+1:]...)
			break
		}
	}
	if len(s.queues[key]) == 0 {
		delete(s.queues, key)
	}
}

// grantLocked makes owner a holder of key with a new token.
func (s *Store) grantLocked(key, owner string, ttl time.Duration, value []byte, shared bool, now time.Time) *entry {
	s.counters[key]++
	e := &entry{owner: owner, token: s.counters[key], expires: now.Add(ttl), value: value, shared: shared}
	s.locks[key] = append(s.locks[key], e)
	s.changedLocked(key)
	return e
}

// handOffLocked grants key's free permits to its first queued waiters, if any,
// and wakes each with its grant.
func (s *Store) handOffLocked(key string, now time.Time) {
	s.pruneLocked(key, now)
	for len(s.queues[key]) > 0 && admits(s.liveLocked(key, now), max(s.limits[key], 1), s.queues[key][0].shared) {
		head := s.queues[key][0]
		s.dequeueLocked(key, head.owner)
		e := s.grantLocked(key, head.owner, head.ttl, head.value, head.shared, now)
		if w := s.watchers[driver.Holder{Key: key, Owner: head.owner}]; w != nil {
			e.handedTo = w
			w.handed = &handed{token: e.token, at: now}
			w.wake()
		}
	}
	s.tidyLocked(key)
}

// admits reports whether a key with holders hs and the given limit has room for
// one more holder, shared (a reader) or not, once no place is ahead of it: a
// reader joins readers; a writer or a semaphore's holder needs a free permit
// (with limit 1, no holder at all).
func admits(hs []*entry, limit int, shared bool) bool {
	if shared {
		for _, h := range hs {
			if !h.shared {
				return false
			}
		}
		return true
	}
	return len(hs) < limit && (len(hs) == 0 || !hs[0].shared)
}

// Backend is one connection to a Store. It implements driver.Backend and every
// optional capability of package driver but Bounder.
type Backend struct {
	s *Store

	waiters map[driver.Holder]*waiter // this connection's own; guarded by Store.mu

	mu     sync.Mutex
	closed bool
}

var (
	_ driver.Notifier      = (*Backend)(nil)
	_ driver.Inspector     = (*Backend)(nil)
	_ driver.ForceReleaser = (*Backend)(nil)
	_ driver.Valuer        = (*Backend)(nil)
	_ driver.HolderWatcher = (*Backend)(nil)
	_ driver.Semaphorer    = (*Backend)(nil)
	_ driver.Sharer        = (*Backend)(nil)
	_ driver.MultiAcquirer = (*Backend)(nil)
	_ driver.Queuer        = (*Backend)(nil)
	_ driver.Lister        = (*Backend)(nil)
)

// Store returns the backend's store.
func (b *Backend) Store() *Store { return b.s }

func (b *Backend) check(ctx context.Context) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.closed {
		return driver.ErrClosed
	}
	return nil
}

// Acquire implements driver.Backend.
func (b *Backend) Acquire(ctx context.Context, req driver.Request) (driver.Grant, error) {
	if err := b.check(ctx); err != nil {
		return driver.Grant{}, err
	}
	s := b.s
	s.mu.Lock()
	defer s.mu.Unlock()
	now := s.clk.Now()
	hs := s.liveLocked(req.Key, now)
	s.pruneLocked(req.Key, now)
	var e *entry
	for _, h := range hs {
		if h.owner == req.Owner {
			e = h
		}
	}
	if req.Wait {
		// Only this connection's own waiter: another client of the same owner id
		// must not claim it, and a grant handed to this one stays claimable even
		// if another client's Watch of the same owner id replaced it in the store.
		if w := b.waiters[driver.Holder{Key: req.Key, Owner: req.Owner}]; w != nil && w.handed != nil {
			h := w.handed
			w.handed = nil
			if e != nil && e.token == h.token {
				// Handed over by a release: no new grant, the TTL started then.
				return driver.Grant{Token: e.token, Age: now.Sub(h.at)}, nil
			}
		}
	}
	limit := max(req.Limit, 1)
	if cur, ok := s.limits[req.Key]; ok && cur != limit {
		return driver.Grant{}, fmt.Errorf("memlock: acquire %q: %w: the key admits %d holders, the attempt asked for %d",
			req.Key, driver.ErrLimitMismatch, cur, limit)
	}
	switch {
	case e != nil && req.Reenter:
		e.expires = now.Add(req.TTL)
		e.handedTo = nil
		if !bytes.Equal(e.value, req.Value) {
			e.value = clone(req.Value)
			s.changedLocked(req.Key)
		}
		return driver.Grant{Token: e.token}, nil
	case e != nil:
		// The owner id holds the key, maybe through another client: refused,
		// changing nothing (no TTL, no place; see driver.Request).
		return driver.Grant{}, &driver.HeldError{RetryAfter: e.expires.Sub(now)}
	}
	// A permit is the caller's if one is free for it: the places queued ahead of
	// it take the free permits first. A reader joins readers only with no place
	// ahead of it, so it does not pass a queued writer.
	free, ahead := limit-len(hs), len(s.queues[req.Key])
	for i, p := range s.queues[req.Key] {
		if p.owner == req.Owner {
			ahead = i
		}
	}
	if req.Shared && (ahead > 0 || !admits(hs, limit, true)) || !req.Shared && (ahead >= free || !admits(hs, limit, false)) {
		held := &driver.HeldError{}
		if len(hs) >= limit {
			held.RetryAfter = hs[0].expires.Sub(now)
			for _, h := range hs[1:] {
				held.RetryAfter = min(held.RetryAfter, h.expires.Sub(now))
			}
		}
		if req.Wait {
			s.limits[req.Key] = limit
			held.Ahead, held.Queued = s.enqueueLocked(req.Key, req, now), true
		}
		return driver.Grant{}, held
	}
	s.dequeueLocked(req.Key, req.Owner)
	s.limits[req.Key] = limit
	e = s.grantLocked(req.Key, req.Owner, req.TTL, clone(req.Value), req.Shared, now)
	return driver.Grant{Token: e.token}, nil
}

// AcquireAll grants every key of reqs at once if each is free (no holder, no queued
// place), else none.
func (b *Backend) AcquireAll(ctx context.Context, reqs []driver.Request) ([]driver.Grant, error) {
	if err := b.check(ctx); err != nil {
		return nil, err
	}
	s := b.s
	s.mu.Lock()
	defer s.mu.Unlock()
	now := s.clk.Now()
	for _, req := range reqs {
		hs := s.liveLocked(req.Key, now)
		s.pruneLocked(req.Key, now)
		if len(hs) == 0 && len(s.queues[req.Key]) == 0 {
			continue
		}
		held := &driver.HeldError{}
		for i, h := range hs {
			if d := h.expires.Sub(now); i == 0 || d < held.RetryAfter {
				held.RetryAfter = d
			}
		}
		return nil, fmt.Errorf("memlock: %q: %w", req.Key, held)
	}
	gs := make([]driver.Grant, len(reqs))
	for i, req := range reqs {
		s.limits[req.Key] = 1
		gs[i].Token = s.grantLocked(req.Key, req.Owner, req.TTL, nil, false, now).token
	}
	return gs, nil
}

// Refresh implements driver.Backend.
func (b *Backend) Refresh(ctx context.Context, key, owner string, ttl time.Duration) error {
	if err := b.check(ctx); err != nil {
		return err
	}
	s := b.s
	s.mu.Lock()
	defer s.mu.Unlock()
	now := s.clk.Now()
	e := s.heldLocked(key, owner, now)
	if e == nil {
		s.handOffLocked(key, now) // an expiry found on the way frees permits
		return driver.ErrNotHeld
	}
	e.expires = now.Add(ttl)
	return nil
}

// Release implements driver.Backend.
func (b *Backend) Release(ctx context.Context, key, owner string) error {
	if err := b.check(ctx); err != nil {
		return err
	}
	s := b.s
	s.mu.Lock()
	defer s.mu.Unlock()
	now := s.clk.Now()
	e := s.heldLocked(key, owner, now)
	if e == nil {
		s.handOffLocked(key, now)
		return driver.ErrNotHeld
	}
	s.dropLocked(key, e)
	s.handOffLocked(key, now)
	return nil
}

// Close implements driver.Backend. Grants stay until they expire.
func (b *Backend) Close() error {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.closed = true
	return nil
}

// Watch implements driver.Notifier.
func (b *Backend) Watch(ctx context.Context, key, owner string) (driver.Waiter, error) {
	if err := b.check(ctx); err != nil {
		return nil, err
	}
	w := &waiter{s: b.s, b: b, key: key, owner: owner, c: make(chan struct{}, 1)}
	b.s.mu.Lock()
	b.s.watchers[driver.Holder{Key: key, Owner: owner}] = w
	if b.waiters == nil {
		b.waiters = make(map[driver.Holder]*waiter)
	}
	b.waiters[driver.Holder{Key: key, Owner: owner}] = w
	b.s.mu.Unlock()
	return w, nil
}

type waiter struct {
	s          *Store
	b          *Backend // whose Watch made it
	key, owner string
	c          chan struct{}
	handed     *handed // guarded by Store.mu
}

// handed is a grant a release made to a waiter, not yet returned by its Acquire.
type handed struct {
	token uint64
	at    time.Time // when the grant's TTL started
}

func (w *waiter) C() <-chan struct{} { return w.c }

func (w *waiter) wake() {
	select {
	case w.c <- struct{}{}:
	default:
	}
}

func (w *waiter) Stop(_ context.Context, acquired bool) error {
	s := w.s
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.watchers[driver.Holder{Key: w.key, Owner: w.owner}] == w {
		delete(s.watchers, driver.Holder{Key: w.key, Owner: w.owner})
	}
	if w.b.waiters[driver.Holder{Key: w.key, Owner: w.owner}] == w {
		delete(w.b.waiters, driver.Holder{Key: w.key, Owner: w.owner})
	}
	if !acquired {
		s.dequeueLocked(w.key, w.owner)
		now := s.clk.Now()
		if e := s.heldLocked(w.key, w.owner, now); e != nil && e.handedTo == w {
			// Handed to this waiter, which gives up: pass it on.
			s.dropLocked(w.key, e)
		}
		s.handOffLocked(w.key, now)
	}
	return nil
}

// Inspect implements driver.Inspector.
func (b *Backend) Inspect(ctx context.Context, key string) (driver.Info, error) {
	if err := b.check(ctx); err != nil {
		return driver.Info{}, err
	}
	s := b.s
	s.mu.Lock()
	defer s.mu.Unlock()
	now := s.clk.Now()
	hs := s.liveLocked(key, now)
	if len(hs) == 0 {
		return driver.Info{}, driver.ErrNotHeld
	}
	s.pruneLocked(key, now)
	return s.infoLocked(key, hs[0], now), nil
}

func (s *Store) infoLocked(key string, e *entry, now time.Time) driver.Info {
	return driver.Info{Key: key, Owner: e.owner, Token: e.token, TTL: e.expires.Sub(now), Waiters: len(s.queues[key]), Value: clone(e.value), Shared: e.shared}
}

// List implements driver.Lister.
func (b *Backend) List(ctx context.Context, prefix string) ([]driver.Info, error) {
	if err := b.check(ctx); err != nil {
		return nil, err
	}
	s := b.s
	s.mu.Lock()
	defer s.mu.Unlock()
	now := s.clk.Now()
	var keys []string
	for k := range s.locks {
		if strings.HasPrefix(k, prefix) {
			keys = append(keys, k)
		}
	}
	slices.Sort(keys)
	var infos []driver.Info
	for _, k := range keys {
		s.pruneLocked(k, now)
		for _, e := range s.liveLocked(k, now) {
			infos = append(infos, s.infoLocked(k, e, now))
		}
	}
	return infos, nil
}

// Queue implements driver.Queuer.
func (b *Backend) Queue(ctx context.Context, key string) ([]driver.Info, error) {
	if err := b.check(ctx); err != nil {
		return nil, err
	}
	s := b.s
	s.mu.Lock()
	defer s.mu.Unlock()
	now := s.clk.Now()
	s.pruneLocked(key, now)
	q := s.queues[key]
	places := make([]driver.Info, len(q))
	for i, p := range q {
		places[i] = driver.Info{Key: key, Owner: p.owner, TTL: p.deadline.Sub(now), Waiters: -1, Value: clone(p.value), Shared: p.shared}
	}
	return places, nil
}

// Holders implements driver.Semaphorer.
func (b *Backend) Holders(ctx context.Context, key string) (int, []driver.Info, error) {
	if err := b.check(ctx); err != nil {
		return 0, nil, err
	}
	s := b.s
	s.mu.Lock()
	defer s.mu.Unlock()
	now := s.clk.Now()
	hs := s.liveLocked(key, now)
	s.pruneLocked(key, now)
	if len(hs) == 0 {
		return 0, nil, nil
	}
	infos := make([]driver.Info, len(hs))
	for i, e := range hs {
		infos[i] = s.infoLocked(key, e, now)
	}
	return max(s.limits[key], 1), infos, nil
}

// ForceRelease implements driver.ForceReleaser.
func (b *Backend) ForceRelease(ctx context.Context, key string) error {
	if err := b.check(ctx); err != nil {
		return err
	}
	s := b.s
	s.mu.Lock()
	defer s.mu.Unlock()
	now := s.clk.Now()
	if len(s.liveLocked(key, now)) == 0 {
		return driver.ErrNotHeld
	}
	delete(s.locks, key)
	s.changedLocked(key)
	s.handOffLocked(key, now)
	return nil
}

// SetValue implements driver.Valuer.
func (b *Backend) SetValue(ctx context.Context, key, owner string, value []byte) error {
	if err := b.check(ctx); err != nil {
		return err
	}
	s := b.s
	s.mu.Lock()
	defer s.mu.Unlock()
	e := s.heldLocked(key, owner, s.clk.Now())
	if e == nil {
		return driver.ErrNotHeld
	}
	e.value = clone(value)
	s.changedLocked(key)
	return nil
}

// WatchHolder implements driver.HolderWatcher.
func (b *Backend) WatchHolder(ctx context.Context, key string) (driver.HolderWatch, error) {
	if err := b.check(ctx); err != nil {
		return nil, err
	}
	w := &holderWatch{s: b.s, key: key, c: make(chan struct{}, 1)}
	s := b.s
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.holders[key] == nil {
		s.holders[key] = make(map[*holderWatch]struct{})
	}
	s.holders[key][w] = struct{}{}
	return w, nil
}

type holderWatch struct {
	s   *Store
	key string
	c   chan struct{}
}

func (w *holderWatch) C() <-chan struct{} { return w.c }

func (w *holderWatch) Stop() {
	s := w.s
	s.mu.Lock()
	defer s.mu.Unlock()
	delete(s.holders[w.key], w)
	if len(s.holders[w.key]) == 0 {
		delete(s.holders, w.key)
	}
}

// clone copies a value; an empty one becomes nil.
func clone(v []byte) []byte {
	if len(v) == 0 {
		return nil
	}
	return bytes.Clone(v)
}

// Shares implements driver.Sharer: memlock honours Request.Shared.
func (b *Backend) Shares() bool { return true }
