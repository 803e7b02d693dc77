package etcdlock

import (
	"bytes"
	"context"
	"fmt"
	"strconv"

	"go.etcd.io/etcd/api/v3/mvccpb"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/dlockio/dlock/driver"
)

// Member values.
//
// A member key's value is its owner id; then, for a member of a semaphore
// (driver.Request.Limit above 1), the byte 0x01 and the limit in decimal; then,
// when the request that wrote it carried a value (driver.Request.Value), the byte
// 0x00 and that value. A reader's member (driver.Request.Shared) carries the byte
// 0x02 after the owner id instead of a limit: a writer's is a mutex member, so a
// read-write lock costs its writers not a byte more. An owner id holds no control
// byte (driver.ValidateOwner), so the first 0x00, 0x01 or 0x02 ends it. A mutex member without a value is the owner
// id alone, as before values and semaphores existed: not a byte more on the hot
// path, and clients of the older layout read such members as they always did. The
// value lives and dies with the member key: a queued place carries the value of
// the request that queued it into the grant the queue hands it, the next grant is
// another member key with its own value, and a release, force release or lease
// expiry deletes both at once.
const (
	valueSep  = "\x00"
	limitTag  = "\x01"
	sharedTag = "\x02"
	tags      = valueSep + limitTag + sharedTag
)

// memberValue is the value of the member key of owner, in a lock of limit holders
// (0 or 1: a mutex), with value.
func memberValue(owner string, limit int, value []byte) string {
	v := owner
	if limit > 1 {
		v += limitTag + strconv.Itoa(limit)
	}
	if len(value) > 0 {
		v += valueSep + string(value)
	}
	return v
}

// readerValue is the value of the member key of owner as a reader (shared) of a
// read-write lock, with value.
func readerValue(owner string, value []byte) string {
	v := owner + sharedTag
	if len(value) > 0 {
		v += valueSep + string(value)
	}
	return v
}

// requestValue is the value of the member key that req writes.
func requestValue(req driver.Request) string {
	if req.Shared {
		return readerValue(req.Owner, req.Value)
	}
	return memberValue(req.Owner, req.Limit, req.Value)
}

// sharedOf reports whether a member key's value is a reader's.
func sharedOf(v []byte) bool {
	i := bytes.IndexAny(v, tags)
	return i >= 0 && v[i] == sharedTag[0]
}

// parseMember splits a member key's value into the owner id, the limit (1 for a
// mutex member) and the value (nil when there is none).
func parseMember(v []byte) (owner string, limit int, value []byte) {
	i := bytes.IndexAny(v, tags)
	if i < 0 {
		return string(v), 1, nil
	}
	owner, rest, limit := string(v[:i]), v[i:], 1
	switch rest[0] {
	case sharedTag[0]:
		rest = rest[1:]
	case limitTag[0]:
		j := bytes.IndexByte(rest, valueSep[0])
		if j < 0 {
			j = len(rest)
		}
		if n, err := strconv.Atoi(string(rest[1:j])); err == nil && n > 1 {
			limit = n
		}
		rest = rest[j:]
	}
	if len(rest) > 1 {
		value = bytes.Clone(rest[1:])
	}
	return owner, limit, value
}

// splitMember splits a member key's value into the owner id and the value (nil
// when there is none).
func splitMember(v []byte) (owner string, value []byte) {
	owner, _, value = parseMember(v)
	return owner, value
}

// ownerOf returns the owner id in a member key's value.
func ownerOf(v []byte) string {
	if i := bytes.IndexAny(v, tags); i >= 0 {
		return string(v[:i])
	}
	return string(v)
}

// limitOf returns the limit in a member key's value: 1 for a mutex member.
func limitOf(v []byte) int {
	_, limit, _ := parseMember(v)
	return limit
}

// ownedBy is the comparison "member key name belongs to owner", whatever limit, mode
// and value it carries: its value is owner, or owner followed by 0x00, 0x01 or 0x02
// and more, which are exactly the values v with below(owner) < v < owner 0x03 among the values
// of member keys (etcd compares values as bytes). etcd has no "≥" and no "starts
// with"; below(owner) is owner with its last byte one less and 0xff appended, which
// every member value less than owner is less than, too: such a value either differs
// from owner at an earlier byte, or has owner's last byte one less and then an owner
// id's byte, 0x00, 0x01, 0x02 or nothing, all below 0xff.
func ownedBy(name, owner string) []clientv3.Cmp {
	n := len(owner)
	below := owner[:n-1] + string([]byte{owner[n-1] - 1, 0xff})
	return []clientv3.Cmp{
		clientv3.Compare(clientv3.Value(name), ">", below),
		clientv3.Compare(clientv3.Value(name), "<", owner+"\x03"),
	}
}

// SetValue implements driver.Valuer. It rewrites the owner's member key with the
// new value in one transaction that compares, on the server, the key's create
// revision (the grant's token: a member that was first stays first for as long as
// it exists, so this says it still holds the lock) and its owner. The key keeps its
// lease, so the grant's TTL is unchanged. A grant made through this backend costs
// that one request; a grant of the owner's made elsewhere (another client with the
// same owner id) costs a read of the holders before it. The member's limit or
// reader tag is kept.
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
	var limit int
	var shared bool
	if h != nil && h.grant && h.rev > 0 {
		rev, limit, shared = h.rev, h.limit, h.shared
	} else {
		kv, err := b.holderKV(ctx, key, owner)
		if err != nil {
			return wrap("set value", key, err)
		}
		if kv == nil {
			return wrap("set value", key, fmt.Errorf("%w: the lock is not this owner's (nobody holds it, or others do)", driver.ErrNotHeld))
		}
		name, rev, limit, shared = string(kv.Key), kv.CreateRevision, limitOf(kv.Value), sharedOf(kv.Value)
	}
	v := memberValue(owner, limit, value)
	if shared {
		v = readerValue(owner, value)
	}
	var resp *clientv3.TxnResponse
	err := b.retry(ctx, func(ctx context.Context) (err error) {
		resp, err = b.cli.Txn(ctx).
			If(append(ownedBy(name, owner), clientv3.Compare(clientv3.CreateRevision(name), "=", rev))...).
			Then(clientv3.OpPut(name, v, clientv3.WithIgnoreLease())).
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

// holderKV returns the member key, with its value, by which owner holds key, made
// through any client: the first member, or for a semaphore one of the first limit
// members; nil if owner holds none.
func (b *Backend) holderKV(ctx context.Context, key, owner string) (*mvccpb.KeyValue, error) {
	_, kvs, _, err := b.holders(ctx, key)
	if err != nil {
		return nil, err
	}
	for _, kv := range kvs {
		if ownerOf(kv.Value) == owner {
			return kv, nil
		}
	}
	return nil, nil
}
