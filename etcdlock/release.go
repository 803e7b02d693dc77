package etcdlock

import (
	"context"
	"fmt"
	"time"

	"go.etcd.io/etcd/api/v3/mvccpb"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/dlockio/dlock/driver"
)

// Refresh implements driver.Backend. The session lease is kept alive in the
// background; Refresh checks that the grant made through this backend is still
// there: its member key exists with the grant's create revision and owner, first in
// line (for a semaphore of N, with fewer than N members ahead of it; for a reader,
// the key alone), on a live session.
func (b *Backend) Refresh(ctx context.Context, key, owner string, ttl time.Duration) error {
	ctx, cancel := b.opCtx(ctx)
	defer cancel()
	ok := driver.Holder{Key: key, Owner: owner}
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
		// For a semaphore, the keys of up to N members ahead.
		// A reader's key alone: no member can be created ahead of it, so a
		// reader that held holds while its key exists.
		ops := []clientv3.Op{clientv3.OpGet(name)}
		switch {
		case h.shared:
		case h.limit > 1:
			ops = append(ops, aheadOp(prefix, h.rev, h.limit))
		default:
			ops = append(ops, firstKeyOp(prefix))
		}
		resp, err = b.cli.Txn(ctx).Then(ops...).Commit()
		return err
	})
	if err != nil {
		return wrap("refresh", key, err)
	}
	mine, inLine := firstKV(resp.Responses[0]), true
	switch {
	case h.shared:
	case h.limit > 1:
		inLine = len(resp.Responses[1].GetResponseRange().GetKvs()) < h.limit
	default:
		first := firstKV(resp.Responses[1])
		inLine = first != nil && mine != nil && first.CreateRevision == mine.CreateRevision
	}
	var why string
	switch {
	case mine == nil:
		why = "the member key is gone (released, expired or force-released)"
	case mine.CreateRevision != h.rev || ownerOf(mine.Value) != owner:
		why = "the member key was deleted and created again"
	case !inLine && h.limit > 1:
		why = fmt.Sprintf("the member key is not among the first %d in line", h.limit)
	case !inLine:
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

// deletion is how deleteOwn deletes a member key.
type deletion int

const (
	// ifOwned: a name that is not this backend's own, or has no record here, is
	// deleted only if its value is the owner's.
	ifOwned deletion = iota
	// trusted: a name of this backend's own that it holds a record for needs no
	// check (only this backend writes it, or another that resumed its grant, with
	// the same owner); the lock's tail goes too if it names the key (see tailSep).
	trusted
	// plain: trusted, and the tail is left alone: no tail can name the key (a
	// grant that wrote none, see create), or a stale one is to stay (a withdrawn
	// wait, see waiter.Stop). One delete.
	plain
)

// deleteOwn deletes member key name if it is owner's, as how says.
func (b *Backend) deleteOwn(ctx context.Context, name, owner string, how deletion) (bool, error) {
	if how != ifOwned && !b.ours(name) {
		how = ifOwned
	}
	var deleted bool
	err := b.retry(ctx, func(ctx context.Context) error {
		switch how {
		case plain:
			resp, err := b.cli.Delete(ctx, name)
			if err == nil {
				deleted = resp.Deleted > 0
			}
			return err
		case trusted:
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
			If(ownedBy(name, owner)...).
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
// the lock with its owner id deleted. A release whose request fails is retried in
// the background; one whose context has already ended sends nothing and changes
// nothing: the grant stays until Release is called again, or until this backend
// deletes it a TTL after its last Refresh (see tracked).
func (b *Backend) Release(ctx context.Context, key, owner string) error {
	if err := ctx.Err(); err != nil {
		return wrap("release", key, err)
	}
	ctx, cancel := b.opCtx(ctx)
	defer cancel()
	ok := driver.Holder{Key: key, Owner: owner}
	name, found := b.assigned(ok)
	if !found {
		return b.releaseByOwner(ctx, key, owner)
	}
	deleted, err := b.deleteOwn(ctx, name, owner, b.deletionOf(ok))
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
		if ownerOf(kv.Value) != owner {
			continue
		}
		deleted, err := b.deleteOwn(ctx, string(kv.Key), owner, ifOwned)
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
// whoever owns it, and for a semaphore of N the first N (every holder; the places
// queued behind them then hold). The next grant has a larger create revision, so a
// fenced resource rejects the old holders.
func (b *Backend) ForceRelease(ctx context.Context, key string) error {
	ctx, cancel := b.opCtx(ctx)
	defer cancel()
	for {
		_, kvs, _, err := b.holders(ctx, key)
		if err != nil {
			return wrap("force release", key, err)
		}
		if len(kvs) == 0 {
			return wrap("force release", key, driver.ErrNotHeld)
		}
		deleted := 0
		for _, kv := range kvs {
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
				deleted++
			}
		}
		if deleted > 0 {
			return nil
		}
		// The holders left meanwhile; release whoever holds it now.
	}
}

// Inspect implements driver.Inspector. It reads the first member keys only, with
// the count, then that member's value, the owner id and the grant's value (see
// firstKeyOp): two reads of one key each instead of one that would read every
// member's value.
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
	owner, limit, value := parseMember(first.Value)
	info := driver.Info{
		Key: key, Owner: owner, Token: uint64(first.CreateRevision),
		Waiters: int(max(count-int64(limit), 0)), Value: value, Shared: sharedOf(first.Value),
	}
	if info.Shared {
		// Readers hold: count the run of them for the waiters.
		if _, kvs, n, err := b.holders(ctx, key); err != nil {
			return driver.Info{}, wrap("inspect", key, err)
		} else if len(kvs) > 0 {
			info.Waiters = int(max(n-int64(len(kvs)), 0))
		}
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
