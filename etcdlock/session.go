package etcdlock

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"time"

	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/dlockio/dlock/driver"
)

// session is one lease kept alive in the background. Member keys of every lock with
// the same TTL (in whole seconds) made by one Backend live on it.
type session struct {
	b    *Backend
	id   clientv3.LeaseID
	secs int64         // the TTL asked for, the key in Backend.sessions
	ttl  time.Duration // the TTL granted
	done chan struct{} // closed when the session ends; Grant.Lost of its grants

	ctx    context.Context // ends with the session; parent of its keep-alive calls
	cancel context.CancelFunc

	mu        sync.Mutex
	ended     bool
	cause     error
	safeUntil time.Time // the server keeps the lease at least until then
}

// margin is how long before the earliest possible server-side expiry the session
// declares itself lost: room for clock rate differences and timer lateness.
func (s *session) margin() time.Duration { return s.ttl/50 + 10*time.Millisecond }

// deadline is when the session counts as lost unless a keep-alive succeeds first.
func (s *session) deadline() time.Time {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.safeUntil.Add(-s.margin())
}

func (s *session) extend(until time.Time) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if until.After(s.safeUntil) {
		s.safeUntil = until
	}
}

func (s *session) isDone() bool {
	select {
	case <-s.done:
		return true
	default:
		return false
	}
}

// end ends the session: its grants are lost, its waiters are woken and give up, and
// its lease is revoked on the server (best effort), now when sync is set, else in
// the background.
func (s *session) end(cause error, sync bool) {
	s.mu.Lock()
	if s.ended {
		s.mu.Unlock()
		return
	}
	s.ended, s.cause = true, cause
	s.mu.Unlock()
	close(s.done)
	s.cancel()

	b := s.b
	b.mu.Lock()
	if b.sessions[s.secs] == s {
		delete(b.sessions, s.secs)
	}
	for k, h := range b.held {
		if h.sess == s {
			h.timer.Stop()
			delete(b.held, k)
			b.freeNameLocked(k)
		}
	}
	async := !sync && !b.closed
	if async {
		b.wg.Add(1)
	}
	waiters := make([]*waiter, 0, len(b.waiters))
	for _, w := range b.waiters {
		waiters = append(waiters, w)
	}
	b.mu.Unlock()
	// Wake every waiter whose place in a queue was on the session, also one whose
	// watch is not running (being set up, or ended by an earlier wake-up): its
	// next attempt fails with ErrSessionLost (see Acquire).
	for _, w := range waiters {
		if w.placedOn(s) {
			w.wake()
		}
	}
	if async {
		go func() {
			defer b.wg.Done()
			s.revoke()
		}()
	} else {
		s.revoke()
	}
}

// revoke deletes the lease and every key on it, so that places in queues and grants
// of a session that ended free up at once rather than at the lease's expiry.
func (s *session) revoke() {
	ctx, cancel := context.WithTimeout(context.Background(), min(s.b.timeout, 2*time.Second))
	defer cancel()
	_, _ = s.b.cli.Revoke(ctx, s.id)
}

// liveSession returns the live session for secs, or nil.
func (b *Backend) liveSession(secs int64) *session {
	b.mu.Lock()
	s := b.sessions[secs]
	b.mu.Unlock()
	if s == nil || s.isDone() {
		return nil
	}
	if !time.Now().Before(s.deadline()) {
		s.end(fmt.Errorf("%w: no keep-alive of lease %x succeeded in time", ErrSessionLost, int64(s.id)), false)
		return nil
	}
	return s
}

// session returns the live session for ttl, granting a lease if there is none.
func (b *Backend) session(ctx context.Context, ttl time.Duration) (*session, error) {
	secs := max(int64((ttl+time.Second-1)/time.Second), 1)
	if s := b.liveSession(secs); s != nil {
		return s, nil
	}
	select {
	case b.grant <- struct{}{}:
	case <-ctx.Done():
		return nil, fmt.Errorf("grant session lease: %w", ctx.Err())
	}
	defer func() { <-b.grant }()
	if s := b.liveSession(secs); s != nil {
		return s, nil
	}
	sent := time.Now()
	resp, err := b.cli.Grant(ctx, secs)
	if err != nil {
		return nil, fmt.Errorf("grant session lease: %w", err)
	}
	sctx, cancel := context.WithCancel(b.ctx)
	s := &session{
		b: b, id: resp.ID, secs: secs, ttl: time.Duration(resp.TTL) * time.Second,
		done: make(chan struct{}), ctx: sctx, cancel: cancel,
	}
	s.safeUntil = sent.Add(s.ttl)
	b.mu.Lock()
	if b.closed {
		b.mu.Unlock()
		s.end(driver.ErrClosed, true)
		return nil, driver.ErrClosed
	}
	b.sessions[secs] = s
	b.wg.Add(1)
	b.mu.Unlock()
	go b.keepAlive(s)
	return s, nil
}

// keepAlive renews the session's lease every TTL/3, one request at a time, timing
// each from the moment it was sent: the server renews the lease when it receives the
// request, so send time + TTL is a lower bound on the new expiry.
func (b *Backend) keepAlive(s *session) {
	defer b.wg.Done()
	interval := max(s.ttl/3, 100*time.Millisecond)
	t := time.NewTimer(interval)
	defer t.Stop()
	var suspects map[string]bool
	renewals := 0
	for {
		select {
		case <-s.ctx.Done():
			return
		case <-t.C:
		}
		deadline := s.deadline()
		if !time.Now().Before(deadline) {
			s.end(fmt.Errorf("%w: no keep-alive of lease %x succeeded in time", ErrSessionLost, int64(s.id)), false)
			return
		}
		ctx, cancel := context.WithDeadline(s.ctx, deadline)
		sent := time.Now()
		resp, err := b.cli.KeepAliveOnce(ctx, s.id)
		cancel()
		switch {
		case err == nil:
			s.extend(sent.Add(time.Duration(resp.TTL) * time.Second))
			if renewals++; renewals%3 == 0 {
				suspects = b.collect(s, suspects)
			}
			t.Reset(interval)
		case errors.Is(err, rpctypes.ErrLeaseNotFound):
			s.end(fmt.Errorf("%w: lease %x expired or was revoked on the server", ErrSessionLost, int64(s.id)), false)
			return
		default:
			if s.ctx.Err() != nil {
				return
			}
			// Retry soon, but wake up at the deadline at the latest.
			t.Reset(max(min(interval/4, 250*time.Millisecond, time.Until(s.deadline())), 0))
		}
	}
}

// collect deletes member keys on session s that nothing in this backend answers for:
// not a grant, not a waiter's place, not an orphan being deleted. Such a key can only
// come from a write applied after its request was given up (a lost reply, retried or
// abandoned); on a session kept alive by this process it would otherwise stay, and
// could block its lock, for as long as the process runs. A key is deleted when two
// scans a TTL apart find it unaccounted for, which leaves an attempt in progress the
// time to record its key. It returns the keys found unaccounted for this time.
func (b *Backend) collect(s *session, suspects map[string]bool) map[string]bool {
	ctx, cancel := b.opCtx(s.ctx)
	defer cancel()
	resp, err := b.cli.TimeToLive(ctx, s.id, clientv3.WithAttachedKeys())
	if err != nil {
		return suspects
	}
	b.mu.Lock()
	known := make(map[string]bool, len(b.names))
	for _, n := range b.names {
		known[n] = true
	}
	b.mu.Unlock()
	next := map[string]bool{}
	for _, k := range resp.Keys {
		key := string(k)
		// A lock's tail key (see tailSep) is on the lease of the member it names.
		if known[key] || !strings.HasPrefix(key, b.prefix+"/") || strings.HasSuffix(key, tailSep) {
			continue
		}
		if !suspects[key] {
			next[key] = true
			continue
		}
		_, _ = b.cli.Txn(ctx).
			If(clientv3.Compare(clientv3.LeaseValue(key), "=", int64(s.id))).
			Then(clientv3.OpDelete(key)).
			Commit()
	}
	return next
}
