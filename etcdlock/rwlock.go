package etcdlock

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"

	"go.etcd.io/etcd/api/v3/mvccpb"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/dlockio/dlock/driver"
)

var _ driver.Sharer = (*Backend)(nil)

// Shares implements driver.Sharer: the backend honours driver.Request.Shared (see
// Read-write locks in the package documentation).
func (b *Backend) Shares() bool { return true }

// readersInTxn is how many members a waiting reader's write reads (the range
// read last in create's transaction, in key order, with values). When the lock
// has no more members than that, they are every member ahead of the reader, and
// the attempt needs no read of its own; with more, it reads those ahead in a
// read-only transaction, as before. The bound keeps what etcd's apply loop reads
// per write small however many members queue (see create): 1,000 readers queued at
// once behind a writer took 0.50-0.74 s with a bound of 16 to 64, 0.54-0.63 s
// without the read (one run each, alternated, twice; within the noise).
var readersInTxn atomic.Int64 // 32; tests change it (SetReadersInTxn); 0 reads none

func init() { readersInTxn.Store(32) }

// aheadValuesOp reads the members created before rev, with their values (which
// tell a reader from a writer).
func aheadValuesOp(prefix string, rev int64) clientv3.Op {
	return clientv3.OpGet(prefix, clientv3.WithPrefix(), clientv3.WithMaxCreateRev(rev-1))
}

// sharedAttempt is attempt for a reader of a read-write lock (driver.Request.Shared):
// its member key, tagged as a reader's (see readerValue), holds when no writer's
// member was created before it. A waiting attempt writes as a mutex's does (create:
// the member key, the count, the tail) and reads the first readersInTxn members in
// the same transaction; when members were there, those are the ones ahead if they
// are all, else it reads those ahead of it, with their values, in a read-only
// transaction: none of them a writer, it holds; else it watches the nearest writer
// ahead. A TryLock creates its key if the lock has no member, as a mutex's does; if
// the first member is a reader it reads every member and creates its key only if
// none is a writer, guarded by "no member created since", so it never queues.
func (b *Backend) sharedAttempt(ctx context.Context, req driver.Request, s *session, w *waiter) (driver.Grant, error) {
	prefix := b.LockPrefix(req.Key)
	member := b.name(driver.Holder{Key: req.Key, Owner: req.Owner})
	if w != nil {
		if g, done, err := b.sharedPlaced(ctx, req, s, w, prefix, member); done {
			return g, err
		}
	}
	put := clientv3.OpPut(member, readerValue(req.Owner, req.Value), clientv3.WithLease(s.id))
	plain := req
	plain.Reenter, plain.Resume = false, false // a reader's grant under another client's name is not resumed
	resp, _, err := b.create(ctx, plain, s, prefix, member, put)
	if err != nil {
		return driver.Grant{}, leaseErr(err)
	}
	if !resp.Succeeded {
		mine := firstKV(resp.Responses[0])
		if mine == nil {
			if req.Wait {
				// Refused by the limit key, not by the own member key.
				return driver.Grant{}, b.limitConflict(ctx, prefix, 1)
			}
			return driver.Grant{}, errors.New("member key vanished during the read") // transient
		}
		return b.sharedExists(ctx, req, s, w, prefix, member, mine, put)
	}
	rev := resp.Header.Revision
	if req.Wait {
		if resp.Responses[0].GetResponseRange().GetCount() == 0 {
			return driver.Grant{Token: uint64(rev), Lost: s.done}, nil
		}
		if read := resp.Responses[len(resp.Responses)-1].GetResponseRange(); read != nil && !read.GetMore() {
			// Every member was read with the write: those created before it are
			// the ones ahead.
			var ahead []*mvccpb.KeyValue
			for _, kv := range read.GetKvs() {
				if kv.CreateRevision < rev {
					ahead = append(ahead, kv)
				}
			}
			return sharedPlace(s, w, member, rev, ahead, rev)
		}
		r, err := b.cli.Txn(ctx).Then(aheadValuesOp(prefix, rev)).Commit()
		if err != nil {
			return driver.Grant{}, leaseErr(err)
		}
		return sharedPlace(s, w, member, rev, r.Responses[0].GetResponseRange().GetKvs(), r.Header.Revision)
	}
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
	case !sharedOf(first.Value):
		return driver.Grant{}, &driver.HeldError{}
	}
	return b.sharedTry(ctx, s, prefix, member, put)
}

// sharedTry is a reader's TryLock on a lock whose first member is a reader: it
// reads every member and, if none is a writer, creates its member key (and sets the
// tail), guarded by "no member created since the read", "the own key does not
// exist" and "no limit key".
func (b *Backend) sharedTry(ctx context.Context, s *session, prefix, member string, put clientv3.Op) (driver.Grant, error) {
	for range 4 {
		g, err := b.cli.Get(ctx, prefix, clientv3.WithPrefix())
		if err != nil {
			return driver.Grant{}, leaseErr(err)
		}
		for _, kv := range g.Kvs {
			if limit := limitOf(kv.Value); limit > 1 {
				return driver.Grant{}, limitMismatch(limit, 1)
			}
			if !sharedOf(kv.Value) {
				return driver.Grant{}, &driver.HeldError{}
			}
		}
		resp, err := b.cli.Txn(ctx).
			If(clientv3.Compare(clientv3.CreateRevision(member), "=", 0),
				clientv3.Compare(clientv3.CreateRevision(limitKey(prefix)), "=", 0),
				clientv3.Compare(clientv3.CreateRevision(prefix), "<", g.Header.Revision+1).WithPrefix()).
			Then(put, tailPut(prefix, member, s)).
			Commit()
		if err != nil {
			return driver.Grant{}, leaseErr(err)
		}
		if resp.Succeeded {
			return driver.Grant{Token: uint64(resp.Header.Revision), Lost: s.done}, nil
		}
		// A member came meanwhile: read again.
	}
	return driver.Grant{}, &driver.HeldError{}
}

// sharedPlace finishes a reader's attempt whose member key member was created at
// rev on session s, given the members ahead of it (with values) as read at
// readRev: with no writer among them it holds; else waiter w, if any, watches the
// nearest writer ahead (the one created last), whose delete is the earliest moment
// the reader may hold.
func sharedPlace(s *session, w *waiter, member string, rev int64, ahead []*mvccpb.KeyValue, readRev int64) (driver.Grant, error) {
	var nearest, oldest *mvccpb.KeyValue // writers
	for _, kv := range ahead {
		if limit := limitOf(kv.Value); limit > 1 {
			return driver.Grant{}, limitMismatch(limit, 1)
		}
		if sharedOf(kv.Value) {
			continue
		}
		if nearest == nil || kv.CreateRevision > nearest.CreateRevision {
			nearest = kv
		}
		if oldest == nil || kv.CreateRevision < oldest.CreateRevision {
			oldest = kv
		}
	}
	if nearest == nil {
		return driver.Grant{Token: uint64(rev), Lost: s.done}, nil
	}
	// The holders: the readers before the oldest writer, or that writer.
	holders := 0
	for _, kv := range ahead {
		if kv.CreateRevision < oldest.CreateRevision {
			holders++
		}
	}
	queued := len(ahead) - max(holders, 1)
	if w != nil {
		w.placed(queued)
		w.follow(string(nearest.Key), nearest.CreateRevision, readRev, s, rev, member)
	}
	return driver.Grant{}, &driver.HeldError{Ahead: queued, Queued: true}
}

// sharedPlaced is sharedAttempt for a waiter w with a place in the queue under
// member (see placedAttempt): while its watch runs it reports the place without a
// request; woken, it reads (at one revision) whether its key is still there and
// the members ahead of it. done is false when the attempt goes on as a fresh one.
func (b *Backend) sharedPlaced(ctx context.Context, req driver.Request, s *session, w *waiter, prefix, member string) (g driver.Grant, done bool, err error) {
	rev, proceed, done, err := placeStart(s, w, member)
	if !proceed {
		return driver.Grant{}, done, err
	}
	resp, err := b.cli.Txn(ctx).
		Then(clientv3.OpGet(member, clientv3.WithKeysOnly()), aheadValuesOp(prefix, rev)).
		Commit()
	if err != nil {
		return driver.Grant{}, true, leaseErr(err)
	}
	if mine := firstKV(resp.Responses[0]); mine == nil || mine.CreateRevision != rev {
		return driver.Grant{}, true, fmt.Errorf("%w: the waiter's member key vanished while it waited; the place in the queue is gone", ErrSessionLost)
	}
	g, err = sharedPlace(s, w, member, rev, resp.Responses[1].GetResponseRange().GetKvs(), resp.Header.Revision)
	return g, true, err
}

// sharedExists finishes a reader's attempt that found its own member key mine (a
// retry after a lost reply, a re-entry, or a place made on another session): it
// keeps the key on session s with the request's value (its create revision, the
// token, stays) and reads the members ahead of it.
func (b *Backend) sharedExists(ctx context.Context, req driver.Request, s *session, w *waiter, prefix, member string, mine *mvccpb.KeyValue, put clientv3.Op) (driver.Grant, error) {
	if ownerOf(mine.Value) != req.Owner {
		b.burn(driver.Holder{Key: req.Key, Owner: req.Owner}, member)
		return driver.Grant{}, errNameTaken
	}
	if !sharedOf(mine.Value) {
		// The owner holds or waits for the key as a writer through this client:
		// never turn that member into a reader's.
		return driver.Grant{}, &driver.HeldError{}
	}
	ops := []clientv3.Op{aheadValuesOp(prefix, mine.CreateRevision)}
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
	g, err := sharedPlace(s, w, member, mine.CreateRevision, resp.Responses[0].GetResponseRange().GetKvs(), resp.Header.Revision)
	var held *driver.HeldError
	if !req.Wait && errors.As(err, &held) {
		return driver.Grant{}, &driver.HeldError{} // a TryLock is not queued
	}
	return g, err
}
