package zklock

import (
	"context"
	"errors"

	"github.com/dlockio/dlock/driver"
	"github.com/go-zookeeper/zk"
)

// Inspect implements driver.Inspector. TTL is an estimate: the holder's TTL less the
// time since its last renewal (the child's mtime, on the server's clock). Value is
// the value in the holder's node (see SetValue).
func (b *Backend) Inspect(ctx context.Context, key string) (driver.Info, error) {
	parent := b.LockPath(key)
	for range 3 {
		var names []string
		err := b.call(ctx, func() error {
			var err error
			names, _, err = b.conn.Children(parent)
			return err
		})
		if errors.Is(err, zk.ErrNoNode) {
			return driver.Info{}, driver.ErrNotHeld
		}
		if err != nil {
			return driver.Info{}, wrap("inspect", key, err)
		}
		q := queue(names)
		if len(q) == 0 {
			return driver.Info{}, driver.ErrNotHeld
		}
		var data []byte
		var st *zk.Stat
		err = b.call(ctx, func() error {
			var err error
			data, st, err = b.conn.Get(parent + "/" + q[0].name)
			return err
		})
		if errors.Is(err, zk.ErrNoNode) {
			continue
		}
		if err != nil {
			return driver.Info{}, wrap("inspect", key, err)
		}
		d := decodeData(data)
		return driver.Info{Key: key, Owner: q[0].owner, Token: uint64(st.Czxid), Waiters: len(q) - 1,
			TTL: d.ttlLeft(st), Value: d.value}, nil
	}
	return driver.Info{}, wrap("inspect", key, errors.New("the queue kept changing"))
}

// ForceRelease implements driver.ForceReleaser: it deletes the holder's child. The
// holder's backend sees the deletion and ends its lease; the next waiter is granted
// with a larger token.
func (b *Backend) ForceRelease(ctx context.Context, key string) error {
	parent := b.LockPath(key)
	for range 5 {
		var names []string
		err := b.call(ctx, func() error {
			var err error
			names, _, err = b.conn.Children(parent)
			return err
		})
		if errors.Is(err, zk.ErrNoNode) {
			return driver.ErrNotHeld
		}
		if err != nil {
			return wrap("force release", key, err)
		}
		q := queue(names)
		if len(q) == 0 {
			return driver.ErrNotHeld
		}
		err = b.call(ctx, func() error { return b.conn.Delete(parent+"/"+q[0].name, -1) })
		if err == nil {
			return nil
		}
		if !errors.Is(err, zk.ErrNoNode) {
			return wrap("force release", key, err)
		}
	}
	return wrap("force release", key, errors.New("the queue kept changing"))
}
