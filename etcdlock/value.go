package etcdlock

import (
	"bytes"
	"context"
	"fmt"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/dlockio/dlock/driver"
)

// Member values.
//
// A member key's value is its owner id, followed, when the request that wrote it
// carried a value (driver.Request.Value), by the byte 0x00 and that value. An owner
// id holds no control byte (driver.ValidateOwner), so the first 0x00 ends it. A
// request without a value writes the owner id alone, as before values existed: not
// a byte more on the hot path, and clients of the older layout read such members
// as they always did. The value lives and dies with the member key: a queued place
// carries the value of the request that queued it into the grant the queue hands
// it, the next grant is another member key with its own value, and a release,
// force release or lease expiry deletes both at once.
const valueSep = "\x00"

// memberValue is the value of the member key of owner with value.
func memberValue(owner string, value []byte) string {
	if len(value) == 0 {
		return owner
	}
	return owner + valueSep + string(value)
}

// splitMember splits a member key's value into the owner id and the value (nil
// when there is none).
func splitMember(v []byte) (owner string, value []byte) {
	i := bytes.IndexByte(v, valueSep[0])
	if i < 0 {
		return string(v), nil
	}
	if i+1 == len(v) {
		return string(v[:i]), nil
	}
	return string(v[:i]), bytes.Clone(v[i+1:])
}

// ownerOf returns the owner id in a member key's value.
func ownerOf(v []byte) string {
	if i := bytes.IndexByte(v, valueSep[0]); i >= 0 {
		return string(v[:i])
	}
	return string(v)
}

// ownedBy is the comparison "member key name belongs to owner", whatever value it
// carries: its value is owner or owner 0x00 value, which are exactly the values v
// with below(owner) < v < owner 0x01 among the values of member keys (etcd compares
// values as bytes). etcd has no "≥" and no "starts with"; below(owner) is owner with
// its last byte one less and 0xff appended, which every member value less than owner
// is less than, too: such a value either differs from owner at an earlier byte, or
// has owner's last byte one less and then an owner id's byte, 0x00 or nothing, all
// below 0xff.
func ownedBy(name, owner string) []clientv3.Cmp {
	n := len(owner)
	below := owner[:n-1] + string([]byte{owner[n-1] - 1, 0xff})
	return []clientv3.Cmp{
		clientv3.Compare(clientv3.Value(name), ">", below),
		clientv3.Compare(clientv3.Value(name), "<", owner+"\x01"),
	}
}

// SetValue implements driver.Valuer. It rewrites the owner's member key with the
// new value in one transaction that compares, on the server, the key's create
// revision (the grant's token: a member that was first stays first for as long as
// it exists, so this says it still holds the lock) and its owner. The key keeps its
// lease, so the grant's TTL is unchanged. A grant made through this backend costs
// that one request; a grant of the owner's made elsewhere (another client with the
// same owner id) costs a read of the first member before it.
func (b *Backend) SetValue(ctx context.Context, key, owner string, value []byte) error {
	if b.isClosed() {
		return driver.ErrClosed
	}
	ctx, cancel := b.opCtx(ctx)
	defer cancel()
	ok := driver.Holder{Key: key, Owner: owner}
	b.mu.Lock()
	h, name := b.held[ok], b.names[ok]
	b.mu.Unlock()
	var rev int64
	if h != nil && h.grant && h.rev > 0 {
		rev = h.rev
	} else {
		var resp *clientv3.TxnResponse
		err := b.retry(ctx, func(ctx context.Context) (err error) {
			resp, err = b.cli.Txn(ctx).Then(firstKeyOp(b.LockPrefix(key))).Commit()
			return err
		})
		if err != nil {
			return wrap("set value", key, err)
		}
		first := firstKV(resp.Responses[0])
		if first == nil {
			return wrap("set value", key, fmt.Errorf("%w: nobody holds the lock", driver.ErrNotHeld))
		}
		name, rev = string(first.Key), first.CreateRevision
	}
	var resp *clientv3.TxnResponse
	err := b.retry(ctx, func(ctx context.Context) (err error) {
		resp, err = b.cli.Txn(ctx).
			If(append(ownedBy(name, owner), clientv3.Compare(clientv3.CreateRevision(name), "=", rev))...).
			Then(clientv3.OpPut(name, memberValue(owner, value), clientv3.WithIgnoreLease())).
			Commit()
		return err
	})
	if err != nil {
		return wrap("set value", key, err)
	}
	if !resp.Succeeded {
		return wrap("set value", key, fmt.Errorf("%w: the lock is not this owner's (released, expired, force-released or held by another owner)", driver.ErrNotHeld))
	}
	return nil
}
