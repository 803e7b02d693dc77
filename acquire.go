package dlock

import (
	"context"
	"fmt"
	"time"

	"github.com/dlockio/dlock/driver"
)

type slotKey struct{ key, owner string }

// slot serialises the server-side work of one (key, owner): acquiring, and releasing
// the last reference. Re-entry into a live grant needs only Client.mu. Its fields are
// guarded by Client.mu.
type slot struct {
	busy   bool            // someone is talking to the server for this (key, owner)
	mapped bool            // it is Client.slots' entry for its (key, owner)
	queue  []chan struct{} // callers waiting for busy to clear, oldest first
	g      *grant          // the live grant, or nil
	users  int             // lock calls inside acquire
}

// enterLocked makes the caller the slot's only user of the server, waiting, if it
// must, until ctx or stop ends (then it returns false). It is called with Client.mu
// held and returns with Client.mu held; waited reports whether it let go of it.
func (c *Client) enterLocked(ctx context.Context, s *slot, stop <-chan struct{}) (ok, waited bool) {
	if !s.busy {
		s.busy = true
		return true, false
	}
	ch := make(chan struct{})
	s.queue = append(s.queue, ch)
	c.mu.Unlock()
	select {
	case <-ch:
		c.mu.Lock()
		return true, true
	case <-ctx.Done():
	case <-stop:
	}
	c.mu.Lock()
	for i, q := range s.queue {
		if q == ch {
			s.queue = append(s.queue[:i], s.queue[i+1:]...)
			return false, true
		}
	}
	// The slot was passed to us as we gave up: pass it on.
	c.leaveLocked(s)
	return false, true
}

// leaveLocked passes the slot to the next waiting caller, or frees it.
func (c *Client) leaveLocked(s *slot) {
	if len(s.queue) > 0 {
		ch := s.queue[0]
		s.queue = s.queue[1:]
		close(ch)
		return
	}
	s.busy = false
}

// lock is Lock and TryLock: it validates key, re-enters a live grant of the same
// (key, owner) in this client, or becomes the one call of that (key, owner) that
// talks to the server and obtains a grant.
func (c *Client) lock(ctx context.Context, key string, opts []Option, wait bool) (*Lease, error) {
	if err := driver.ValidateKey(key); err != nil {
		return nil, err
	}
	cfg, err := c.callConfig(key, opts)
	if err != nil {
		return nil, err
	}
	owner := cfg.owner
	generated := owner == ""
	if generated {
		owner = c.newOwner()
	}
	return c.lockAs(ctx, key, owner, generated, cfg, wait)
}

// callConfig returns the configuration of a lock call on key (the client's, shared,
// when the call has no options), or an error if the backend lacks what it asks for.
func (c *Client) callConfig(key string, opts []Option) (*config, error) {
	cfg := &c.cfg
	if len(opts) > 0 {
		own := c.cfg
		own.perLock = true
		var err error
		if own, err = own.with(opts); err != nil {
			return nil, err
		}
		cfg = &own
	}
	if len(cfg.value) > 0 && c.valuer == nil {
		return nil, unsupported("lock with a value", key)
	}
	if cfg.limit > 1 && c.sem == nil {
		return nil, unsupported("lock with a holder limit above 1", key)
	}
	if cfg.shared && !c.shares {
		return nil, unsupported("shared lock", key)
	}
	return cfg, nil
}

// lockAs is lock for a valid key and an owner id; generated says the id was made for
// this call alone. It reports the call's events to the client's observer.
func (c *Client) lockAs(ctx context.Context, key, owner string, generated bool, cfg *config, wait bool) (*Lease, error) {
	if c.obs == nil {
		return c.lockSlot(ctx, key, owner, generated, cfg, wait, 0)
	}
	call := calls.Add(1)
	begun := cfg.clock.Now()
	c.event(ctx, EventRequested, call, 0, key, owner, cfg, 0, 0, nil)
	l, err := c.lockSlot(ctx, key, owner, generated, cfg, wait, call)
	took := cfg.clock.Now().Sub(begun)
	switch {
	case err != nil:
		c.event(ctx, EventFailed, call, 0, key, owner, cfg, 0, took, err)
	case l.g.call != call:
		c.event(ctx, EventReentered, call, l.g.call, key, owner, cfg, l.Token(), took, nil)
	default:
		c.event(ctx, EventGranted, call, call, key, owner, cfg, l.Token(), took, nil)
	}
	return l, err
}

// lockSlot is lockAs without the call's events; call numbers the grant it makes.
func (c *Client) lockSlot(ctx context.Context, key, owner string, generated bool, cfg *config, wait bool, call uint64) (*Lease, error) {
	sk := slotKey{key, owner}

	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		return nil, ErrClosed
	}
	var s *slot
	if !generated { // a fresh random owner has no slot yet
		s = c.slots[sk]
	}
	if s == nil {
		s = &slot{mapped: true}
		c.slots[sk] = s
	}
	if err := modeCheckLocked(s, key, cfg); err != nil {
		c.dropLocked(sk, s)
		c.mu.Unlock()
		return nil, err
	}
	if l := c.reenterLocked(s); l != nil {
		c.mu.Unlock()
		return l, nil
	}
	s.users++
	ok, waited := c.enterLocked(ctx, s, c.closing)
	if !ok {
		s.users--
		c.dropLocked(sk, s)
		c.mu.Unlock()
		if ctx.Err() == nil {
			return nil, ErrClosed
		}
		return nil, ctxErr(ctx, wait)
	}
	if waited {
		// Another call of the same owner may have acquired meanwhile.
		if err := modeCheckLocked(s, key, cfg); err != nil {
			s.users--
			c.leaveLocked(s)
			c.dropLocked(sk, s)
			c.mu.Unlock()
			return nil, err
		}
		if l := c.reenterLocked(s); l != nil {
			s.users--
			c.leaveLocked(s)
			c.mu.Unlock()
			return l, nil
		}
	}
	c.wg.Add(1)
	c.mu.Unlock()

	g, now, err := c.obtain(ctx, key, owner, cfg, wait, generated, call)
	if g != nil {
		g.call = call
	}

	c.mu.Lock()
	l, err := c.settleLocked(sk, s, g, now, err)
	c.mu.Unlock()
	c.wg.Done()
	return l, err
}

// settleLocked ends a lock call's acquisition on slot s of sk: it hands the slot on
// and returns a lease on g, or err, or ErrClosed (giving g back) if Close ran
// meanwhile. Called with Client.mu held; not deferred, which on this path costs more
// than the call.
func (c *Client) settleLocked(sk slotKey, s *slot, g *grant, now time.Time, err error) (*Lease, error) {
	s.users--
	c.leaveLocked(s)
	if err != nil {
		c.dropLocked(sk, s)
		return nil, err
	}
	if c.closed {
		// Close ran while we were acquiring: give the grant back.
		c.dropLocked(sk, s)
		c.releaseAsync(sk.key, sk.owner)
		return nil, ErrClosed
	}
	g.slot = s
	s.g = g
	g.start(c, now)
	return g.newLease(), nil
}

// modeCheckLocked refuses a lock call that would re-enter the slot's live grant
// the other way (shared for exclusive or the reverse), or with another holder
// limit, as the server would refuse it.
func modeCheckLocked(s *slot, key string, cfg *config) error {
	if s.g == nil || s.g.ended() {
		return nil
	}
	if held, asked := max(s.g.cfg.limit, 1), max(cfg.limit, 1); held != asked {
		return fmt.Errorf("dlock: %q: %w: this owner id holds it with limit %d, the call asked for %d", key, ErrLimitMismatch, held, asked)
	}
	if s.g.cfg.shared == cfg.shared {
		return nil
	}
	how := map[bool]string{true: "shared", false: "exclusively"}
	return invalid("%q is held %s by this owner id; release it before taking it %s (no upgrade or downgrade)", key, how[s.g.cfg.shared], how[cfg.shared])
}

// reenterLocked returns a new lease on the slot's live grant, or nil.
func (c *Client) reenterLocked(s *slot) *Lease {
	if s.g == nil || s.g.ended() {
		return nil
	}
	return s.g.newLease()
}

func (c *Client) dropLocked(sk slotKey, s *slot) {
	if s.users == 0 && s.g == nil && !s.busy && s.mapped {
		delete(c.slots, sk)
		s.mapped = false
	}
}
