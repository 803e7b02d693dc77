// Package etcdfence is dlock's fencing guard for etcd v3, on go.etcd.io/etcd/client/v3:
// a transaction builder whose compare is the resource's fence (and, optionally, the
// lock holder's member key), to which the caller adds its own operations. The fence
// update is part of the same transaction.
//
// # Guarantees
//
//   - A transaction committed through Txn.Commit applies the caller's operations only
//     if the fence key holds no token higher than the caller's, and then the fence
//     key holds the caller's token; etcd evaluates the compares and applies the
//     operations atomically (one Raft entry). Equal tokens pass. One round trip,
//     except for the first write of a resource and a race on the fence key's
//     creation or deletion, which retry.
//   - With Holder, the transaction also requires that the lock's member key still
//     exists with the grant's create revision, like concurrency.Mutex.IsOwner: a
//     holder whose lock was lost fails even before any newer holder has written.
//     This works when the lock lives in the same etcd as the resource.
//   - Tokens are stored as 20 zero-padded decimal digits, so etcd's byte-wise value
//     comparison orders them exactly for every uint64.
//
// # Not promised
//
//   - Operations outside the transaction are not fenced, and neither are writes of
//     the same keys by programs that do not use the fence key.
//   - A delete of the fence key (by hand, or a DeleteRange over it) resets the
//     resource: the next write passes whatever its token.
package etcdfence

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"strconv"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/dlockio/dlock/driver"
	"github.com/dlockio/dlock/fence"
)

const guardName = "etcdfence"

// ErrConditionFailed: the fence and the holder passed, but one of the caller's own
// compares (Txn.If) did not; nothing was written. The error comes with the
// transaction's response.
var ErrConditionFailed = errors.New("dlock: fence: etcdfence: a compare of the caller failed")

// attempts bounds the retries on races with the fence key's creation or deletion.
const attempts = 8

// Txn is a fenced transaction. Build it with New, add compares and operations, then
// Commit once. It is not safe for concurrent use.
type Txn struct {
	kv       clientv3.KV
	key      string
	token    uint64
	member   string
	rev      int64
	cmps     []clientv3.Cmp
	ops      []clientv3.Op
	enc, lim string
}

// New starts a transaction guarded by fenceKey with token (a dlock Lease's Token, or
// the create revision of a concurrency.Mutex's key).
func New(kv clientv3.KV, fenceKey string, token uint64) *Txn {
	enc := fence.Encode(token)
	// "stored <= token" as etcd can compare it: stored < enc+"\x00", since a string
	// is below its own extension and the stored value has the same length as enc.
	return &Txn{kv: kv, key: fenceKey, token: token, enc: enc, lim: enc + "\x00"}
}

// Holder makes the transaction also require that memberKey exists with create
// revision rev: the lock is still held by the grant that owns that key. For a dlock
// etcdlock lease, Member finds the key; for a concurrency.Mutex, pass m.Key() and
// m.Header().Revision.
func (t *Txn) Holder(memberKey string, rev int64) *Txn {
	t.member, t.rev = memberKey, rev
	return t
}

// If adds the caller's own compares.
func (t *Txn) If(cmps ...clientv3.Cmp) *Txn {
	t.cmps = append(t.cmps, cmps...)
	return t
}

// Then adds the caller's operations, applied only if every compare holds.
func (t *Txn) Then(ops ...clientv3.Op) *Txn {
	t.ops = append(t.ops, ops...)
	return t
}

// Commit runs the transaction. On success the response's Responses hold the replies
// to the caller's operations, in order (the fence's own put is removed). Otherwise
// nothing was written and the error is a *fence.StaleError (matching fence.ErrStale)
// when the fence holds a higher token, an error matching dlock.ErrNotHeld when the
// holder's member key is gone or was re-created, ErrConditionFailed (with the
// response) when a compare of the caller failed, fence.ErrNoToken for token 0, or an
// error matching fence.ErrInvalid for a bad fence key or an operation on it.
func (t *Txn) Commit(ctx context.Context) (*clientv3.TxnResponse, error) {
	if err := fence.CheckToken(t.token); err != nil {
		return nil, err
	}
	if err := fence.CheckResource(guardName, t.key); err != nil {
		return nil, err
	}
	for _, op := range t.ops {
		if (op.IsPut() || op.IsDelete()) && string(op.KeyBytes()) == t.key {
			return nil, fence.Invalid(guardName, "an operation writes the fence key %q itself", t.key)
		}
	}
	exists := true // the steady state: the fence key is there
	for range attempts {
		fc := clientv3.Compare(clientv3.Value(t.key), "<", t.lim)
		if !exists {
			fc = clientv3.Compare(clientv3.CreateRevision(t.key), "=", 0)
		}
		cmps := append([]clientv3.Cmp{fc}, t.cmps...)
		orElse := []clientv3.Op{clientv3.OpGet(t.key)}
		if t.member != "" {
			cmps = append(cmps, clientv3.Compare(clientv3.CreateRevision(t.member), "=", t.rev))
			orElse = append(orElse, clientv3.OpGet(t.member, clientv3.WithKeysOnly()))
		}
		then := append([]clientv3.Op{clientv3.OpPut(t.key, t.enc)}, t.ops...)
		resp, err := t.kv.Txn(ctx).If(cmps...).Then(then...).Else(orElse...).Commit()
		if err != nil {
			return nil, err
		}
		if resp.Succeeded {
			resp.Responses = resp.Responses[1:]
			return resp, nil
		}
		kvs := resp.Responses[0].GetResponseRange().GetKvs()
		fenceOK := !exists
		if len(kvs) == 1 {
			cur, err := fence.Decode(string(kvs[0].Value))
			if err != nil {
				return nil, fmt.Errorf("%w (key %q)", err, t.key)
			}
			if !fence.Admits(cur, t.token) {
				return nil, &fence.StaleError{Resource: t.key, Token: t.token, Current: cur}
			}
			fenceOK = exists
		}
		if t.member != "" {
			mk := resp.Responses[1].GetResponseRange().GetKvs()
			if len(mk) != 1 || mk[0].CreateRevision != t.rev {
				return nil, fmt.Errorf("%w: %s: the lock's member key %q is gone or was re-created (create revision %d): the lease is lost", driver.ErrNotHeld, guardName, t.member, t.rev)
			}
		}
		if fenceOK {
			return resp, ErrConditionFailed
		}
		exists = len(kvs) == 1 // the fence key appeared or vanished since: again
	}
	return nil, fmt.Errorf("dlock: fence: %s: the fence key %q kept changing between existing and not, %d attempts", guardName, t.key, attempts)
}

// Member returns the key of the lock member that holds the lock under lockPrefix
// with create revision token, for Holder: for a dlock etcdlock lease, lockPrefix is
// Backend.LockPrefix(lease.Key()) and token the lease's Token. It costs one read,
// once per lease. If the first member under the prefix has another create revision
// (the lease is lost, or was never this lock's), the error matches
// dlock.ErrNotHeld. It is for a holder that holds the key alone: a mutex's, or a
// read-write lock's writer; a semaphore's permits and a read-write lock's readers
// hold beside others, and no token orders their writes.
func Member(ctx context.Context, kv clientv3.KV, lockPrefix string, token uint64) (string, error) {
	if err := fence.CheckToken(token); err != nil {
		return "", err
	}
	resp, err := kv.Get(ctx, lockPrefix, clientv3.WithPrefix(), clientv3.WithKeysOnly(),
		clientv3.WithSort(clientv3.SortByCreateRevision, clientv3.SortAscend), clientv3.WithLimit(1))
	if err != nil {
		return "", err
	}
	if len(resp.Kvs) == 0 || resp.Kvs[0].CreateRevision != int64(token) || !bytes.HasPrefix(resp.Kvs[0].Key, []byte(lockPrefix)) {
		first := "none"
		if len(resp.Kvs) > 0 {
			first = strconv.FormatInt(resp.Kvs[0].CreateRevision, 10)
		}
		return "", fmt.Errorf("%w: %s: the holder under %q has create revision %s, not %d", driver.ErrNotHeld, guardName, lockPrefix, first, token)
	}
	return string(resp.Kvs[0].Key), nil
}
