package etcdlock

import (
	"context"
	"time"

	"github.com/dlockio/dlock/driver"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// tracked is a member key this backend answers for until it is released or deleted:
// a grant the core holds, or an orphan, a key that may exist but that nobody uses
// (the reply to the transaction that wrote it was lost, or its delete failed).
//
// The session lease that keeps member keys alive is renewed by the backend, not by
// the core, so without this a key the core no longer renews would stay as long as
// the process runs, and block the lock. Each tracked key has a timer: for a grant it
// fires TTL after the last successful Refresh (the core stopped renewing: it declared
// the lease lost, or the driver's caller never refreshes); for an orphan it fires
// soon. When it fires the key is deleted, if it is still on this backend's session
// (and has the grant's create revision), with retries until that succeeds or the
// session ends. A process that stops altogether stops renewing its sessions too, and
// etcd expires them.
type tracked struct {
	rev    int64 // create revision, for a grant; 0 when unknown
	limit  int   // of the lock, for a grant: 1 for a mutex
	shared bool  // a reader's grant (driver.Request.Shared)
	// tailless: a grant whose write left the lock's tail alone (see create), so
	// that no tail names its member key and its release is a plain delete.
	tailless bool
	sess     *session // the session the key is on; nil when unknown
	grant    bool
	timer    *time.Timer
	backoff  time.Duration // between failed deletes
}

const (
	sweepRetryMin = 100 * time.Millisecond
	sweepRetryMax = 2 * time.Second
)

// track records a new grant of ok in a lock of limit holders (a reader's when
// shared; tailless as for attempt), replacing any earlier record.
func (b *Backend) track(ok driver.Holder, rev int64, limit int, shared, tailless bool, s *session, ttl time.Duration) {
	b.put(ok, &tracked{rev: rev, limit: max(limit, 1), shared: shared, tailless: tailless, sess: s, grant: true}, ttl)
}

// deletionOf is how the release of ok's member key deletes it: plain for a grant
// that wrote no tail, else trusted.
func (b *Backend) deletionOf(ok driver.Holder) deletion {
	b.mu.Lock()
	defer b.mu.Unlock()
	if h := b.held[ok]; h != nil && h.grant && h.tailless {
		return plain
	}
	return trusted
}

// orphan records that a member key of ok may exist on session s (nil: on any) with
// nobody to use it, to be deleted after d.
func (b *Backend) orphan(ok driver.Holder, s *session, d time.Duration) {
	b.put(ok, &tracked{sess: s}, d)
}

func (b *Backend) put(ok driver.Holder, h *tracked, d time.Duration) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.closed {
		return
	}
	if old := b.held[ok]; old != nil {
		old.timer.Stop()
	}
	h.timer = time.AfterFunc(d, func() { b.sweep(ok, h) })
	b.held[ok] = h
}

// touch re-arms the timer of grant h to fire ttl after from; it reports false if h is
// no longer the current record of ok (released, swept, or replaced).
func (b *Backend) touch(ok driver.Holder, h *tracked, from time.Time, ttl time.Duration) bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.held[ok] != h || !h.grant {
		return false
	}
	h.timer.Reset(max(time.Until(from.Add(ttl)), 0))
	return true
}

// untrack forgets the record of ok (only if it is h, when h is not nil).
func (b *Backend) untrack(ok driver.Holder, h *tracked) {
	b.mu.Lock()
	defer b.mu.Unlock()
	cur := b.held[ok]
	if cur == nil || (h != nil && cur != h) {
		return
	}
	cur.timer.Stop()
	delete(b.held, ok)
	b.freeNameLocked(ok)
}

// untrackOrphan forgets the record of ok if it is an orphan.
func (b *Backend) untrackOrphan(ok driver.Holder) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if h := b.held[ok]; h != nil && !h.grant {
		h.timer.Stop()
		delete(b.held, ok)
		b.freeNameLocked(ok)
	}
}

// disown turns the record of ok, if any, into an orphan to be deleted at once: its
// release failed.
func (b *Backend) disown(ok driver.Holder) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if h := b.held[ok]; h != nil {
		h.grant = false
		h.timer.Reset(0)
	}
}

// sweep deletes the member key of record h if it is still on h's session (with h's
// create revision, when known), retrying with backoff while that session lives.
func (b *Backend) sweep(ok driver.Holder, h *tracked) {
	b.mu.Lock()
	if b.closed || b.held[ok] != h {
		b.mu.Unlock()
		return
	}
	h.grant = false // Refresh no longer revives it
	b.wg.Add(1)
	b.mu.Unlock()
	defer b.wg.Done()

	b.mu.Lock()
	member, found := b.names[ok]
	b.mu.Unlock()
	if !found {
		b.untrack(ok, h)
		return
	}
	var cmps []clientv3.Cmp
	if h.rev > 0 {
		cmps = append(cmps, clientv3.Compare(clientv3.CreateRevision(member), "=", h.rev))
	}
	if h.sess != nil {
		cmps = append(cmps, clientv3.Compare(clientv3.LeaseValue(member), "=", int64(h.sess.id)))
	}
	ctx, cancel := b.opCtx(b.ctx)
	err := b.retry(ctx, func(ctx context.Context) error {
		_, err := b.cli.Txn(ctx).If(cmps...).Then(clientv3.OpDelete(member)).Commit()
		return err
	})
	cancel()

	b.mu.Lock()
	defer b.mu.Unlock()
	if b.held[ok] != h {
		return
	}
	if err == nil || b.closed || (h.sess != nil && h.sess.isDone()) {
		delete(b.held, ok)
		b.freeNameLocked(ok)
		return
	}
	h.backoff = min(max(2*h.backoff, sweepRetryMin), sweepRetryMax)
	h.timer.Reset(h.backoff)
}

// Bound implements driver.Bounder: a grant lives on its session's lease, which the
// backend keeps alive, so it is certainly held until the session's deadline (the
// send time of the last successful keep-alive plus the lease TTL, less a margin).
func (b *Backend) Bound(key, owner string) (time.Duration, bool) {
	b.mu.Lock()
	h := b.held[driver.Holder{Key: key, Owner: owner}]
	b.mu.Unlock()
	if h == nil || !h.grant || h.sess == nil || h.sess.isDone() {
		return 0, false
	}
	return time.Until(h.sess.deadline()), true
}
