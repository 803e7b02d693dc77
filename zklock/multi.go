package zklock

// AcquireAll: several keys in one ZooKeeper multi (see the package documentation,
// "Several keys at once").

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/dlockio/dlock/driver"
	"github.com/go-zookeeper/zk"
)

var _ driver.MultiAcquirer = (*Backend)(nil)

// AcquireAll implements driver.MultiAcquirer: one multi creates a contender child
// under every key, as Acquire creates one; one round trip then lists every key's
// queue and reads each new child's stat (its czxid, the token, and a deletion
// watch). If every child is the lowest of its queue, each is granted as Acquire
// grants it; otherwise one multi deletes them all and the error names the first
// key whose child was not the lowest. A multi cannot ask whether a node has no
// children, hence the create and withdraw.
func (b *Backend) AcquireAll(ctx context.Context, reqs []driver.Request) ([]driver.Grant, error) {
	es := make([]*entry, 0, len(reqs))
	defer func() {
		for _, e := range es {
			e.op.Unlock()
		}
	}()
	for _, req := range reqs {
		e, err := b.entryFor(req.Key, req.Owner)
		if err != nil {
			return nil, err
		}
		e.op.Lock()
		es = append(es, e)
		b.mu.Lock()
		busy := e.guid != "" || e.dead
		if !busy {
			e.guid, e.limit, e.shared = newGUID(1, false), 1, false
		}
		b.mu.Unlock()
		if busy {
			// The core's owner id is fresh: this only happens if a caller
			// reuses one. The entries before this one have created nothing.
			b.mu.Lock()
			for _, e := range es[:len(es)-1] {
				b.dropLocked(e, false)
			}
			b.mu.Unlock()
			return nil, fmt.Errorf("zklock: %q: %w", req.Key, &driver.HeldError{})
		}
	}
	if err := b.createAll(ctx, es, reqs); err != nil {
		return nil, err
	}
	taken, err := b.settleAll(ctx, es, reqs)
	if err != nil || taken >= 0 {
		b.withdrawAll(es)
		if err != nil {
			return nil, err
		}
		return nil, fmt.Errorf("zklock: %q: %w", reqs[taken].Key, &driver.HeldError{})
	}
	gs := make([]driver.Grant, len(reqs))
	for i, e := range es {
		g, err, again := b.grant(ctx, e, reqs[i])
		if err == nil && again {
			err = wrap("acquire", reqs[i].Key, errors.New("the contender node vanished (session expired?)"))
		}
		if err != nil {
			b.withdrawAll(es)
			return nil, err
		}
		gs[i] = g
	}
	return gs, nil
}

// createAll creates every entry's child in one multi, making the lock nodes that
// do not exist yet. On an unknown outcome (the connection lost with the multi in
// flight) the entries are left to expire locally, which deletes whatever carries
// their GUIDs, as a later Release does; on any other failure nothing was created
// and they are dropped.
func (b *Backend) createAll(ctx context.Context, es []*entry, reqs []driver.Request) (err error) {
	unknown := false
	defer func() {
		if err == nil {
			return
		}
		b.mu.Lock()
		defer b.mu.Unlock()
		for i, e := range es {
			if unknown && !errors.Is(err, driver.ErrClosed) {
				b.armLocked(e, reqs[i].TTL)
			} else {
				b.dropLocked(e, false)
			}
		}
	}()
	ops := make([]any, len(es))
	b.mu.Lock()
	for i, e := range es {
		ops[i] = &zk.CreateRequest{
			Path:  e.parent + "/" + childPrefix + e.owner + "-" + e.guid + "-",
			Data:  encodeData(reqs[i].TTL, 0, false, reqs[i].Value),
			Acl:   b.acl,
			Flags: zk.FlagEphemeralSequential,
		}
	}
	b.mu.Unlock()
	key := reqs[0].Key
	for range 4 {
		sess, sent := b.currentSession(), time.Now()
		var res []zk.MultiResponse
		err = b.call(ctx, func() error {
			var err error
			res, err = b.conn.Multi(ops...)
			return err
		})
		switch {
		case err == nil:
			b.markHeard(sent, sess)
			for i, e := range es {
				if _, err := b.setName(e, pathBase(res[i].String)); err != nil {
					return err
				}
			}
			return nil
		case errors.Is(err, zk.ErrNoNode):
			// A lock node is missing (never made, or an empty container the
			// server removed): make them and try again.
			for _, e := range es {
				if err := b.makeParent(ctx, e.parent); err != nil {
					return wrap("acquire", e.key, err)
				}
			}
			continue
		case permanent(err), errors.Is(err, zk.ErrSessionExpired):
			return wrap("acquire", key, err)
		}
		// The multi may or may not have been applied.
		unknown = true
		return wrap("acquire", key, err)
	}
	return wrap("acquire", key, err)
}

// settleAll lists every key's queue and reads each new child's stat, in one round
// trip, and returns the index of the first request whose child is not the lowest
// contender of its key, or -1 if all are.
func (b *Backend) settleAll(ctx context.Context, es []*entry, reqs []driver.Request) (int, error) {
	names := make([][]string, len(es))
	stats := make([]*zk.Stat, len(es))
	errs := make([]error, 2*len(es))
	paths := make([]string, len(es))
	b.mu.Lock()
	for i, e := range es {
		paths[i] = e.path
		b.armLocked(e, reqs[i].TTL) // until settled, like Acquire's child
	}
	b.mu.Unlock()
	var wg sync.WaitGroup
	for i, e := range es {
		wg.Go(func() {
			errs[2*i] = b.call(ctx, func() error {
				var err error
				names[i], _, err = b.conn.Children(e.parent)
				return err
			})
		})
		wg.Go(func() {
			errs[2*i+1] = b.call(ctx, func() error {
				var err error
				_, stats[i], _, err = b.conn.ChildrenW(paths[i])
				return err
			})
		})
	}
	wg.Wait()
	b.mu.Lock()
	defer b.mu.Unlock()
	for i, e := range es {
		if err := driver.Join(errs[2*i], errs[2*i+1]); err != nil {
			if errors.Is(err, zk.ErrNoNode) {
				err = errors.New("the contender node vanished (session expired?)")
			}
			return -1, wrap("acquire", e.key, err)
		}
		if e.dead {
			return -1, wrap("acquire", e.key, errors.New("the contender node vanished (session expired?)"))
		}
		e.czxid, e.session, e.watched = stats[i].Czxid, stats[i].EphemeralOwner, true
		e.value, e.valueKnown, e.version, e.checked = nil, true, 0, true
		b.byPath[e.path] = e
	}
	for i, e := range es {
		own, ok := parseChild(e.name)
		if !ok {
			return -1, wrap("acquire", e.key, fmt.Errorf("unexpected child name %q", e.name))
		}
		for _, c := range contenders(names[i]) {
			if c.seq < own.seq {
				return i, nil
			}
		}
	}
	return -1, nil
}

// withdrawAll deletes the entries' children in one multi and drops the entries; a
// child the multi could not delete (one already gone fails the whole multi) is
// deleted on its own in the background.
func (b *Backend) withdrawAll(es []*entry) {
	b.mu.Lock()
	ops := make([]any, 0, len(es))
	for _, e := range es {
		if !e.dead && e.path != "" {
			ops = append(ops, &zk.DeleteRequest{Path: e.path, Version: -1})
		}
	}
	b.mu.Unlock()
	ctx, cancel := context.WithTimeout(context.Background(), b.SessionTimeout())
	defer cancel()
	var err error
	if len(ops) > 0 {
		err = b.call(ctx, func() error { _, err := b.conn.Multi(ops...); return err })
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	for _, e := range es {
		b.dropLocked(e, err != nil)
	}
}
