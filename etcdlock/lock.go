package etcdlock

import (
	"context"
	"errors"
	"fmt"

	"go.etcd.io/etcd/api/v3/etcdserverpb"
	"go.etcd.io/etcd/api/v3/mvccpb"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/dlockio/dlock/driver"
)

var (
	errLeaseGone = errors.New("session lease gone")
	errNameTaken = errors.New("member key name taken by another owner")
	errPlaceLost = fmt.Errorf("%w while waiting; the place in the queue is gone", ErrSessionLost)
)

// Acquire implements driver.Backend.
func (b *Backend) Acquire(ctx context.Context, req driver.Request) (driver.Grant, error) {
	if b.isClosed() {
		return driver.Grant{}, driver.ErrClosed
	}
	waitCtx := ctx
	ctx, cancel := b.opCtx(ctx)
	defer cancel()
	ok := driver.Holder{Key: req.Key, Owner: req.Owner}
	var w *waiter
	if req.Wait {
		b.mu.Lock()
		w = b.waiters[ok]
		b.mu.Unlock()
		if w != nil && w.placeLost() {
			// Its session ended (which woke it): fail at once, without a new
			// session, rather than queue afresh at the back.
			return driver.Grant{}, wrap("acquire", req.Key, errPlaceLost)
		}
	}
	for range 4 {
		s, err := b.session(ctx, req.TTL)
		if err != nil {
			if w != nil && waitCtx.Err() == nil && (ctx.Err() != nil || errors.Is(err, rpctypes.ErrTooManyRequests)) {
				return driver.Grant{}, waitOn(req.Key, err) // the request timeout, as below
			}
			b.freeName(ok)
			return driver.Grant{}, wrap("acquire", req.Key, err)
		}
		var g driver.Grant
		var tailless bool
		err = b.retry(ctx, func(ctx context.Context) (err error) {
			g, tailless, err = b.attempt(ctx, req, s, w)
			return err
		})
		var held *driver.HeldError
		switch {
		case err == nil:
			b.track(ok, int64(g.Token), req.Limit, req.Shared, tailless, s, req.TTL)
			return g, nil
		case errors.Is(err, errLeaseGone):
			// The lease ended on the server before the keep-alive loop noticed.
			s.end(fmt.Errorf("%w: the server no longer has lease %x", ErrSessionLost, int64(s.id)), false)
			if w != nil && w.placedOn(s) {
				return driver.Grant{}, wrap("acquire", req.Key, errPlaceLost)
			}
		case errors.Is(err, errNameTaken):
			// Try again under another name.
		case errors.As(err, &held):
			switch {
			case req.Wait && w != nil:
				b.untrackOrphan(ok) // the waiter answers for its place now
			case req.Wait:
				// Queued by a caller that registered no wait: the place goes if it
				// is not claimed within the patience.
				b.orphan(ok, s, max(req.Patience, req.TTL))
			default:
				b.freeName(ok) // a TryLock that finds the lock taken writes nothing
			}
			return driver.Grant{}, err
		case errors.Is(err, ErrSessionLost):
			return driver.Grant{}, wrap("acquire", req.Key, err)
		case errors.Is(err, driver.ErrLimitMismatch):
			// Refused by a transaction that wrote nothing (see limitSep).
			b.freeName(ok)
			return driver.Grant{}, wrap("acquire", req.Key, err)
		case w != nil && waitCtx.Err() == nil && (ctx.Err() != nil || errors.Is(err, rpctypes.ErrTooManyRequests)):
			// A waiting attempt ran out of the request timeout (the server is busy,
			// or has no leader), not of the caller's patience, or the server turned
			// it away because it is behind in applying writes ("too many requests"). Its outcome is
			// unknown, but the waiter answers for the member key it may have
			// written (Stop deletes it) and the next attempt finds it: report the
			// lock as taken, so the core waits and tries again, rather than end a
			// wait that has no deadline with a timeout error. If the session
			// ends meanwhile, the place the attempt may have made goes with it,
			// and the waiter gives up (see session.end).
			w.mayBePlaced(s)
			b.untrackOrphan(ok)
			return driver.Grant{}, waitOn(req.Key, err)
		default:
			// The outcome is unknown: a member key may have been written.
			b.orphan(ok, s, req.TTL)
			return driver.Grant{}, wrap("acquire", req.Key, err)
		}
	}
	b.freeName(ok)
	return driver.Grant{}, wrap("acquire", req.Key, fmt.Errorf("%w: sessions keep ending", ErrSessionLost))
}

// waitOn is the error of a waiting attempt that got no answer within the request
// timeout, or that a busy server turned away: it matches driver.ErrLocked, so the core waits and tries again (a Lock
// whose context has no deadline never fails on a timeout of its own), and says why.
func waitOn(key string, err error) error {
	return wrap("acquire", key, fmt.Errorf("no answer in time (%w), so waiting on as if %w", err, driver.ErrLocked))
}

func firstKV(r *etcdserverpb.ResponseOp) *mvccpb.KeyValue {
	kvs := r.GetResponseRange().GetKvs()
	if len(kvs) == 0 {
		return nil
	}
	return kvs[0]
}

// firstOp reads the first member of a lock (the holder), with its value, the owner.
func firstOp(prefix string) clientv3.Op {
	return clientv3.OpGet(prefix, clientv3.WithFirstCreate()...)
}

// firstKeyOp reads the key of the first member of a lock, without its value: sorted
// by create revision, etcd reads every member, and with values it would read each
// one's from its backend (for a write transaction, in its apply loop), so the cost
// would grow with the queue.
func firstKeyOp(prefix string) clientv3.Op {
	return clientv3.OpGet(prefix, append(clientv3.WithFirstCreate(), clientv3.WithKeysOnly())...)
}

// callerHolds returns first (read keys only), with its value, if it is a grant of
// owner's under a name of another client's, made by an earlier process with the
// same owner id (to be resumed), and not a reader's (only a writer resumes, and a
// reader's grant is never turned into a writer's); else nil. A name of this client's is another
// owner's (an owner has one name here) and costs no request.
func (b *Backend) callerHolds(ctx context.Context, first *mvccpb.KeyValue, owner string) (*mvccpb.KeyValue, error) {
	if first == nil || b.ours(string(first.Key)) {
		return nil, nil
	}
	g, err := b.cli.Get(ctx, string(first.Key))
	if err != nil {
		return nil, leaseErr(err)
	}
	if len(g.Kvs) > 0 && g.Kvs[0].CreateRevision == first.CreateRevision && ownerOf(g.Kvs[0].Value) == owner && !sharedOf(g.Kvs[0].Value) {
		return g.Kvs[0], nil
	}
	return nil, nil
}

// predecessorOp reads the member just ahead of the one created at rev.
func predecessorOp(prefix string, rev int64, opts ...clientv3.OpOption) clientv3.Op {
	return clientv3.OpGet(prefix, append([]clientv3.OpOption{clientv3.WithPrefix(), clientv3.WithMaxCreateRev(rev - 1),
		clientv3.WithSort(clientv3.SortByCreateRevision, clientv3.SortDescend), clientv3.WithLimit(1), clientv3.WithKeysOnly()}, opts...)...)
}

func leaseErr(err error) error {
	if errors.Is(err, rpctypes.ErrLeaseNotFound) {
		return errLeaseGone
	}
	return err
}

// attempt is one try of Acquire on session s. It is idempotent: run again after a
// lost reply, it finds the member key the first run wrote and carries on from there.
// A request with a limit above 1 takes the semaphore's way (semAttempt), a shared
// one the reader's (sharedAttempt). tailless reports a grant whose write left the
// lock's tail alone (see create): no tail can name its member key.
func (b *Backend) attempt(ctx context.Context, req driver.Request, s *session, w *waiter) (g driver.Grant, tailless bool, err error) {
	if req.Limit > 1 {
		g, err = b.semAttempt(ctx, req, s, w)
		return g, false, err
	}
	for range 4 {
		if req.Shared {
			g, err = b.sharedAttempt(ctx, req, s, w)
		} else {
			g, tailless, err = b.mutexAttempt(ctx, req, s, w)
		}
		if !errors.Is(err, errStaleLimit) {
			return g, tailless, err
		}
		if err := b.clearStale(ctx, b.LockPrefix(req.Key)); err != nil {
			return driver.Grant{}, false, err
		}
	}
	return driver.Grant{}, false, errors.New("the lock's limit key keeps coming back") // transient
}

// mutexAttempt is attempt for a mutex. It returns errStaleLimit when a key left
// behind by a semaphore (its limit key, or the tail) refused it on a lock without
// members: the caller deletes those and tries again. tailless is as for attempt.
func (b *Backend) mutexAttempt(ctx context.Context, req driver.Request, s *session, w *waiter) (g driver.Grant, tailless bool, err error) {
	prefix := b.LockPrefix(req.Key)
	member := b.name(driver.Holder{Key: req.Key, Owner: req.Owner})
	if w != nil {
		if g, done, err := b.placedAttempt(ctx, s, w, prefix, member); done {
			return g, false, err
		}
	}
	put := mutexPut(member, req, s)
	resp, hint, err := b.create(ctx, req, s, prefix, member, put)
	if err != nil {
		return driver.Grant{}, false, leaseErr(err)
	}
	if resp.Succeeded {
		g, err = b.created(ctx, req, s, w, member, resp, hint)
		return g, err == nil && wroteNoTail(req, resp), err
	}
	if req.Wait && firstKV(resp.Responses[0]) == nil {
		// Refused by the limit key, not by the own member key.
		return driver.Grant{}, false, b.limitConflict(ctx, prefix, 1)
	}
	g, err = b.exists(ctx, req, s, w, member, resp, put)
	return g, false, err
}

// placeStart begins the attempt of a waiter w with a place in the queue under
// member (placedAttempt, semPlaced, sharedPlaced). It returns proceed and the
// place's revision when the attempt must ask the server whether the place now
// holds; otherwise the attempt ends with done and err: not done when the place
// was made on another session that is still live (the attempt goes on as a fresh
// one), done with errPlaceLost when that session ended, done with a HeldError
// while the waiter's watch still runs (the place reported without a request).
func placeStart(s *session, w *waiter, member string) (rev int64, proceed, done bool, err error) {
	w.markAttempted(member)
	rev, ws, wm := w.place()
	if rev <= 0 || wm != member {
		return 0, false, false, nil
	}
	if ws != s {
		if ws.isDone() {
			return 0, false, true, errPlaceLost
		}
		return 0, false, false, nil
	}
	if ahead, ok := w.still(s); ok {
		return 0, false, true, &driver.HeldError{Ahead: ahead, Queued: true}
	}
	return rev, true, false, nil
}

// placedAttempt is the attempt of a waiter w that has a place in the queue under
// member: it reports the place while its watch runs, and when woken checks whether
// the place is now first. done is false when the place was made on another session
// that is still live: the attempt then goes on as a fresh one.
func (b *Backend) placedAttempt(ctx context.Context, s *session, w *waiter, prefix, member string) (g driver.Grant, done bool, err error) {
	rev, proceed, done, err := placeStart(s, w, member)
	if !proceed {
		return driver.Grant{}, done, err
	}
	// A woken waiter: is the own key still there, and first (no member created
	// before it)? Both reads in one transaction, so at one revision; both read keys
	// only. (A compare over the prefix would read every member's value: the cost of
	// a handoff would grow with the queue.)
	resp, readRev, err := b.placeRead(ctx, member, prefix, rev, w.deletion())
	if err != nil {
		return driver.Grant{}, true, leaseErr(err)
	}
	mine, pred := firstKV(resp.Responses[0]), firstKV(resp.Responses[1])
	if mine != nil && mine.CreateRevision == rev && pred == nil {
		return driver.Grant{Token: uint64(rev), Lost: s.done}, true, nil
	}
	if mine == nil || mine.CreateRevision != rev {
		// The own key vanished while waiting: its lease expired or was revoked
		// before this process noticed, or someone deleted it. Never take the lock
		// on the strength of the old place.
		return driver.Grant{}, true, fmt.Errorf("%w: the waiter's member key vanished while it waited; the place in the queue is gone", ErrSessionLost)
	}
	w.placed(-1)
	w.follow(string(pred.Key), pred.CreateRevision, readRev, s, rev, member)
	return driver.Grant{}, true, &driver.HeldError{}
}

// placeRead reads, in one transaction, the member key and the member just ahead
// of the one created at rev. When the waiter's watch saw the member ahead deleted
// at revision at (0 if not), it reads at that revision, serializably: any member
// that has applied it answers from its own store, without the quorum round of a
// linearizable read, which sits on every handoff's path. The answer is as good as
// a current one. No member can join ahead of rev later (create revisions only
// rise), so "none ahead" at that revision stays true; and the own key, there at
// that revision, is kept by its session's lease for as long as the session is
// not lost, which the grant's Lost reports (a force release may delete it at any
// time, after this read as after a current one). A member that has not applied that
// revision yet, or has compacted it, sends the read to the usual linearizable way.
// It returns the revision the read was at.
func (b *Backend) placeRead(ctx context.Context, member, prefix string, rev, at int64) (*clientv3.TxnResponse, int64, error) {
	if at >= rev {
		resp, err := b.cli.Txn(ctx).
			Then(clientv3.OpGet(member, clientv3.WithKeysOnly(), clientv3.WithRev(at), clientv3.WithSerializable()),
				predecessorOp(prefix, rev, clientv3.WithRev(at), clientv3.WithSerializable())).
			Commit()
		if !errors.Is(err, rpctypes.ErrFutureRev) && !errors.Is(err, rpctypes.ErrCompacted) {
			return resp, at, err
		}
	}
	resp, err := b.cli.Txn(ctx).
		Then(clientv3.OpGet(member, clientv3.WithKeysOnly()), predecessorOp(prefix, rev)).
		Commit()
	if err != nil {
		return nil, 0, err
	}
	return resp, resp.Header.Revision, nil
}

// create is the attempt's write, guarded by "the own member key does not exist".
// A waiter creates its member key and counts the members already there: none, and
// it holds the lock. A TryLock creates it only if nobody is there, and otherwise
// writes nothing. A mutex's write swaps the lock's tail too, unless it finds the
// lock empty (see wroteNoTail). Nothing in a write reads the members sorted by
// create revision: etcd applies writes one at a time, and such a read makes etcd
// list and sort every member of the lock, so with thousands of waiters queueing at
// once the apply loop fell behind, writes and linearizable reads (the holder's
// Refresh) timed out, and the retried writes, applied all the same, added to the
// backlog. A count reads etcd's in-memory index only and allocates nothing. It
// returns the first-member hint it read with the write (a waiter that may resume a
// grant of its owner's).
func (b *Backend) create(ctx context.Context, req driver.Request, s *session, prefix, member string, put clientv3.Op) (*clientv3.TxnResponse, firstHint, error) {
	tail := tailKey(prefix)
	putTail := tailPut(prefix, member, s)
	cmps := []clientv3.Cmp{clientv3.Compare(clientv3.CreateRevision(member), "=", 0)}
	var thenOps, elseOps []clientv3.Op
	var hint firstHint
	if req.Wait {
		// The tail is read before it is written: it names the member that
		// queued just before this one (see tailSep).
		thenOps = []clientv3.Op{
			clientv3.OpGet(prefix, clientv3.WithPrefix(), clientv3.WithCountOnly()),
			clientv3.OpGet(tail),
		}
		if req.Resume {
			hint = b.firstHint(prefix)
			if hint.name != "" {
				thenOps = append(thenOps, clientv3.OpGet(hint.name))
			}
		}
		if req.Shared {
			thenOps = append(thenOps, put, putTail)
		} else {
			// A member created on a lock with nothing in it (no member, tail
			// or limit key) leaves the tail alone: no waiter is behind it to
			// find its predecessor by the tail, and its release is then a
			// plain delete (see wroteNoTail). "Nothing in it" is asked of the
			// range only once the tail is found missing (etcd stops at the
			// first compare that fails): a compare over the range reads every
			// member, and a queue's tail is there while members queue.
			thenOps = append(thenOps, clientv3.OpTxn(
				[]clientv3.Cmp{clientv3.Compare(clientv3.Version(tail), "=", 0), freeCmp(prefix)},
				[]clientv3.Op{put}, []clientv3.Op{put, putTail}))
		}
		if n := readersInTxn.Load(); req.Shared && n > 0 {
			// A reader needs the members ahead of it, with their values: the
			// first few, read with the write (see readersInTxn), spare it a
			// second request when they are all there is.
			thenOps = append(thenOps, clientv3.OpGet(prefix, clientv3.WithPrefix(), clientv3.WithLimit(n)))
		}
		elseOps = []clientv3.Op{clientv3.OpGet(member)}
		// A mutex member is never created while the lock is a semaphore.
		cmps = append(cmps, clientv3.Compare(clientv3.Version(limitKey(prefix)), "=", 0))
	} else {
		// "No member" is asked of the range from the limit key to the end of the
		// members, which holds the tail too: the same bytes as the members' range
		// alone, and a stale limit key or tail on a lock without members makes
		// the attempt clear them and try again.
		grant := []clientv3.Op{put, putTail}
		if !req.Shared {
			grant = []clientv3.Op{put} // as a waiter's on a lock with nothing in it
		}
		thenOps = []clientv3.Op{clientv3.OpTxn([]clientv3.Cmp{freeCmp(prefix)}, grant, []clientv3.Op{firstOp(prefix)})}
		elseOps = []clientv3.Op{clientv3.OpGet(member), firstKeyOp(prefix)}
	}
	resp, err := b.cli.Txn(ctx).
		If(cmps...).
		Then(thenOps...).
		Else(elseOps...).
		Commit()
	return resp, hint, err
}

// wroteNoTail reports whether the successful write resp of a mutex attempt (create)
// created its member key without writing the lock's tail: a TryLock's grant, or a
// waiter's that found nothing in the lock. No tail can then name the member key
// until it is deleted (only a member's own creating write names it in the tail).
func wroteNoTail(req driver.Request, resp *clientv3.TxnResponse) bool {
	if req.Shared || !resp.Succeeded || len(resp.Responses) == 0 {
		return false
	}
	if !req.Wait {
		return resp.Responses[0].GetResponseTxn().GetSucceeded()
	}
	return resp.Responses[len(resp.Responses)-1].GetResponseTxn().GetSucceeded()
}

// mutexPut writes the member key of a mutex request on session s's lease.
func mutexPut(member string, req driver.Request, s *session) clientv3.Op {
	return clientv3.OpPut(member, memberValue(req.Owner, 1, req.Value), clientv3.WithLease(s.id))
}

// tailPut makes member the lock's tail (see tailSep), on session s's lease.
func tailPut(prefix, member string, s *session) clientv3.Op {
	return clientv3.OpPut(tailKey(prefix), member, clientv3.WithLease(s.id))
}

// freeCmp holds when the lock has no member: it asks that of the range from the
// limit key to the end of the members, which holds the tail too, so a stale limit
// key or tail (see limitSep) fails it as well; the caller then clears them and
// tries again. On an empty range etcd compares a key that does not exist (create
// revision 0), so a free lock passes (TestFreeCmp checks it on the server).
func freeCmp(prefix string) clientv3.Cmp {
	return clientv3.Compare(clientv3.CreateRevision(limitKey(prefix)), "=", 0).WithRange(clientv3.GetPrefixRangeEnd(prefix))
}

// created finishes an attempt whose write went through (resp): a TryLock's took the
// lock or found it taken; a waiter's member key was created at resp's revision,
// with the members counted then ahead of it.
func (b *Backend) created(ctx context.Context, req driver.Request, s *session, w *waiter, member string, resp *clientv3.TxnResponse, hint firstHint) (driver.Grant, error) {
	rev := resp.Header.Revision
	if !req.Wait {
		nested := resp.Responses[0].GetResponseTxn()
		if nested.GetSucceeded() {
			return driver.Grant{Token: uint64(rev), Lost: s.done}, nil
		}
		first := firstKV(nested.GetResponses()[0])
		switch {
		case first == nil:
			return driver.Grant{}, errStaleLimit
		case limitOf(first.Value) > 1:
			return driver.Grant{}, limitMismatch(limitOf(first.Value), 1)
		case ownerOf(first.Value) == req.Owner && req.Reenter && !sharedOf(first.Value):
			return b.resume(ctx, req, first, s, "")
		}
		return driver.Grant{}, &driver.HeldError{}
	}
	count := resp.Responses[0].GetResponseRange().GetCount()
	if count == 0 {
		return driver.Grant{Token: uint64(rev), Lost: s.done}, nil
	}
	ahead := max(int(count)-1, 0)
	pred := firstKV(resp.Responses[1])
	if pred == nil || w == nil || pred.ModRevision >= rev {
		// Members were there: read the one just ahead (and the first, for a
		// request that may resume a grant of its owner's) in a read-only
		// transaction, which etcd serves beside its apply loop.
		return b.queued(ctx, req, s, w, member, rev, ahead)
	}
	// The tail names the member that queued just before this one, created at the
	// tail's mod revision: watch it, once the watch has found it still there (else
	// the waiter is woken, and its next attempt reads the queue). No request more,
	// and nothing that grows with the queue, unless the request may resume a grant
	// of its owner's: then the first member is read (keys only) to see whether it
	// is one.
	if req.Resume {
		var hinted *mvccpb.KeyValue
		if hint.name != "" {
			hinted = firstKV(resp.Responses[2])
		}
		if g, done, err := b.resumeFirst(ctx, req, s, member, hint, hinted, rev, rev); done {
			return g, err
		}
	}
	w.placed(ahead)
	w.follow(string(pred.Value), pred.ModRevision, 0, s, rev, member)
	return driver.Grant{}, &driver.HeldError{Ahead: ahead, Queued: true}
}

// exists finishes an attempt that found its member key (resp, with put the write
// of the key on session s): the same grant (re-entry, or a retry after a lost
// reply), or a place in the queue.
func (b *Backend) exists(ctx context.Context, req driver.Request, s *session, w *waiter, member string, resp *clientv3.TxnResponse, put clientv3.Op) (driver.Grant, error) {
	mine := firstKV(resp.Responses[0])
	if mine == nil {
		return driver.Grant{}, errors.New("member key vanished during the read") // transient
	}
	if ownerOf(mine.Value) != req.Owner {
		b.burn(driver.Holder{Key: req.Key, Owner: req.Owner}, member)
		return driver.Grant{}, errNameTaken
	}
	if sharedOf(mine.Value) {
		// The owner holds or waits for the key as a reader through this client:
		// never turn that member into a writer's.
		return driver.Grant{}, &driver.HeldError{}
	}
	if !req.Wait {
		first := firstKV(resp.Responses[1])
		if first == nil {
			return driver.Grant{}, errors.New("member key vanished during the read") // transient
		}
		if first.CreateRevision != mine.CreateRevision {
			if req.Resume {
				if g, done, err := b.resumeCallers(ctx, req, s, first, member); done {
					return g, err
				}
			}
			return driver.Grant{}, &driver.HeldError{}
		}
	} else if g, done, err := b.requeue(ctx, req, s, w, mine, member, put); done {
		return g, err
	}
	return b.keep(ctx, req, s, w, mine, member, put)
}

// keep keeps the existing member key mine on session s's lease, with the request's
// value (its create revision, the token, stays; see rewrite), and reads whether it
// is first, and else the member just ahead of it, which a waiter watches.
func (b *Backend) keep(ctx context.Context, req driver.Request, s *session, w *waiter, mine *mvccpb.KeyValue, member string, put clientv3.Op) (driver.Grant, error) {
	prefix := b.LockPrefix(req.Key)
	ops := []clientv3.Op{firstKeyOp(prefix), predecessorOp(prefix, mine.CreateRevision)}
	if rewrite(mine, s, req) {
		ops = append(ops, put)
	}
	resp, err := b.cli.Txn(ctx).
		If(clientv3.Compare(clientv3.CreateRevision(member), "=", mine.CreateRevision)).
		Then(ops...).
		Commit()
	if err != nil {
		return driver.Grant{}, leaseErr(err)
	}
	if !resp.Succeeded {
		return driver.Grant{}, errors.New("member key vanished while it was read") // transient
	}
	first := firstKV(resp.Responses[0])
	if first != nil && first.CreateRevision == mine.CreateRevision {
		return driver.Grant{Token: uint64(mine.CreateRevision), Lost: s.done}, nil
	}
	if req.Resume {
		if g, done, err := b.resumeCallers(ctx, req, s, first, member); done {
			return g, err
		}
	}
	if pred := firstKV(resp.Responses[1]); w != nil && pred != nil {
		w.follow(string(pred.Key), pred.CreateRevision, resp.Header.Revision, s, mine.CreateRevision, member)
	}
	return driver.Grant{}, &driver.HeldError{}
}

// resumeCallers resumes first (read keys only) if it is a grant of the caller's
// under another client's name (see callerHolds), deleting member, the caller's own
// place. done is false when it is not.
func (b *Backend) resumeCallers(ctx context.Context, req driver.Request, s *session, first *mvccpb.KeyValue, member string) (g driver.Grant, done bool, err error) {
	kv, err := b.callerHolds(ctx, first, req.Owner)
	if err != nil {
		return driver.Grant{}, true, err
	}
	if kv == nil {
		return driver.Grant{}, false, nil
	}
	g, err = b.resume(ctx, req, kv, s, member)
	return g, true, err
}

// resumeFirst is the check of a waiting request that says Resume, whose member key
// was created at myRev: it resumes the first member if that is a grant of the
// caller's under another client's name. The first member is hinted, read with the
// write, when it is still the one hint names (no member can be created ahead of
// it, so it is still first: this costs nothing more); else it is read, at readAt or
// later, and the attempt holds the lock if its own key is first. done is false
// when the attempt goes on as a place in the queue.
func (b *Backend) resumeFirst(ctx context.Context, req driver.Request, s *session, member string, hint firstHint, hinted *mvccpb.KeyValue, readAt, myRev int64) (g driver.Grant, done bool, err error) {
	if hinted != nil && hinted.CreateRevision == hint.rev {
		if !b.ours(string(hinted.Key)) && ownerOf(hinted.Value) == req.Owner && !sharedOf(hinted.Value) {
			g, err := b.resume(ctx, req, hinted, s, member)
			return g, true, err
		}
		return driver.Grant{}, false, nil
	}
	first, err := b.readFirst(ctx, b.LockPrefix(req.Key), readAt)
	if err != nil {
		return driver.Grant{}, true, leaseErr(err)
	}
	if first != nil && first.CreateRevision == myRev {
		return driver.Grant{Token: uint64(myRev), Lost: s.done}, true, nil
	}
	return b.resumeCallers(ctx, req, s, first, member)
}

// resume takes over the grant first, which the owner holds under another member key
// (written by a previous process with the same owner id), for a request that says
// Resume (driver.Request; a TryLock's that says Reenter also takes over a first
// member of its owner's found by its own transaction; otherwise the holder is waited
// for like any other, since another live process may use the same owner id): it moves the key onto
// session s, keeping its create revision and so its token, with the request's value
// (a re-entry replaces it), and deletes extra, a place this attempt queued meanwhile.
func (b *Backend) resume(ctx context.Context, req driver.Request, first *mvccpb.KeyValue, s *session, extra string) (driver.Grant, error) {
	ok := driver.Holder{Key: req.Key, Owner: req.Owner}
	name := string(first.Key)
	ops := []clientv3.Op{clientv3.OpPut(name, requestValue(req), clientv3.WithLease(s.id))}
	if extra != "" {
		ops = append(ops, clientv3.OpDelete(extra))
	}
	resp, err := b.cli.Txn(ctx).
		If(append(ownedBy(name, req.Owner), clientv3.Compare(clientv3.CreateRevision(name), "=", first.CreateRevision))...).
		Then(ops...).
		Commit()
	if err != nil {
		return driver.Grant{}, leaseErr(err)
	}
	if !resp.Succeeded {
		return driver.Grant{}, errors.New("the grant to resume ended meanwhile") // transient
	}
	b.adopt(ok, name)
	return driver.Grant{Token: uint64(first.CreateRevision), Lost: s.done}, nil
}

// rewrite reports whether the existing member key mine must be written again for
// req on session s: it is on another lease, or holds another value than req's (an
// attempt that re-enters a grant replaces its value). The write keeps the key's
// create revision, the token.
func rewrite(mine *mvccpb.KeyValue, s *session, req driver.Request) bool {
	return mine.Lease != int64(s.id) || string(mine.Value) != requestValue(req)
}
