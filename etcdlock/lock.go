package etcdlock

import (
	"context"
	"errors"
	"fmt"
	"time"

	"go.etcd.io/etcd/api/v3/etcdserverpb"
	"go.etcd.io/etcd/api/v3/mvccpb"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/dlockio/dlock/driver"
)

var (
	errLeaseGone = errors.New("session lease gone")
	errNameTaken = errors.New("member key name taken by another owner")
)

// Acquire implements driver.Backend.
func (b *Backend) Acquire(ctx context.Context, req driver.Request) (driver.Grant, error) {
	if b.isClosed() {
		return driver.Grant{}, driver.ErrClosed
	}
	waitCtx := ctx
	ctx, cancel := b.opCtx(ctx)
	defer cancel()
	ok := ownerKey{req.Key, req.Owner}
	var w *waiter
	if req.Wait {
		b.mu.Lock()
		w = b.waiters[ok]
		b.mu.Unlock()
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
		err = b.retry(ctx, func(ctx context.Context) (err error) {
			g, err = b.attempt(ctx, req, s, w)
			return err
		})
		var held *driver.HeldError
		switch {
		case err == nil:
			b.track(ok, int64(g.Token), s, req.TTL)
			return g, nil
		case errors.Is(err, errLeaseGone):
			// The lease ended on the server before the keep-alive loop noticed.
			s.end(fmt.Errorf("%w: the server no longer has lease %x", ErrSessionLost, int64(s.id)), false)
			if w != nil && w.queuedOn(s) {
				return driver.Grant{}, wrap("acquire", req.Key, fmt.Errorf("%w while waiting; the place in the queue is gone", ErrSessionLost))
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
		case w != nil && waitCtx.Err() == nil && (ctx.Err() != nil || errors.Is(err, rpctypes.ErrTooManyRequests)):
			// A waiting attempt ran out of the request timeout (the server is busy,
			// or has no leader), not of the caller's patience, or the server turned
			// it away because it is behind in applying writes ("too many requests"). Its outcome is
			// unknown, but the waiter answers for the member key it may have
			// written (Stop deletes it) and the next attempt finds it: report the
			// lock as taken, so the core waits and tries again, rather than end a
			// wait that has no deadline with a timeout error.
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
// same owner id (to be resumed); else nil. A name of this client's is another
// owner's (an owner has one name here) and costs no request.
func (b *Backend) callerHolds(ctx context.Context, first *mvccpb.KeyValue, owner string) (*mvccpb.KeyValue, error) {
	if first == nil || b.ours(string(first.Key)) {
		return nil, nil
	}
	g, err := b.cli.Get(ctx, string(first.Key))
	if err != nil {
		return nil, leaseErr(err)
	}
	if len(g.Kvs) > 0 && g.Kvs[0].CreateRevision == first.CreateRevision && string(g.Kvs[0].Value) == owner {
		return g.Kvs[0], nil
	}
	return nil, nil
}

// predecessorOp reads the member just ahead of the one created at rev.
func predecessorOp(prefix string, rev int64) clientv3.Op {
	return clientv3.OpGet(prefix, clientv3.WithPrefix(), clientv3.WithMaxCreateRev(rev-1),
		clientv3.WithSort(clientv3.SortByCreateRevision, clientv3.SortDescend), clientv3.WithLimit(1), clientv3.WithKeysOnly())
}

func leaseErr(err error) error {
	if errors.Is(err, rpctypes.ErrLeaseNotFound) {
		return errLeaseGone
	}
	return err
}

// attempt is one try of Acquire on session s. It is idempotent: run again after a
// lost reply, it finds the member key the first run wrote and carries on from there.
func (b *Backend) attempt(ctx context.Context, req driver.Request, s *session, w *waiter) (driver.Grant, error) {
	ok := ownerKey{req.Key, req.Owner}
	prefix := b.LockPrefix(req.Key)
	member := b.name(ok)

	if w != nil {
		w.markAttempted(member)
		if rev, ws, wm := w.place(); rev > 0 && wm == member {
			if ws != s {
				if ws.isDone() {
					return driver.Grant{}, fmt.Errorf("%w while waiting; the place in the queue is gone", ErrSessionLost)
				}
			} else if ahead, ok := w.still(s); ok {
				return driver.Grant{}, &driver.HeldError{Ahead: ahead}
			} else {
				// A woken waiter: is the own key still there, and first (no member
				// created before it)? Both reads in one transaction, so at one
				// revision; both read keys only. (A compare over the prefix would
				// read every member's value: the cost of a handoff would grow with
				// the queue.)
				resp, err := b.cli.Txn(ctx).
					Then(clientv3.OpGet(member, clientv3.WithKeysOnly()), predecessorOp(prefix, rev)).
					Commit()
				if err != nil {
					return driver.Grant{}, leaseErr(err)
				}
				mine, pred := firstKV(resp.Responses[0]), firstKV(resp.Responses[1])
				if mine != nil && mine.CreateRevision == rev && pred == nil {
					return driver.Grant{Token: uint64(rev), Lost: s.done}, nil
				}
				if mine == nil || mine.CreateRevision != rev {
					// The own key vanished while waiting: its lease expired or was
					// revoked before this process noticed, or someone deleted it.
					// Never take the lock on the strength of the old place.
					return driver.Grant{}, fmt.Errorf("%w: the waiter's member key vanished while it waited; the place in the queue is gone", ErrSessionLost)
				}
				w.placed(-1)
				w.follow(string(pred.Key), pred.CreateRevision, resp.Header.Revision, s, rev, member)
				return driver.Grant{}, &driver.HeldError{}
			}
		}
	}

	// A waiter creates its member key and counts the members already there: none,
	// and it holds the lock. A TryLock creates it only if nobody is there, and
	// otherwise writes nothing. Nothing in a write reads the members sorted by create
	// revision: etcd applies writes one at a time, and such a read makes etcd list
	// and sort every member of the lock, so with thousands of waiters queueing at
	// once the apply loop fell behind, writes and linearizable reads (the holder's
	// Refresh) timed out, and the retried writes, applied all the same, added to the
	// backlog. A count reads etcd's in-memory index only and allocates nothing.
	put := clientv3.OpPut(member, req.Owner, clientv3.WithLease(s.id))
	tail := tailKey(prefix)
	putTail := clientv3.OpPut(tail, member, clientv3.WithLease(s.id))
	var thenOps, elseOps []clientv3.Op
	var hint firstHint
	if req.Wait {
		// The tail is read before it is written: it names the member that
		// queued just before this one (see tailSep).
		thenOps = []clientv3.Op{
			clientv3.OpGet(prefix, clientv3.WithPrefix(), clientv3.WithCountOnly()),
			clientv3.OpGet(tail),
		}
		if req.Reenter {
			hint = b.firstHint(prefix)
			if hint.name != "" {
				thenOps = append(thenOps, clientv3.OpGet(hint.name))
			}
		}
		thenOps = append(thenOps, put, putTail)
		elseOps = []clientv3.Op{clientv3.OpGet(member)}
	} else {
		thenOps = []clientv3.Op{clientv3.OpTxn(
			[]clientv3.Cmp{clientv3.Compare(clientv3.CreateRevision(prefix), "=", 0).WithPrefix()},
			[]clientv3.Op{put, putTail}, []clientv3.Op{firstOp(prefix)})}
		elseOps = []clientv3.Op{clientv3.OpGet(member), firstKeyOp(prefix)}
	}
	resp, err := b.cli.Txn(ctx).
		If(clientv3.Compare(clientv3.CreateRevision(member), "=", 0)).
		Then(thenOps...).
		Else(elseOps...).
		Commit()
	if err != nil {
		return driver.Grant{}, leaseErr(err)
	}
	rev := resp.Header.Revision
	if resp.Succeeded {
		if !req.Wait {
			nested := resp.Responses[0].GetResponseTxn()
			if nested.GetSucceeded() {
				return driver.Grant{Token: uint64(rev), Lost: s.done}, nil
			}
			if first := firstKV(nested.GetResponses()[0]); first != nil && string(first.Value) == req.Owner && req.Reenter {
				return b.resume(ctx, ok, first, s, "")
			}
			return driver.Grant{}, &driver.HeldError{}
		}
		count := resp.Responses[0].GetResponseRange().GetCount()
		if count == 0 {
			return driver.Grant{Token: uint64(rev), Lost: s.done}, nil
		}
		ahead := max(int(count)-1, 0)
		if pred := firstKV(resp.Responses[1]); pred != nil && w != nil && pred.ModRevision < rev {
			// The tail names the member that queued just before this one, created
			// at the tail's mod revision: watch it, once the watch has found it
			// still there (else the waiter is woken, and its next attempt reads
			// the queue). No request more, and nothing that grows with the queue,
			// unless the request may resume a grant of its owner's: then the
			// first member is read (keys only) to see whether it is one.
			if req.Reenter {
				// The first member this backend last read, if it is still there,
				// is still first (no member can be created ahead of it): read with
				// the write, it costs nothing more. Else the first is read.
				var first *mvccpb.KeyValue
				if hint.name != "" {
					if kv := firstKV(resp.Responses[2]); kv != nil && kv.CreateRevision == hint.rev {
						first = kv
					}
				}
				if first == nil {
					first, err = b.readFirst(ctx, prefix, rev)
					if err != nil {
						return driver.Grant{}, leaseErr(err)
					}
					if first != nil && first.CreateRevision == rev {
						return driver.Grant{Token: uint64(rev), Lost: s.done}, nil
					}
					if kv, err := b.callerHolds(ctx, first, req.Owner); err != nil {
						return driver.Grant{}, err
					} else if kv != nil {
						return b.resume(ctx, ok, kv, s, member)
					}
				} else if !b.ours(string(first.Key)) && string(first.Value) == req.Owner {
					return b.resume(ctx, ok, first, s, member)
				}
			}
			w.placed(ahead)
			w.follow(string(pred.Value), pred.ModRevision, 0, s, rev, member)
			return driver.Grant{}, &driver.HeldError{Ahead: ahead}
		}
		// Members were there: read the one just ahead (and the first, for a
		// request that may resume a grant of its owner's) in a read-only
		// transaction, which etcd serves beside its apply loop.
		return b.queued(ctx, req, s, w, member, rev, ahead)
	}

	// The member key exists: the same grant (re-entry, or a retry after a lost
	// reply), or a place in the queue.
	mine := firstKV(resp.Responses[0])
	if mine == nil {
		return driver.Grant{}, errors.New("member key vanished during the read") // transient
	}
	if string(mine.Value) != req.Owner {
		b.burn(ok, member)
		return driver.Grant{}, errNameTaken
	}
	if !req.Wait {
		first := firstKV(resp.Responses[1])
		if first == nil {
			return driver.Grant{}, errors.New("member key vanished during the read") // transient
		}
		if first.CreateRevision != mine.CreateRevision {
			if req.Reenter {
				if kv, err := b.callerHolds(ctx, first, req.Owner); err != nil {
					return driver.Grant{}, err
				} else if kv != nil {
					return b.resume(ctx, ok, kv, s, member)
				}
			}
			return driver.Grant{}, &driver.HeldError{}
		}
	}
	if req.Wait {
		if g, done, err := b.requeue(ctx, req, s, w, mine, member, put); done {
			return g, err
		}
	}
	// Keep the key on this session's lease (the create revision, the token, stays).
	ops := []clientv3.Op{firstKeyOp(prefix), predecessorOp(prefix, mine.CreateRevision)}
	if mine.Lease != int64(s.id) {
		ops = append(ops, put)
	}
	resp, err = b.cli.Txn(ctx).
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
	if req.Reenter {
		if kv, err := b.callerHolds(ctx, first, req.Owner); err != nil {
			return driver.Grant{}, err
		} else if kv != nil {
			return b.resume(ctx, ok, kv, s, member)
		}
	}
	if pred := firstKV(resp.Responses[1]); w != nil && pred != nil {
		w.follow(string(pred.Key), pred.CreateRevision, resp.Header.Revision, s, mine.CreateRevision, member)
	}
	return driver.Grant{}, &driver.HeldError{}
}

// firstHint is a member of a lock that an attempt read as first, which it stays for
// as long as its key exists with the same create revision.
type firstHint struct {
	name string
	rev  int64
}

// maxFirstHints bounds Backend.firsts (one entry per lock waited on with Reenter).
const maxFirstHints = 1024

func (b *Backend) firstHint(prefix string) firstHint {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.firsts[prefix]
}

func (b *Backend) setFirstHint(prefix string, first *mvccpb.KeyValue) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if first == nil {
		delete(b.firsts, prefix)
		return
	}
	if len(b.firsts) >= maxFirstHints {
		clear(b.firsts)
	}
	b.firsts[prefix] = firstHint{string(first.Key), first.CreateRevision}
}

// requeue carries on a waiting attempt whose member key mine exists (a retry after
// a lost reply, or a place whose watch ended) without a read of the queue sorted by
// create revision: the tail as it was just before the key was created names the
// member that queued just ahead of it, read from etcd's history. It moves the key
// onto session s if it is on another (put), checks a first member the request may
// resume, and watches that member. done is false when the history has no answer
// (compacted, or no tail then): the caller reads the queue instead.
func (b *Backend) requeue(ctx context.Context, req driver.Request, s *session, w *waiter, mine *mvccpb.KeyValue, member string, put clientv3.Op) (g driver.Grant, done bool, err error) {
	ok := ownerKey{req.Key, req.Owner}
	prefix := b.LockPrefix(req.Key)
	rev := mine.CreateRevision
	ops := []clientv3.Op{clientv3.OpGet(tailKey(prefix), clientv3.WithRev(rev-1))}
	var hint firstHint
	if req.Reenter {
		if hint = b.firstHint(prefix); hint.name != "" {
			ops = append(ops, clientv3.OpGet(hint.name))
		}
	}
	if mine.Lease != int64(s.id) {
		ops = append(ops, put)
	}
	resp, err := b.cli.Txn(ctx).
		If(clientv3.Compare(clientv3.CreateRevision(member), "=", rev)).
		Then(ops...).
		Commit()
	if err != nil {
		if errors.Is(err, rpctypes.ErrCompacted) {
			return driver.Grant{}, false, nil
		}
		return driver.Grant{}, true, leaseErr(err)
	}
	if !resp.Succeeded {
		return driver.Grant{}, true, errors.New("member key vanished while it was read") // transient
	}
	pred := firstKV(resp.Responses[0])
	if pred == nil || pred.ModRevision >= rev || string(pred.Value) == member || w == nil {
		return driver.Grant{}, false, nil
	}
	if req.Reenter {
		var first *mvccpb.KeyValue
		if hint.name != "" {
			if kv := firstKV(resp.Responses[1]); kv != nil && kv.CreateRevision == hint.rev {
				first = kv
			}
		}
		if first == nil {
			first, err = b.readFirst(ctx, prefix, resp.Header.Revision)
			if err != nil {
				return driver.Grant{}, true, leaseErr(err)
			}
			if first != nil && first.CreateRevision == rev {
				return driver.Grant{Token: uint64(rev), Lost: s.done}, true, nil
			}
			if kv, err := b.callerHolds(ctx, first, req.Owner); err != nil {
				return driver.Grant{}, true, err
			} else if kv != nil {
				g, err := b.resume(ctx, ok, kv, s, member)
				return g, true, err
			}
		} else if !b.ours(string(first.Key)) && string(first.Value) == req.Owner {
			g, err := b.resume(ctx, ok, first, s, member)
			return g, true, err
		}
	}
	w.placed(-1)
	w.follow(string(pred.Value), pred.ModRevision, 0, s, rev, member)
	return driver.Grant{}, true, &driver.HeldError{}
}

// firstRead is a read of the first member of a lock under way, which the
// attempts of this backend that need it at the same time share.
type firstRead struct {
	done  chan struct{}
	first *mvccpb.KeyValue
	rev   int64 // the revision read at
	err   error
}

// readFirst reads the first member of the lock, keys only, at a revision at or
// after rev, and records it as the hint. Attempts that need it at the same time
// share one read: sorted by create revision, it costs the server a listing of every
// member, and thousands of waiters queueing at once would each make one.
func (b *Backend) readFirst(ctx context.Context, prefix string, rev int64) (*mvccpb.KeyValue, error) {
	for {
		b.mu.Lock()
		r := b.reading[prefix]
		mine := r == nil
		if mine {
			r = &firstRead{done: make(chan struct{})}
			b.reading[prefix] = r
		}
		b.mu.Unlock()
		if mine {
			resp, err := b.cli.Txn(ctx).Then(firstKeyOp(prefix)).Commit()
			if err == nil {
				r.first, r.rev = firstKV(resp.Responses[0]), resp.Header.Revision
				b.setFirstHint(prefix, r.first)
			}
			r.err = err
			b.mu.Lock()
			delete(b.reading, prefix)
			b.mu.Unlock()
			close(r.done)
			return r.first, err
		}
		select {
		case <-r.done:
		case <-ctx.Done():
			return nil, ctx.Err()
		}
		if r.err == nil && r.rev >= rev {
			return r.first, nil
		}
		// That read failed, or was made before the own key was written: read again.
	}
}

// queued finishes a waiting attempt that created member key member at revision
// rev, with ahead members ahead of it then (the holder not counted): it reads the
// member just ahead, keys only, and the first one when the request may resume a
// grant of its owner's, in a read-only transaction (no write: etcd serves it beside
// its apply loop, at one revision).
func (b *Backend) queued(ctx context.Context, req driver.Request, s *session, w *waiter, member string, rev int64, ahead int) (driver.Grant, error) {
	ok := ownerKey{req.Key, req.Owner}
	prefix := b.LockPrefix(req.Key)
	ops := []clientv3.Op{predecessorOp(prefix, rev)}
	if req.Reenter {
		ops = append(ops, firstKeyOp(prefix))
	}
	resp, err := b.cli.Txn(ctx).Then(ops...).Commit()
	if err != nil {
		return driver.Grant{}, leaseErr(err)
	}
	pred := firstKV(resp.Responses[0])
	if pred == nil {
		// The members ahead left meanwhile: the own key is first.
		return driver.Grant{Token: uint64(rev), Lost: s.done}, nil
	}
	if req.Reenter {
		if kv, err := b.callerHolds(ctx, firstKV(resp.Responses[1]), req.Owner); err != nil {
			return driver.Grant{}, err
		} else if kv != nil {
			return b.resume(ctx, ok, kv, s, member)
		}
	}
	// Without Reenter, a holder of the same owner id (another client or
	// process) is like any other: the own member key waits behind it.
	if w != nil {
		w.placed(ahead)
		w.follow(string(pred.Key), pred.CreateRevision, resp.Header.Revision, s, rev, member)
	}
	return driver.Grant{}, &driver.HeldError{Ahead: ahead}
}

// resume takes over the grant first, which the owner holds under another member key
// (written by a previous process with the same owner id), for a request that says
// Reenter (driver.Request; without it the holder is waited for like any other, since
// another live process may use the same owner id): it moves the key onto
// session s, keeping its create revision and so its token, and deletes extra, a place
// this attempt queued meanwhile.
func (b *Backend) resume(ctx context.Context, ok ownerKey, first *mvccpb.KeyValue, s *session, extra string) (driver.Grant, error) {
	name := string(first.Key)
	ops := []clientv3.Op{clientv3.OpPut(name, ok.owner, clientv3.WithLease(s.id))}
	if extra != "" {
		ops = append(ops, clientv3.OpDelete(extra))
	}
	resp, err := b.cli.Txn(ctx).
		If(clientv3.Compare(clientv3.CreateRevision(name), "=", first.CreateRevision),
			clientv3.Compare(clientv3.Value(name), "=", ok.owner)).
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

// Refresh implements driver.Backend. The session lease is kept alive in the
// background; Refresh checks that the grant made through this backend is still
// there: its member key exists with the grant's create revision and owner, first in
// line, on a live session.
func (b *Backend) Refresh(ctx context.Context, key, owner string, ttl time.Duration) error {
	ctx, cancel := b.opCtx(ctx)
	defer cancel()
	ok := ownerKey{key, owner}
	b.mu.Lock()
	h, name := b.held[ok], b.names[ok]
	b.mu.Unlock()
	if h == nil || !h.grant {
		return wrap("refresh", key, fmt.Errorf("%w: no grant of this owner through this client", driver.ErrNotHeld))
	}
	started := time.Now()
	prefix := b.LockPrefix(key)
	var resp *clientv3.TxnResponse
	err := b.retry(ctx, func(ctx context.Context) (err error) {
		// The first member keys only: its create revision is all that is compared.
		resp, err = b.cli.Txn(ctx).Then(clientv3.OpGet(name), firstKeyOp(prefix)).Commit()
		return err
	})
	if err != nil {
		return wrap("refresh", key, err)
	}
	mine, first := firstKV(resp.Responses[0]), firstKV(resp.Responses[1])
	var why string
	switch {
	case mine == nil:
		why = "the member key is gone (released, expired or force-released)"
	case mine.CreateRevision != h.rev || string(mine.Value) != owner:
		why = "the member key was deleted and created again"
	case first == nil || first.CreateRevision != mine.CreateRevision:
		why = "the member key is not first in line"
	case mine.Lease != int64(h.sess.id):
		why = "the grant was resumed on another session with the same owner id"
	case h.sess.isDone():
		why = "the session lease ended"
	case !b.touch(ok, h, started, ttl):
		why = "the core did not refresh the grant within its TTL, so this client dropped it"
	}
	if why != "" {
		b.untrack(ok, h)
		return wrap("refresh", key, fmt.Errorf("%w: %s", driver.ErrNotHeld, why))
	}
	return nil
}

// deleteOwn deletes member key name if its value is owner. A name of this backend's
// own that it holds a record for needs no check (trusted): only this backend writes
// it, or another that resumed its grant, with the same owner.
func (b *Backend) deleteOwn(ctx context.Context, name, owner string, trusted bool) (bool, error) {
	var deleted bool
	err := b.retry(ctx, func(ctx context.Context) error {
		if trusted && b.ours(name) {
			// The lock's tail goes too if it names this key (see tailSep).
			tail := tailOf(name)
			resp, err := b.cli.Txn(ctx).
				If(clientv3.Compare(clientv3.Value(tail), "=", name)).
				Then(clientv3.OpDelete(name), clientv3.OpDelete(tail)).
				Else(clientv3.OpDelete(name)).
				Commit()
			if err == nil {
				deleted = resp.Responses[0].GetResponseDeleteRange().GetDeleted() > 0
			}
			return err
		}
		resp, err := b.cli.Txn(ctx).
			If(clientv3.Compare(clientv3.Value(name), "=", owner)).
			Then(clientv3.OpDelete(name)).
			Commit()
		if err == nil {
			deleted = resp.Succeeded && resp.Responses[0].GetResponseDeleteRange().GetDeleted() > 0
		}
		return err
	})
	return deleted, err
}

// Release implements driver.Backend: it deletes the owner's member key, which wakes
// the one waiter that watches it. An owner that has no member key through this
// backend (a restarted process cleaning up after itself) has every member key of
// the lock with its owner id deleted.
func (b *Backend) Release(ctx context.Context, key, owner string) error {
	ctx, cancel := b.opCtx(ctx)
	defer cancel()
	ok := ownerKey{key, owner}
	name, found := b.assigned(ok)
	if !found {
		return b.releaseByOwner(ctx, key, owner)
	}
	deleted, err := b.deleteOwn(ctx, name, owner, true)
	if err != nil {
		// Delete it in the background, with retries, so that it does not stay on
		// this process's session for as long as the session lives.
		b.disown(ok)
		return wrap("release", key, err)
	}
	b.untrack(ok, nil)
	b.freeName(ok)
	if !deleted {
		return wrap("release", key, driver.ErrNotHeld)
	}
	return nil
}

func (b *Backend) releaseByOwner(ctx context.Context, key, owner string) error {
	var resp *clientv3.GetResponse
	err := b.retry(ctx, func(ctx context.Context) (err error) {
		resp, err = b.cli.Get(ctx, b.LockPrefix(key), clientv3.WithPrefix())
		return err
	})
	if err != nil {
		return wrap("release", key, err)
	}
	n := 0
	for _, kv := range resp.Kvs {
		if string(kv.Value) != owner {
			continue
		}
		deleted, err := b.deleteOwn(ctx, string(kv.Key), owner, false)
		if err != nil {
			return wrap("release", key, err)
		}
		if deleted {
			n++
		}
	}
	if n == 0 {
		return wrap("release", key, driver.ErrNotHeld)
	}
	return nil
}

// ForceRelease implements driver.ForceReleaser: it deletes the first member key,
// whoever owns it. The next grant has a larger create revision, so a fenced resource
// rejects the old holder.
func (b *Backend) ForceRelease(ctx context.Context, key string) error {
	ctx, cancel := b.opCtx(ctx)
	defer cancel()
	prefix := b.LockPrefix(key)
	for {
		var resp *clientv3.GetResponse
		err := b.retry(ctx, func(ctx context.Context) (err error) {
			resp, err = b.cli.Get(ctx, prefix, clientv3.WithFirstCreate()...)
			return err
		})
		if err != nil {
			return wrap("force release", key, err)
		}
		if len(resp.Kvs) == 0 {
			return wrap("force release", key, driver.ErrNotHeld)
		}
		kv := resp.Kvs[0]
		var tr *clientv3.TxnResponse
		err = b.retry(ctx, func(ctx context.Context) (err error) {
			tr, err = b.cli.Txn(ctx).
				If(clientv3.Compare(clientv3.CreateRevision(string(kv.Key)), "=", kv.CreateRevision)).
				Then(clientv3.OpDelete(string(kv.Key))).
				Commit()
			return err
		})
		if err != nil {
			return wrap("force release", key, err)
		}
		if tr.Succeeded {
			return nil
		}
		// The holder left meanwhile; release whoever holds it now.
	}
}

// Inspect implements driver.Inspector. It reads the first member keys only, with
// the count, then that member's value (see firstKeyOp): two reads of one key each
// instead of one that would read every member's value.
func (b *Backend) Inspect(ctx context.Context, key string) (driver.Info, error) {
	ctx, cancel := b.opCtx(ctx)
	defer cancel()
	prefix := b.LockPrefix(key)
	var first *mvccpb.KeyValue
	var count int64
	for first == nil {
		var resp *clientv3.TxnResponse
		err := b.retry(ctx, func(ctx context.Context) (err error) {
			resp, err = b.cli.Txn(ctx).Then(
				firstKeyOp(prefix),
				clientv3.OpGet(prefix, clientv3.WithPrefix(), clientv3.WithCountOnly()),
			).Commit()
			return err
		})
		if err != nil {
			return driver.Info{}, wrap("inspect", key, err)
		}
		fk := firstKV(resp.Responses[0])
		if fk == nil {
			return driver.Info{}, wrap("inspect", key, driver.ErrNotHeld)
		}
		count = resp.Responses[1].GetResponseRange().GetCount()
		var g *clientv3.GetResponse
		err = b.retry(ctx, func(ctx context.Context) (err error) {
			g, err = b.cli.Get(ctx, string(fk.Key))
			return err
		})
		if err != nil {
			return driver.Info{}, wrap("inspect", key, err)
		}
		if len(g.Kvs) > 0 && g.Kvs[0].CreateRevision == fk.CreateRevision {
			first = g.Kvs[0]
		}
		// Else the first member left between the reads: read again.
	}
	info := driver.Info{
		Key: key, Owner: string(first.Value), Token: uint64(first.CreateRevision),
		Waiters: int(max(count-1, 0)),
	}
	if first.Lease != 0 {
		var tr *clientv3.LeaseTimeToLiveResponse
		err := b.retry(ctx, func(ctx context.Context) (err error) {
			tr, err = b.cli.TimeToLive(ctx, clientv3.LeaseID(first.Lease))
			return err
		})
		if err != nil {
			return driver.Info{}, wrap("inspect", key, err)
		}
		if tr.TTL > 0 {
			info.TTL = time.Duration(tr.TTL) * time.Second
		}
	}
	return info, nil
}

// FloorCycle implements driver.Floorer: the least a correct etcd lock does, with the
// same client and none of dlock: one create-if-absent transaction bound to a lease
// granted beforehand, then a delete. Benchmarks compare a Lock+Release cycle with it.
func (b *Backend) FloorCycle(ctx context.Context, key string) error {
	s, err := b.session(ctx, 15*time.Second)
	if err != nil {
		return err
	}
	k := b.prefix + "/\x00floor/" + key // in the prefix range, in no lock's
	resp, err := b.cli.Txn(ctx).
		If(clientv3.Compare(clientv3.CreateRevision(k), "=", 0)).
		Then(clientv3.OpPut(k, "floor", clientv3.WithLease(s.id))).
		Commit()
	if err != nil {
		return err
	}
	if !resp.Succeeded {
		return fmt.Errorf("floor key %q held", k)
	}
	_, err = b.cli.Delete(ctx, k)
	return err
}
