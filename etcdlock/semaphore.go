package etcdlock

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"time"

	"go.etcd.io/etcd/api/v3/mvccpb"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/dlockio/dlock/driver"
)

// errStaleLimit means that an attempt was refused by a limit key or a tail left
// behind on a lock without members (see limitSep): clear them and try again.
var errStaleLimit = errors.New("stale limit key")

// limitMismatch is the error of an attempt with limit want on a lock of limit have.
func limitMismatch(have, want int) error {
	return fmt.Errorf("%w: the key has limit %d, the attempt asked for %d", driver.ErrLimitMismatch, have, want)
}

// countOp counts the members of a lock (etcd's in-memory index only).
func countOp(prefix string) clientv3.Op {
	return clientv3.OpGet(prefix, clientv3.WithPrefix(), clientv3.WithCountOnly())
}

// aheadOp reads the keys of the members created before rev, at most limit of them
// when limit > 0 (etcd filters by create revision before it applies the limit;
// a count would not be filtered).
func aheadOp(prefix string, rev int64, limit int) clientv3.Op {
	opts := []clientv3.OpOption{clientv3.WithPrefix(), clientv3.WithMaxCreateRev(rev - 1), clientv3.WithKeysOnly()}
	if limit > 0 {
		opts = append(opts, clientv3.WithLimit(int64(limit)))
	}
	return clientv3.OpGet(prefix, opts...)
}

// clearStale deletes the limit key and the tail of a lock that has no members.
func (b *Backend) clearStale(ctx context.Context, prefix string) error {
	_, err := b.cli.Txn(ctx).
		If(clientv3.Compare(clientv3.CreateRevision(prefix), "=", 0).WithPrefix()).
		Then(clientv3.OpDelete(limitKey(prefix)), clientv3.OpDelete(tailKey(prefix))).
		Commit()
	return err
}

// limitConflict is the end of an attempt with limit want that the limit key
// refused and that created nothing: it reads the members and the limit key, and
// returns the mismatch if members are there, else clears the stale limit key and
// returns errStaleLimit.
func (b *Backend) limitConflict(ctx context.Context, prefix string, want int) error {
	resp, err := b.cli.Txn(ctx).Then(countOp(prefix), clientv3.OpGet(limitKey(prefix))).Commit()
	if err != nil {
		return err
	}
	if resp.Responses[0].GetResponseRange().GetCount() == 0 {
		if err := b.clearStale(ctx, prefix); err != nil {
			return err
		}
		return errStaleLimit
	}
	have := 1
	if lk := firstKV(resp.Responses[1]); lk != nil {
		have, _ = strconv.Atoi(string(lk.Value))
	}
	if have == want {
		return errors.New("the lock's limit changed during the attempt") // transient
	}
	return limitMismatch(have, want)
}

// semAttempt is attempt for a semaphore of req.Limit: the first req.Limit members by
// create revision hold it (see Semaphores in the package documentation).
//
// Its transaction creates the member key (a waiting attempt's) and counts the
// members already there, guarded by "the own member key does not exist" and "the
// limit key says req.Limit". A TryLock counts first and creates only if fewer than
// the limit are there, guarded also by "no member created since the count", so it
// never queues. If the limit key says otherwise, the attempt changed nothing: on a
// lock without members it writes the limit key with its own member (guarded by "no
// member"), else it fails with ErrLimitMismatch.
func (b *Backend) semAttempt(ctx context.Context, req driver.Request, s *session, w *waiter) (driver.Grant, error) {
	prefix := b.LockPrefix(req.Key)
	member := b.name(driver.Holder{Key: req.Key, Owner: req.Owner})
	if w != nil {
		if g, done, err := b.semPlaced(ctx, req, s, w, prefix, member); done {
			return g, err
		}
	}
	lkey, limit := limitKey(prefix), strconv.Itoa(req.Limit)
	put := clientv3.OpPut(member, memberValue(req.Owner, req.Limit, req.Value), clientv3.WithLease(s.id))
	absent := clientv3.Compare(clientv3.CreateRevision(member), "=", 0)
	isLimit := clientv3.Compare(clientv3.Value(lkey), "=", limit)
	for range 4 {
		then := []clientv3.Op{countOp(prefix)}
		if req.Wait {
			then = append(then, put)
		}
		resp, err := b.cli.Txn(ctx).
			If(absent, isLimit).
			Then(then...).
			Else(clientv3.OpGet(member), clientv3.OpGet(lkey), countOp(prefix)).
			Commit()
		if err != nil {
			return driver.Grant{}, leaseErr(err)
		}
		if resp.Succeeded {
			count, rev := resp.Responses[0].GetResponseRange().GetCount(), resp.Header.Revision
			if req.Wait {
				return b.semQueued(req, s, w, member, rev, int(count), rev)
			}
			if int(count) >= req.Limit {
				return driver.Grant{}, &driver.HeldError{}
			}
			resp, err := b.cli.Txn(ctx).
				If(absent, isLimit, clientv3.Compare(clientv3.CreateRevision(prefix), "<", rev+1).WithPrefix()).
				Then(put).
				Commit()
			if err != nil {
				return driver.Grant{}, leaseErr(err)
			}
			if resp.Succeeded {
				return driver.Grant{Token: uint64(resp.Header.Revision), Lost: s.done}, nil
			}
			continue // someone came or went meanwhile: count again
		}
		if mine := firstKV(resp.Responses[0]); mine != nil {
			return b.semExists(ctx, req, s, w, member, mine, put)
		}
		if resp.Responses[2].GetResponseRange().GetCount() > 0 {
			have := 1
			if lk := firstKV(resp.Responses[1]); lk != nil {
				have, _ = strconv.Atoi(string(lk.Value))
			}
			if have != req.Limit {
				return driver.Grant{}, limitMismatch(have, req.Limit)
			}
			continue // the limit key came meanwhile
		}
		// No member: this attempt sets the limit.
		resp, err = b.cli.Txn(ctx).
			If(absent, clientv3.Compare(clientv3.CreateRevision(prefix), "=", 0).WithPrefix()).
			Then(clientv3.OpPut(lkey, limit), put).
			Commit()
		if err != nil {
			return driver.Grant{}, leaseErr(err)
		}
		if resp.Succeeded {
			return driver.Grant{Token: uint64(resp.Header.Revision), Lost: s.done}, nil
		}
	}
	return driver.Grant{}, errors.New("the semaphore's members keep changing") // transient
}

// semQueued finishes a waiting attempt whose member key member was created (or
// read) at rev with ahead members created before it, as read at readRev: it holds
// a permit if fewer than the limit are ahead, else it waits (see followDeletes).
func (b *Backend) semQueued(req driver.Request, s *session, w *waiter, member string, rev int64, ahead int, readRev int64) (driver.Grant, error) {
	if ahead < req.Limit {
		return driver.Grant{Token: uint64(rev), Lost: s.done}, nil
	}
	queued := ahead - req.Limit // places queued ahead, the holders not counted
	if w != nil {
		w.placed(queued)
		w.followDeletes(b.LockPrefix(req.Key), queued+1, readRev, s, rev, member)
	}
	return driver.Grant{}, &driver.HeldError{Ahead: queued, Queued: true}
}

// semPlaced is semAttempt for a waiter w with a place in the queue under member
// (see placedAttempt): while its watch runs it reports the place without a
// request; woken, it reads (keys only, at one revision) whether its key is still
// there and how many members are ahead of it. done is false when the attempt goes
// on as a fresh one.
func (b *Backend) semPlaced(ctx context.Context, req driver.Request, s *session, w *waiter, prefix, member string) (g driver.Grant, done bool, err error) {
	rev, proceed, done, err := placeStart(s, w, member)
	if !proceed {
		return driver.Grant{}, done, err
	}
	resp, err := b.cli.Txn(ctx).
		Then(clientv3.OpGet(member, clientv3.WithKeysOnly()), aheadOp(prefix, rev, 0)).
		Commit()
	if err != nil {
		return driver.Grant{}, true, leaseErr(err)
	}
	if mine := firstKV(resp.Responses[0]); mine == nil || mine.CreateRevision != rev {
		return driver.Grant{}, true, fmt.Errorf("%w: the waiter's member key vanished while it waited; the place in the queue is gone", ErrSessionLost)
	}
	ahead := len(resp.Responses[1].GetResponseRange().GetKvs())
	g, err = b.semQueued(req, s, w, member, rev, ahead, resp.Header.Revision)
	return g, true, err
}

// semExists finishes a semaphore attempt that found its own member key mine (a
// retry after a lost reply, a re-entry, or a place made on another session): it
// keeps the key on session s with the request's value (its create revision, the
// token, stays) and counts the members ahead of it.
func (b *Backend) semExists(ctx context.Context, req driver.Request, s *session, w *waiter, member string, mine *mvccpb.KeyValue, put clientv3.Op) (driver.Grant, error) {
	if ownerOf(mine.Value) != req.Owner {
		b.burn(driver.Holder{Key: req.Key, Owner: req.Owner}, member)
		return driver.Grant{}, errNameTaken
	}
	if have := limitOf(mine.Value); have != req.Limit {
		return driver.Grant{}, limitMismatch(have, req.Limit)
	}
	prefix := b.LockPrefix(req.Key)
	ops := []clientv3.Op{aheadOp(prefix, mine.CreateRevision, 0)}
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
	ahead := len(resp.Responses[0].GetResponseRange().GetKvs())
	if !req.Wait && ahead >= req.Limit {
		return driver.Grant{}, &driver.HeldError{}
	}
	return b.semQueued(req, s, w, member, mine.CreateRevision, ahead, resp.Header.Revision)
}

// holders reads the members of key that hold it, with their values, oldest first,
// and the number of members: the first member, for a semaphore the first limit,
// and for readers the run of readers at the front.
func (b *Backend) holders(ctx context.Context, key string) (limit int, kvs []*mvccpb.KeyValue, count int64, err error) {
	prefix := b.LockPrefix(key)
	for {
		var resp *clientv3.TxnResponse
		err := b.retry(ctx, func(ctx context.Context) (err error) {
			resp, err = b.cli.Txn(ctx).Then(firstOp(prefix), countOp(prefix)).Commit()
			return err
		})
		if err != nil {
			return 0, nil, 0, err
		}
		first := firstKV(resp.Responses[0])
		if first == nil {
			return 0, nil, 0, nil
		}
		count = resp.Responses[1].GetResponseRange().GetCount()
		limit = limitOf(first.Value)
		if sharedOf(first.Value) {
			if kvs, n, err := b.readers(ctx, prefix); err != nil || len(kvs) > 0 {
				return 1, kvs, n, err
			}
			continue // every member left between the reads: read again
		}
		if limit == 1 {
			return 1, []*mvccpb.KeyValue{first}, count, nil
		}
		var g *clientv3.GetResponse
		err = b.retry(ctx, func(ctx context.Context) (err error) {
			g, err = b.cli.Get(ctx, prefix, clientv3.WithPrefix(),
				clientv3.WithSort(clientv3.SortByCreateRevision, clientv3.SortAscend), clientv3.WithLimit(int64(limit)))
			return err
		})
		if err != nil {
			return 0, nil, 0, err
		}
		if len(g.Kvs) > 0 && limitOf(g.Kvs[0].Value) == limit {
			return limit, g.Kvs, max(count, int64(len(g.Kvs))), nil
		}
		// Every member left between the reads: read again.
	}
}

// Holders implements driver.Semaphorer: the first member of the lock, or for a
// semaphore the first limit members, or the readers at the front, oldest grant
// first, each with its lease's remaining TTL; Waiters counts the queued places. Two
// reads (one for a mutex; for readers the second reads every member), and one lease
// query per distinct lease.
func (b *Backend) Holders(ctx context.Context, key string) (int, []driver.Info, error) {
	ctx, cancel := b.opCtx(ctx)
	defer cancel()
	limit, kvs, count, err := b.holders(ctx, key)
	if err != nil {
		return 0, nil, wrap("holders", key, err)
	}
	if len(kvs) == 0 {
		return 0, nil, nil
	}
	infos, err := b.holderInfos(ctx, key, kvs, int(max(count-int64(len(kvs)), 0)), map[int64]time.Duration{}, nil)
	if err != nil {
		return 0, nil, wrap("holders", key, err)
	}
	return limit, infos, nil
}

// holderInfos appends to infos one Info per member in kvs, the holders of key
// oldest first, each with waiters and its lease's remaining TTL (ttls caches the
// leases asked about).
func (b *Backend) holderInfos(ctx context.Context, key string, kvs []*mvccpb.KeyValue, waiters int, ttls map[int64]time.Duration, infos []driver.Info) ([]driver.Info, error) {
	for _, kv := range kvs {
		owner, value := splitMember(kv.Value)
		ttl, err := b.leaseTTL(ctx, kv.Lease, ttls)
		if err != nil {
			return nil, err
		}
		infos = append(infos, driver.Info{
			Key: key, Owner: owner, Token: uint64(kv.CreateRevision),
			TTL: ttl, Waiters: waiters, Value: value, Shared: sharedOf(kv.Value),
		})
	}
	return infos, nil
}

// leaseTTL returns the remaining TTL of lease id (0 for none), asking etcd once per
// lease (seen caches the answers).
func (b *Backend) leaseTTL(ctx context.Context, id int64, seen map[int64]time.Duration) (time.Duration, error) {
	if id == 0 {
		return 0, nil
	}
	if ttl, ok := seen[id]; ok {
		return ttl, nil
	}
	var tr *clientv3.LeaseTimeToLiveResponse
	err := b.retry(ctx, func(ctx context.Context) (err error) {
		tr, err = b.cli.TimeToLive(ctx, clientv3.LeaseID(id))
		return err
	})
	if err != nil {
		return 0, err
	}
	ttl := time.Duration(max(tr.TTL, 0)) * time.Second
	seen[id] = ttl
	return ttl, nil
}

// readers reads every member of a read-write lock whose first member is a reader,
// sorted by create revision, and returns the readers ahead of the first writer (the
// holders) and the number of members.
func (b *Backend) readers(ctx context.Context, prefix string) ([]*mvccpb.KeyValue, int64, error) {
	var g *clientv3.GetResponse
	err := b.retry(ctx, func(ctx context.Context) (err error) {
		g, err = b.cli.Get(ctx, prefix, clientv3.WithPrefix(),
			clientv3.WithSort(clientv3.SortByCreateRevision, clientv3.SortAscend))
		return err
	})
	if err != nil {
		return nil, 0, err
	}
	n := 0
	for n < len(g.Kvs) && sharedOf(g.Kvs[n].Value) {
		n++
	}
	return g.Kvs[:n], int64(len(g.Kvs)), nil
}
