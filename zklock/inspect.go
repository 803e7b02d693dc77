package zklock

import (
	"context"
	"errors"
	"sync"

	"github.com/dlockio/dlock/driver"
	"github.com/go-zookeeper/zk"
)

// permits returns the number of holders the key of queue q admits: the limit its
// oldest contender carries (checkLimit keeps the others agreeing), 1 for a mutex
// or a limit this version cannot read.
func permits(q []child) int {
	if len(q) == 0 {
		return 0
	}
	return max(q[0].limit, 1)
}

// holding returns how many contenders of the sorted queue q hold the key: the
// lowest limit of them (one for a mutex), or, when the lowest is a reader's, the run
// of readers' children below the lowest writer's.
func holding(q []child) int {
	if len(q) == 0 || !q[0].shared {
		return min(permits(q), len(q))
	}
	n := 1
	for n < len(q) && q[n].shared {
		n++
	}
	return n
}

// Inspect implements driver.Inspector. TTL is an estimate: the holder's TTL less the
// time since its last renewal (the child's mtime, on the server's clock). Value is
// the value in the holder's node (see SetValue). Of a semaphore's holders it
// reports the oldest, and Waiters counts the places queued behind all of them.
func (b *Backend) Inspect(ctx context.Context, key string) (driver.Info, error) {
	parent := b.LockPath(key)
	for range 3 {
		q, err := b.list(ctx, parent)
		if err != nil {
			return driver.Info{}, wrap("inspect", key, err)
		}
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
		return driver.Info{Key: key, Owner: q[0].owner, Token: uint64(st.Czxid), Waiters: len(q) - holding(q),
			TTL: d.ttlLeft(st), Value: d.value, Shared: q[0].shared}, nil
	}
	return driver.Info{}, wrap("inspect", key, errors.New("the queue kept changing"))
}

// list returns the sorted contenders of the lock node parent; none when it does not
// exist.
func (b *Backend) list(ctx context.Context, parent string) ([]child, error) {
	var names []string
	err := b.call(ctx, func() error {
		var err error
		names, _, err = b.conn.Children(parent)
		return err
	})
	if errors.Is(err, zk.ErrNoNode) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	return queue(names), nil
}

// Holders implements driver.Semaphorer: it lists the queue and reads the nodes of
// the holders (the limit's lowest contenders) in one more round trip. A holder
// whose node is gone by then is left out; Waiters is the number of queued places
// when the queue was listed, the same in every Info.
func (b *Backend) Holders(ctx context.Context, key string) (int, []driver.Info, error) {
	parent := b.LockPath(key)
	q, err := b.list(ctx, parent)
	if err != nil {
		return 0, nil, wrap("holders", key, err)
	}
	n := holding(q)
	live, err := b.readChildren(ctx, parent, q[:n], func(c child, d nodeData, st *zk.Stat) driver.Info {
		return driver.Info{Key: key, Owner: c.owner, Token: uint64(st.Czxid), Waiters: len(q) - n,
			TTL: d.ttlLeft(st), Value: d.value, Shared: c.shared}
	})
	if err != nil {
		return 0, nil, wrap("holders", key, err)
	}
	if len(live) == 0 {
		return 0, nil, nil
	}
	return permits(q), live, nil
}

// Queue implements driver.Queuer: it lists the queue and reads the nodes of the
// contenders that do not hold (those behind the holders, see holding), in one more
// round trip, for their values. A place whose node is gone by then is left out.
// A place lives as long as its waiter's session or until its waiter gives up,
// which the server does not know of: TTL is 0.
func (b *Backend) Queue(ctx context.Context, key string) ([]driver.Info, error) {
	parent := b.LockPath(key)
	q, err := b.list(ctx, parent)
	if err != nil {
		return nil, wrap("queue", key, err)
	}
	places, err := b.readChildren(ctx, parent, q[holding(q):], func(c child, d nodeData, _ *zk.Stat) driver.Info {
		return driver.Info{Key: key, Owner: c.owner, Waiters: -1, Value: d.value, Shared: c.shared}
	})
	if err != nil {
		return nil, wrap("queue", key, err)
	}
	return places, nil
}

// readChildren reads the nodes of the children cs of parent, all requests sent at
// once (one round trip), and returns info of each that still exists, in the order
// of cs; a child deleted meanwhile is left out.
func (b *Backend) readChildren(ctx context.Context, parent string, cs []child, info func(child, nodeData, *zk.Stat) driver.Info) ([]driver.Info, error) {
	infos := make([]driver.Info, len(cs))
	errs := make([]error, len(cs))
	var wg sync.WaitGroup
	for i, c := range cs {
		wg.Go(func() {
			errs[i] = b.call(ctx, func() error {
				data, st, err := b.conn.Get(parent + "/" + c.name)
				if err != nil {
					return err
				}
				infos[i] = info(c, decodeData(data), st)
				return nil
			})
		})
	}
	wg.Wait()
	live := infos[:0]
	for i, in := range infos {
		switch {
		case errs[i] == nil:
			live = append(live, in)
		case !errors.Is(errs[i], zk.ErrNoNode):
			return nil, errs[i]
		}
	}
	return live, nil
}

// ForceRelease implements driver.ForceReleaser: it deletes the holders' children
// (all of a semaphore's). Each holder's backend sees the deletion and ends its
// lease; the next waiters are granted with larger tokens.
func (b *Backend) ForceRelease(ctx context.Context, key string) error {
	parent := b.LockPath(key)
	for range 5 {
		q, err := b.list(ctx, parent)
		if err != nil {
			return wrap("force release", key, err)
		}
		if len(q) == 0 {
			return driver.ErrNotHeld
		}
		n := holding(q)
		errs := make([]error, n)
		var wg sync.WaitGroup
		for i, c := range q[:n] {
			wg.Go(func() {
				errs[i] = b.call(ctx, func() error { return b.conn.Delete(parent+"/"+c.name, -1) })
			})
		}
		wg.Wait()
		deleted := false
		for _, err := range errs {
			switch {
			case err == nil:
				deleted = true
			case !errors.Is(err, zk.ErrNoNode):
				return wrap("force release", key, err)
			}
		}
		if deleted {
			return nil
		}
	}
	return wrap("force release", key, errors.New("the queue kept changing"))
}

// Shares implements driver.Sharer: zklock honours driver.Request.Shared.
func (b *Backend) Shares() bool { return true }
