package etcdlock

import (
	"context"
	"errors"
	"fmt"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/dlockio/dlock/driver"
)

var _ driver.MultiAcquirer = (*Backend)(nil)

// AcquireAll implements driver.MultiAcquirer: one etcd transaction whose
// conditions say that every lock of the set is free (freeCmp: no member, as a
// TryLock finds it) and that writes, on the session lease, every member key and
// its tail (a single TryLock's grant writes no tail; the set's release deletes
// each tail with its key). So each key's token is the transaction's
// revision, its create revision; the grants are tracked here like Acquire's. A set
// with a key taken writes nothing and fails with a *driver.HeldError naming the
// first such key.
func (b *Backend) AcquireAll(ctx context.Context, reqs []driver.Request) ([]driver.Grant, error) {
	if b.isClosed() {
		return nil, driver.ErrClosed
	}
	if len(reqs) == 0 {
		return nil, nil
	}
	ctx, cancel := b.opCtx(ctx)
	defer cancel()
	for range 4 {
		s, err := b.session(ctx, reqs[0].TTL)
		if err != nil {
			b.freeNames(reqs)
			return nil, wrapAll(reqs, err)
		}
		var gs []driver.Grant
		err = b.retry(ctx, func(ctx context.Context) (err error) {
			gs, err = b.attemptAll(ctx, reqs, s)
			return err
		})
		var held *driver.HeldError
		switch {
		case err == nil:
			for i, req := range reqs {
				b.track(driver.Holder{Key: req.Key, Owner: req.Owner}, int64(gs[i].Token), 1, false, false, s, req.TTL)
			}
			return gs, nil
		case errors.Is(err, errLeaseGone):
			s.end(fmt.Errorf("%w: the server no longer has lease %x", ErrSessionLost, int64(s.id)), false)
		case errors.As(err, &held):
			b.freeNames(reqs) // nothing was written
			return nil, err
		default:
			// The outcome is unknown: the member keys may have been written.
			for _, req := range reqs {
				b.orphan(driver.Holder{Key: req.Key, Owner: req.Owner}, s, req.TTL)
			}
			return nil, wrapAll(reqs, err)
		}
	}
	b.freeNames(reqs)
	return nil, wrapAll(reqs, fmt.Errorf("%w: sessions keep ending", ErrSessionLost))
}

// wrapAll is the error of AcquireAll for reqs that no key of the set explains.
func wrapAll(reqs []driver.Request, err error) error {
	return fmt.Errorf("etcdlock: acquire %d keys from %q: %w", len(reqs), reqs[0].Key, err)
}

// freeNames releases the member key names of reqs that nothing here answers for.
func (b *Backend) freeNames(reqs []driver.Request) {
	for _, req := range reqs {
		b.freeName(driver.Holder{Key: req.Key, Owner: req.Owner})
	}
}

// attemptAll is one try of AcquireAll on session s. It is idempotent: run again
// after a lost reply, it finds the member keys the first run wrote, all created at
// one revision, and returns that grant.
func (b *Backend) attemptAll(ctx context.Context, reqs []driver.Request, s *session) ([]driver.Grant, error) {
	for range 4 {
		members := make([]string, len(reqs))
		cmps := make([]clientv3.Cmp, len(reqs))
		writes := make([]clientv3.Op, 0, 2*len(reqs))
		reads := make([]clientv3.Op, 0, 2*len(reqs))
		for i, req := range reqs {
			prefix := b.LockPrefix(req.Key)
			members[i] = b.name(driver.Holder{Key: req.Key, Owner: req.Owner})
			cmps[i] = freeCmp(prefix)
			writes = append(writes, mutexPut(members[i], req, s), tailPut(prefix, members[i], s))
			reads = append(reads, countOp(prefix), clientv3.OpGet(members[i]))
		}
		resp, err := b.cli.Txn(ctx).If(cmps...).Then(writes...).Else(reads...).Commit()
		if err != nil {
			return nil, leaseErr(err)
		}
		if resp.Succeeded {
			return grantsAt(len(reqs), resp.Header.Revision, s), nil
		}
		gs, err := b.refusedAll(ctx, reqs, members, resp, s)
		if !errors.Is(err, errStaleLimit) && !errors.Is(err, errNameTaken) {
			return gs, err
		}
	}
	return nil, errors.New("the set's locks keep changing") // transient
}

// grantsAt returns n grants made on session s at revision rev.
func grantsAt(n int, rev int64, s *session) []driver.Grant {
	gs := make([]driver.Grant, n)
	for i := range gs {
		gs[i] = driver.Grant{Token: uint64(rev), Lost: s.done}
	}
	return gs
}

// refusedAll finishes a try of AcquireAll whose transaction wrote nothing (resp
// holds, per request, the count of the lock's members and the own member key):
//   - every own member key is there, the owner's, created at one revision on s:
//     an earlier try's transaction went through, and that is the grant;
//   - an own member key of another owner: the name is burned (errNameTaken);
//   - a lock with members: the first such is reported taken;
//   - else a stale limit key or tail refused it: cleared (errStaleLimit).
func (b *Backend) refusedAll(ctx context.Context, reqs []driver.Request, members []string, resp *clientv3.TxnResponse, s *session) ([]driver.Grant, error) {
	var rev int64
	mine, whole := 0, true
	for i, req := range reqs {
		kv := firstKV(resp.Responses[2*i+1])
		switch {
		case kv == nil:
			whole = false
		case ownerOf(kv.Value) != req.Owner:
			b.burn(driver.Holder{Key: req.Key, Owner: req.Owner}, members[i])
			return nil, errNameTaken
		default:
			whole = whole && kv.Lease == int64(s.id) && (mine == 0 || kv.CreateRevision == rev)
			rev = kv.CreateRevision
			mine++
		}
	}
	if mine == len(reqs) && whole {
		return grantsAt(len(reqs), rev, s), nil
	}
	if mine > 0 {
		// Only an earlier try of this call wrote keys of this owner (a fresh
		// one), and some are gone or were moved: the outcome is unknown, and
		// the caller's releases clean up.
		return nil, errors.New("an earlier try wrote part of the set, or its keys are no longer one grant on this session")
	}
	for i, req := range reqs {
		if resp.Responses[2*i].GetResponseRange().GetCount() > 0 {
			return nil, wrap("acquire", req.Key, &driver.HeldError{})
		}
	}
	for _, req := range reqs {
		if err := b.clearStale(ctx, b.LockPrefix(req.Key)); err != nil {
			return nil, err
		}
	}
	return nil, errStaleLimit
}
