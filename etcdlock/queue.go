package etcdlock

import (
	"context"
	"errors"

	"go.etcd.io/etcd/api/v3/mvccpb"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/dlockio/dlock/driver"
)

// firstHint is a member of a lock that an attempt read as first, which it stays for
// as long as its key exists with the same create revision.
type firstHint struct {
	name string
	rev  int64
}

// maxFirstHints bounds Backend.firsts (one entry per lock waited on with Resume).
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
// onto session s if it is on another, or gives it the request's value (put, see
// rewrite), checks a first member the request may
// resume, and watches that member. done is false when the history has no answer
// (compacted, or no tail then): the caller reads the queue instead.
func (b *Backend) requeue(ctx context.Context, req driver.Request, s *session, w *waiter, mine *mvccpb.KeyValue, member string, put clientv3.Op) (g driver.Grant, done bool, err error) {
	prefix := b.LockPrefix(req.Key)
	rev := mine.CreateRevision
	ops := []clientv3.Op{clientv3.OpGet(tailKey(prefix), clientv3.WithRev(rev-1))}
	var hint firstHint
	if req.Resume {
		if hint = b.firstHint(prefix); hint.name != "" {
			ops = append(ops, clientv3.OpGet(hint.name))
		}
	}
	if rewrite(mine, s, req) {
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
	if req.Resume {
		var hinted *mvccpb.KeyValue
		if hint.name != "" {
			hinted = firstKV(resp.Responses[1])
		}
		if g, done, err := b.resumeFirst(ctx, req, s, member, hint, hinted, resp.Header.Revision, rev); done {
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
	prefix := b.LockPrefix(req.Key)
	ops := []clientv3.Op{predecessorOp(prefix, rev)}
	if req.Resume {
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
	if req.Resume {
		if g, done, err := b.resumeCallers(ctx, req, s, firstKV(resp.Responses[1]), member); done {
			return g, err
		}
	}
	// Without Resume, a holder of the same owner id (another client or
	// process) is like any other: the own member key waits behind it.
	if w != nil {
		w.placed(ahead)
		w.follow(string(pred.Key), pred.CreateRevision, resp.Header.Revision, s, rev, member)
	}
	return driver.Grant{}, &driver.HeldError{Ahead: ahead, Queued: true}
}

// Queue implements driver.Queuer: the members of the lock that do not hold, in
// create-revision order (the order they are served in), a reader's marked Shared,
// each with its owner and value. One read of every member with its value, sorted
// by create revision; the holders are decided from it as Holders decides them (the
// first member, the first N of a semaphore of N, or the readers at the front). A
// place lives as long as its session lease, which its client keeps alive whether
// or not its owner attempts again, so TTL is 0 (unknown). A member whose lease
// lapsed is gone from etcd, as it is for the acquire logic.
func (b *Backend) Queue(ctx context.Context, key string) ([]driver.Info, error) {
	ctx, cancel := b.opCtx(ctx)
	defer cancel()
	prefix := b.LockPrefix(key)
	var g *clientv3.GetResponse
	err := b.retry(ctx, func(ctx context.Context) (err error) {
		g, err = b.cli.Get(ctx, prefix, clientv3.WithPrefix(),
			clientv3.WithSort(clientv3.SortByCreateRevision, clientv3.SortAscend))
		return err
	})
	if err != nil {
		return nil, wrap("queue", key, err)
	}
	return queueOf(key, g.Kvs), nil
}

// queueOf returns the places among kvs, the members of the lock of key sorted by
// create revision: those after the holders.
func queueOf(key string, kvs []*mvccpb.KeyValue) []driver.Info {
	if len(kvs) == 0 {
		return nil
	}
	held := heldCount(kvs)
	places := make([]driver.Info, 0, len(kvs)-held)
	for _, kv := range kvs[held:] {
		owner, value := splitMember(kv.Value)
		places = append(places, driver.Info{
			Key: key, Owner: owner, Waiters: -1, Value: value, Shared: sharedOf(kv.Value),
		})
	}
	return places
}

// heldCount returns how many of kvs, the members of a lock sorted by create
// revision, hold it: the first member, the first N of a semaphore of N, or the
// readers at the front.
func heldCount(kvs []*mvccpb.KeyValue) int {
	if len(kvs) == 0 {
		return 0
	}
	if !sharedOf(kvs[0].Value) {
		return min(limitOf(kvs[0].Value), len(kvs))
	}
	held := 0
	for held < len(kvs) && sharedOf(kvs[held].Value) {
		held++
	}
	return held
}
