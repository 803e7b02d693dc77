package zklock

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/dlockio/dlock/driver"
	"github.com/go-zookeeper/zk"
)

// entry is this backend's child (or attempt at one) for a (key, owner).
type entry struct {
	key, owner string
	parent     string

	op sync.Mutex // serialises server operations on the entry

	// Guarded by Backend.mu.
	guid    string // GUID of the current create attempt
	limit   int    // the limit its GUID carries (1 for a mutex)
	shared  bool   // its GUID is a reader's (a read-write lock's shared place)
	checked bool   // the child's limit was checked against the key's (checkLimit)
	marked  bool   // the node's data is known to carry the holding mark (value.go)
	name    string // child name once known
	path    string
	czxid   int64
	session int64 // the child's ephemeral owner
	granted bool
	watched bool // a deletion watch is set on the child
	dead    bool // removed from the backend's maps
	lost    chan struct{}
	lostSet bool
	timer   *time.Timer
	gen     uint64 // bumped when the timer is re-armed

	// The node's data as this backend last wrote or read it: the value, whether
	// it is known to be on the node (false for an adopted node), and the data
	// version, for the conditional writes of Refresh and SetValue.
	value      []byte
	valueKnown bool
	version    int32
	placed     time.Time // when the attempt that last found the child queued was sent
}

// entryFor returns the live entry of (key, owner), making one if needed.
func (b *Backend) entryFor(key, owner string) (*entry, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.closed {
		return nil, driver.ErrClosed
	}
	k := driver.Holder{Key: key, Owner: owner}
	e := b.entries[k]
	if e == nil {
		e = &entry{key: key, owner: owner, parent: b.LockPath(key), lost: make(chan struct{})}
		b.entries[k] = e
	}
	return e, nil
}

func (b *Backend) lookup(key, owner string) *entry {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.entries[driver.Holder{Key: key, Owner: owner}]
}

// Bound implements driver.Bounder: a grant lives on the session, which is certainly
// kept until half the session timeout (less 1%) after the last request known to
// have reached the leader (see the package documentation). A grant resumed on
// another process's session gets driver.NoBound: this backend cannot see that
// session's keep-alives, and learns of its end from the child's deletion.
func (b *Backend) Bound(key, owner string) (time.Duration, bool) {
	b.mu.Lock()
	defer b.mu.Unlock()
	e := b.entries[driver.Holder{Key: key, Owner: owner}]
	switch {
	case e == nil || e.dead || !e.granted:
		return 0, false
	case e.session != b.session:
		return driver.NoBound, true
	}
	return time.Until(b.heard.Add(sessionValidity(b.timeout))), true
}

// dropLocked removes e from the backend and closes its Lost channel. If the child
// may still exist and deleteNode is set, it is deleted in the background. Called with
// b.mu held.
func (b *Backend) dropLocked(e *entry, deleteNode bool) {
	if e.dead {
		return
	}
	e.dead = true
	k := driver.Holder{Key: e.key, Owner: e.owner}
	if b.entries[k] == e {
		delete(b.entries, k)
	}
	if e.path != "" && b.byPath[e.path] == e {
		delete(b.byPath, e.path)
	}
	if e.granted {
		b.granted--
	}
	if e.timer != nil {
		e.timer.Stop()
	}
	if !e.lostSet {
		e.lostSet = true
		close(e.lost)
	}
	if w := b.waiters[k]; w != nil {
		w.signal()
	}
	if deleteNode && !b.closed && (e.path != "" || e.guid != "") {
		b.wg.Add(1)
		if e.path != "" {
			b.doomed[e.path] = true
		}
		go b.deleteInBackground(e)
	}
}

// deleteInBackground deletes the child of a dropped entry (or, if the create's
// outcome was unknown, any child with its GUID), retrying transient errors for up to
// a session timeout (after which the session, and the child with it, is gone).
func (b *Backend) deleteInBackground(e *entry) {
	defer b.wg.Done()
	b.mu.Lock()
	p, guid, limit := e.path, e.guid, b.timeout
	b.mu.Unlock()
	defer func() {
		b.mu.Lock()
		delete(b.doomed, p)
		b.mu.Unlock()
	}()
	// Close ends the session, which deletes the child anyway, and makes every call
	// return at once.
	ctx, cancel := context.WithTimeout(context.Background(), limit)
	defer cancel()
	for {
		var err error
		if p != "" {
			err = b.call(ctx, func() error { return b.conn.Delete(p, -1) })
		} else {
			_, err = b.deleteMatching(ctx, e.parent, func(c child) bool { return c.guid == guid })
		}
		if err == nil || errors.Is(err, zk.ErrNoNode) || permanent(err) || ctx.Err() != nil {
			if err != nil && !errors.Is(err, zk.ErrNoNode) && !errors.Is(err, driver.ErrClosed) {
				b.log.Debug("zklock: could not delete an abandoned contender", "key", e.key, "err", err)
			}
			return
		}
		select {
		case <-ctx.Done():
			return
		case <-b.closing:
			return
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// deleteMatching deletes the children of parent that match, and reports whether one
// of them was a holder (one of the lowest contenders, as many as the key admits).
func (b *Backend) deleteMatching(ctx context.Context, parent string, match func(child) bool) (bool, error) {
	var names []string
	err := b.call(ctx, func() error {
		var err error
		names, _, err = b.conn.Children(parent)
		return err
	})
	if errors.Is(err, zk.ErrNoNode) {
		return false, nil
	}
	if err != nil {
		return false, err
	}
	q := queue(names)
	n := holding(q)
	held := false
	var errs []error
	for i, c := range q {
		if !match(c) {
			continue
		}
		err := b.call(ctx, func() error { return b.conn.Delete(parent+"/"+c.name, -1) })
		if err == nil && i < n {
			held = true
		}
		if err != nil && !errors.Is(err, zk.ErrNoNode) {
			errs = append(errs, err)
		}
	}
	return held, driver.Join(errs...)
}

// armLocked (re)starts e's local expiry: a child not refreshed (or, queued, not
// attempted) within d is deleted. Called with b.mu held.
func (b *Backend) armLocked(e *entry, d time.Duration) {
	if e.timer != nil {
		e.timer.Stop()
	}
	if d <= 0 || b.closed {
		return
	}
	e.gen++
	gen := e.gen
	e.timer = time.AfterFunc(d, func() {
		b.mu.Lock()
		defer b.mu.Unlock()
		if e.dead || e.gen != gen || b.closed {
			return
		}
		b.log.Debug("zklock: local expiry of an unrenewed contender", "key", e.key, "granted", e.granted)
		b.dropLocked(e, true)
	})
}

// Refresh implements driver.Backend: it writes the child's data, which the leader
// refuses if the child is gone.
func (b *Backend) Refresh(ctx context.Context, key, owner string, ttl time.Duration) error {
	e := b.lookup(key, owner)
	if e == nil {
		return driver.ErrNotHeld
	}
	e.op.Lock()
	defer e.op.Unlock()
	b.mu.Lock()
	ok := !e.dead && e.granted
	p, czxid, watch := e.path, e.czxid, !e.watched
	sess := b.session
	b.mu.Unlock()
	if !ok {
		return driver.ErrNotHeld
	}
	// A grant whose czxid came from the create reply gets its deletion watch now,
	// at its first renewal, in the same round trip; most locks are released before
	// that and never pay for it. The watch's stat also confirms the token.
	var wst *zk.Stat
	var werr error
	var wg sync.WaitGroup
	if watch {
		wg.Go(func() {
			werr = b.call(ctx, func() error {
				var err error
				_, wst, _, err = b.conn.ChildrenW(p)
				return err
			})
		})
	}
	sent := time.Now()
	value, version, err := b.renew(ctx, e, p, ttl)
	wg.Wait()
	b.mu.Lock()
	defer b.mu.Unlock()
	if watch && werr == nil && !e.dead {
		if wst.Czxid != czxid {
			b.log.Warn("zklock: the create reply's zxid is not the node's czxid; ending the grant", "key", key, "reply", czxid, "czxid", wst.Czxid)
			b.dropLocked(e, true)
			return fmt.Errorf("%w: zklock: token of %q could not be confirmed", driver.ErrNotHeld, key)
		}
		e.watched = true
	}
	switch {
	case err == nil:
		if e.dead {
			return driver.ErrNotHeld
		}
		if sent.After(b.heard) && sess == b.session {
			b.heard = sent
		}
		e.value, e.valueKnown, e.version = value, true, version
		e.marked = e.limit > 1
		b.armLocked(e, ttl)
		return nil
	case errors.Is(err, zk.ErrNoNode):
		b.dropLocked(e, false)
		return fmt.Errorf("%w: zklock: the contender node of %q is gone", driver.ErrNotHeld, key)
	}
	return wrap("refresh", key, err)
}

// renew writes the TTL into e's node p, keeping the value on it: the write is
// conditional on the data version this backend last saw, and if another connection
// wrote the node since (SetValue through another connection of the owner id), it
// reads the value there and writes again. It returns the value and the new version.
// Called with e.op held.
func (b *Backend) renew(ctx context.Context, e *entry, p string, ttl time.Duration) ([]byte, int32, error) {
	b.mu.Lock()
	value, version, known := e.value, e.version, e.valueKnown
	held := e.limit > 1 // a semaphore's holder keeps its node marked
	b.mu.Unlock()
	for range 4 {
		if !known {
			var data []byte
			var st *zk.Stat
			err := b.call(ctx, func() error {
				var err error
				data, st, err = b.conn.Get(p)
				return err
			})
			if err != nil {
				return nil, 0, err
			}
			value, version, known = slices.Clone(decodeData(data).value), st.Version, true
		}
		var st *zk.Stat
		err := b.call(ctx, func() error {
			var err error
			st, err = b.conn.Set(p, encodeData(ttl, 0, held, value), version)
			return err
		})
		if errors.Is(err, zk.ErrBadVersion) {
			known = false
			continue
		}
		if err != nil {
			return nil, 0, err
		}
		return value, st.Version, nil
	}
	return nil, 0, errors.New("the node kept changing")
}

// Release implements driver.Backend.
func (b *Backend) Release(ctx context.Context, key, owner string) error {
	e := b.lookup(key, owner)
	if e != nil {
		e.op.Lock()
		defer e.op.Unlock()
		b.mu.Lock()
		dead, granted, p, guid := e.dead, e.granted, e.path, e.guid
		b.mu.Unlock()
		if dead {
			return driver.ErrNotHeld
		}
		if p != "" {
			err := b.call(ctx, func() error { return b.conn.Delete(p, -1) })
			if err != nil && !errors.Is(err, zk.ErrNoNode) {
				return wrap("release", key, err)
			}
			b.mu.Lock()
			b.dropLocked(e, false)
			b.mu.Unlock()
			if err != nil || !granted {
				return driver.ErrNotHeld
			}
			return nil
		}
		if guid != "" {
			// A create whose outcome is unknown: delete what carries its GUID.
			_, err := b.deleteMatching(ctx, e.parent, func(c child) bool { return c.guid == guid })
			if err != nil {
				return wrap("release", key, err)
			}
			b.mu.Lock()
			b.dropLocked(e, false)
			b.mu.Unlock()
			return driver.ErrNotHeld
		}
	}
	// Not ours here: the owner may hold the key through another connection.
	held, err := b.deleteMatching(ctx, b.LockPath(key), func(c child) bool { return c.owner == owner })
	if err != nil {
		return wrap("release", key, err)
	}
	if !held {
		return driver.ErrNotHeld
	}
	return nil
}
