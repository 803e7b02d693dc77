package zklock

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/dlockio/dlock/driver"
	"github.com/go-zookeeper/zk"
)

// Acquire implements driver.Backend.
func (b *Backend) Acquire(ctx context.Context, req driver.Request) (driver.Grant, error) {
	if req.Limit > maxLimit {
		return driver.Grant{}, fmt.Errorf("%w: zklock: holder limit %d is above %d", driver.ErrInvalid, req.Limit, maxLimit)
	}
	if req.Shared && req.Limit > 1 {
		return driver.Grant{}, fmt.Errorf("%w: zklock: a shared attempt with a holder limit of %d", driver.ErrInvalid, req.Limit)
	}
	for range 4 {
		if req.Wait {
			if err := b.placeLost(req.Key, req.Owner); err != nil {
				return driver.Grant{}, err
			}
		}
		e, err := b.entryFor(req.Key, req.Owner)
		if err != nil {
			return driver.Grant{}, err
		}
		e.op.Lock()
		g, err, again := b.attempt(ctx, e, req)
		e.op.Unlock()
		if !again {
			return g, err
		}
	}
	return driver.Grant{}, wrap("acquire", req.Key, errors.New("the contender node kept vanishing (session expiring?)"))
}

// attempt makes one attempt with e's operation lock held. again means e was dropped
// meanwhile and the attempt should start over with a new entry. Its steps: answer a
// watched waiter locally, create the child, list the queue and read the child's stat
// in one round trip, settle the owner's children (keepOldest), then grant, refuse or
// queue. It stays one function of about 145 lines because the listing, the child's
// stat and the entry's fields are read and written under b.mu in between each step;
// the three outcomes are functions of their own (grant, queue).
func (b *Backend) attempt(ctx context.Context, e *entry, req driver.Request) (g driver.Grant, err error, again bool) {
	limit := max(req.Limit, 1)
	b.mu.Lock()
	if e.dead {
		b.mu.Unlock()
		return g, nil, true
	}
	if e.guid == "" {
		e.limit, e.shared = limit, req.Shared
	} else if e.limit != limit {
		// The entry's child (or create in doubt) carries another limit.
		cur := e.limit
		b.mu.Unlock()
		return g, mismatch(req.Key, cur, limit), false
	} else if e.shared != req.Shared {
		// The owner id holds or waits for the key in the other mode through
		// this backend: refused, changing nothing.
		b.mu.Unlock()
		return g, &driver.HeldError{}, false
	}
	own := e.name
	knownStat := e.czxid != 0
	reenter := req.Reenter && e.granted // a re-entry: its value replaces the stored one
	if own != "" && req.Wait && !e.granted {
		w := b.waiters[driver.Holder{Key: req.Key, Owner: req.Owner}]
		if w != nil && w.promoted != "" && w.promoted == own && limit == 1 && !req.Shared &&
			e.session == b.session && e.valueKnown && bytes.Equal(e.value, req.Value) {
			// A mutex's place whose predecessor, the holder, was deleted: the
			// lowest child now (see waiter.solo).
			w.promoted = ""
			b.mu.Unlock()
			return b.grant(ctx, e, req)
		}
		if w != nil && w.watching && len(w.preds) > 0 &&
			e.session == b.session && time.Since(w.checked) < recheck && e.valueKnown && bytes.Equal(e.value, req.Value) {
			// Still queued behind a watched predecessor: answered without a
			// request (see recheck).
			b.armLocked(e, req.Patience)
			ahead := w.ahead
			b.mu.Unlock()
			return g, &driver.HeldError{Ahead: ahead, Queued: true}, false
		}
	}
	b.mu.Unlock()
	sent := time.Now()

	var pre created
	if own == "" {
		if pre, err = b.create(ctx, e, encodeData(req.TTL, 0, false, req.Value), req); err != nil {
			return g, err, false
		}
		own = pre.name
		b.mu.Lock()
		// A child adopted after a lost reply may be an earlier attempt's.
		e.value, e.valueKnown, e.version = slices.Clone(req.Value), !pre.adopted, 0
		b.mu.Unlock()
	}
	ownPath := e.parent + "/" + own
	// Until this attempt settles, the child expires locally like a queued one, so
	// that a failure below cannot leave it behind for the life of the session.
	b.mu.Lock()
	b.armLocked(e, max(req.TTL, req.Patience))
	b.mu.Unlock()

	// List the queue (unless it was listed right behind the create) and, for a new
	// child whose czxid is unknown, read its stat (czxid, session) and watch it for
	// deletion, in one round trip.
	var names []string
	var st *zk.Stat
	var stErr error
	var wg sync.WaitGroup
	if !knownStat && pre.czxid != 0 {
		knownStat = true
		b.mu.Lock()
		if !e.dead {
			e.czxid, e.session = pre.czxid, pre.session
			b.byPath[ownPath] = e
		}
		b.mu.Unlock()
	}
	if !knownStat {
		wg.Go(func() {
			stErr = b.call(ctx, func() error {
				var err error
				_, st, _, err = b.conn.ChildrenW(ownPath)
				return err
			})
		})
	}
	if pre.listed {
		names = pre.names
	} else {
		err = b.call(ctx, func() error {
			var err error
			names, _, err = b.conn.Children(e.parent)
			return err
		})
	}
	wg.Wait()
	if err == nil && !knownStat {
		err = stErr
	}
	if err != nil && !errors.Is(err, zk.ErrNoNode) {
		return g, wrap("acquire", req.Key, err), false
	}
	// Not sorted: with thousands of waiters, sorting each listing cost more than
	// the rest of the handoff; one pass finds what the attempt needs.
	q := contenders(names)
	b.mu.Lock()
	if !knownStat && st != nil && !e.dead {
		e.czxid, e.session, e.watched = st.Czxid, st.EphemeralOwner, true
		b.byPath[ownPath] = e
	}
	// The owner's children: with Reenter (driver.Request) every child of the owner
	// id, since the caller may hold the grant under any of them (a restarted
	// process resuming); without it only this entry's own (its GUID: a create
	// whose reply was lost), since another client or process may use the same
	// owner id and its child is another contender's.
	var mine []child
	var ownSeq int64
	found := false
	for _, c := range q {
		if c.owner == req.Owner && !b.doomed[e.parent+"/"+c.name] && (req.Reenter || c.guid == e.guid) {
			mine = append(mine, c)
			if c.name == own {
				found, ownSeq = true, c.seq
			}
		}
	}
	if e.dead || !found || err != nil {
		// Our child is gone (expired, force-released, reaped): start over.
		b.dropLocked(e, false)
		b.mu.Unlock()
		return g, nil, true
	}
	if !e.checked {
		// The key's limit (see checkLimit), once per child.
		if cur, ok := checkLimit(q, ownSeq, limit); !ok {
			b.mu.Unlock()
			err := b.call(ctx, func() error { return b.conn.Delete(ownPath, -1) })
			b.mu.Lock()
			b.dropLocked(e, err != nil && !errors.Is(err, zk.ErrNoNode))
			b.mu.Unlock()
			return g, mismatch(req.Key, cur, limit), false
		}
		e.checked = true
	}
	slices.SortFunc(mine, bySeq)

	// One child per owner (of those above): keep the oldest (an earlier grant being
	// resumed or re-entered, or a create whose reply was lost) and delete the others.
	keep := mine[0]
	if keep.name != own {
		// Our own child is about to be deleted as an extra: its deletion is not a loss.
		if b.byPath[ownPath] == e {
			delete(b.byPath, ownPath)
		}
	}
	b.mu.Unlock()
	if again, err := b.keepOldest(ctx, e, req, mine, own); again || err != nil {
		return g, err, again
	}
	ownPath = e.parent + "/" + keep.name
	b.mu.Lock()
	shared := e.shared // the kept child's mode (keepOldest may have adopted another)
	if shared != req.Shared {
		// A child of the owner id in the other mode, found by a resuming
		// attempt: refused, and left to whoever made it.
		b.dropLocked(e, false)
		b.mu.Unlock()
		return g, &driver.HeldError{}, false
	}
	b.mu.Unlock()
	// The place of the child kept: idx contenders below it, the highest of them
	// (its predecessor) below; for a semaphore all of them when they are the
	// limit's holders, and whether any contender is behind it. For a read-write
	// lock, the highest writer's child below (a reader's predecessor to watch) and
	// the lowest, and the readers below that one, which hold with it (rw).
	idx, below, behind := 0, child{}, false
	var lower []string
	var rw rwPlace
	for _, c := range q {
		switch {
		case c.seq < keep.seq:
			if idx == 0 || c.seq > below.seq {
				below = c
			}
			idx++
			if limit > 1 && len(lower) <= limit {
				lower = append(lower, e.parent+"/"+c.name)
			}
			rw.add(c)
		case c.seq > keep.seq:
			behind = true
		}
	}
	granted := idx < limit
	if shared {
		// A reader holds when no writer's child is below its own.
		granted = rw.writers == 0
	}
	// A semaphore's permit, or a reader's grant, is refused to an owner id that
	// holds another through another client (driver.Request: such an attempt keeps
	// no place either); a mutex's or a writer's attempt then finds itself behind
	// that holder.
	twin := ""
	switch {
	case granted && shared && !req.Reenter:
		twin = twinReading(q, req.Owner, e.guid)
	case granted && limit > 1 && !req.Reenter:
		twin = twinHolding(q, req.Owner, e.guid, limit)
	}
	refused := twin != ""
	granted = granted && !refused
	// A semaphore's grant with a contender behind marks its node as holding (see
	// queue): the one behind may be watching it as a queued place.
	mark := granted && limit > 1 && behind

	if granted || req.Wait && !refused {
		if again, err := b.storeValue(ctx, e, req, ownPath, reenter, mark); again || err != nil {
			return g, err, again
		}
	}

	if granted {
		return b.grant(ctx, e, req)
	}

	if !req.Wait || refused {
		err := b.call(ctx, func() error { return b.conn.Delete(ownPath, -1) })
		b.mu.Lock()
		b.dropLocked(e, err != nil && !errors.Is(err, zk.ErrNoNode))
		w := b.waiters[driver.Holder{Key: req.Key, Owner: req.Owner}]
		b.mu.Unlock()
		if refused && w != nil {
			// No place kept: the waiter is woken when the other client's
			// grant goes, not at once by the drop.
			select {
			case <-w.c:
			default:
			}
			b.watchPreds(ctx, w, []string{e.parent + "/" + twin}, false)
		}
		return g, &driver.HeldError{}, false
	}

	// The places to watch: a mutex's waiter (and a semaphore's, when it is not
	// first in line) its predecessor, the first in line of a semaphore its holders.
	preds, data := []string{e.parent + "/" + below.name}, false
	switch {
	case shared:
		// A reader watches the nearest writer below it.
		preds = []string{e.parent + "/" + rw.nearest.name}
	case idx == limit && limit > 1:
		slices.Sort(lower) // the same set lists alike: no watch set again
		preds = lower
	case limit > 1:
		data = true
	}
	ahead := idx - limit
	if rw.readers > 0 {
		ahead = idx - rw.holding(q, keep.seq)
	}
	return b.queue(ctx, e, req, preds, data, ahead, limit == 1 && !shared && idx == 1, sent)
}

// grant completes an attempt whose child is first in the queue: the key is held.
func (b *Backend) grant(ctx context.Context, e *entry, req driver.Request) (g driver.Grant, err error, again bool) {
	if err := b.freshSession(ctx); err != nil {
		return g, wrap("acquire", req.Key, err), false
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	if e.dead {
		return g, nil, true
	}
	if !e.granted {
		e.granted = true
		b.granted++
	}
	b.armLocked(e, req.TTL)
	return driver.Grant{Token: uint64(e.czxid), Lost: e.lost}, nil, false
}

// keepOldest deletes the owner's children other than mine[0], the oldest, and
// when that is not own (this attempt's child) makes the entry e stand for it,
// watched. again asks for the attempt to start over (the kept child is gone).
func (b *Backend) keepOldest(ctx context.Context, e *entry, req driver.Request, mine []child, own string) (again bool, err error) {
	keep := mine[0]
	for _, c := range mine[1:] {
		if err := b.call(ctx, func() error { return b.conn.Delete(e.parent+"/"+c.name, -1) }); err != nil && !errors.Is(err, zk.ErrNoNode) {
			return false, wrap("acquire", req.Key, err)
		}
	}
	if keep.name != own {
		var st *zk.Stat
		kp := e.parent + "/" + keep.name
		err := b.call(ctx, func() error {
			var err error
			_, st, _, err = b.conn.ChildrenW(kp)
			return err
		})
		b.mu.Lock()
		if errors.Is(err, zk.ErrNoNode) || e.dead {
			b.dropLocked(e, false)
			b.mu.Unlock()
			return true, nil
		}
		if err != nil {
			b.mu.Unlock()
			return false, wrap("acquire", req.Key, err)
		}
		e.name, e.path, e.czxid, e.session, e.guid, e.watched = keep.name, kp, st.Czxid, st.EphemeralOwner, keep.guid, true
		e.valueKnown = false // another attempt's child: its value is not known
		e.limit, e.shared, e.marked = max(keep.limit, 1), keep.shared, false
		b.byPath[kp] = e
		b.mu.Unlock()
	}
	return false, nil
}

// queue completes an attempt, sent at sent, whose child waits with ahead queued
// places before it: it keeps the child and watches preds, for their deletion and,
// with data set, for their data. What wakes each waiter, so that a release wakes
// one and no herd forms:
//
//   - A mutex's waiter watches its predecessor's deletion: when that is the
//     holder, it is first in line; otherwise it is first once the predecessor
//     goes or becomes the holder, which leaves it waiting on the holder it
//     already watches.
//   - A read-write lock's writer watches its predecessor's deletion, as a
//     mutex's waiter does, whatever the predecessor's mode; a reader watches the
//     deletion of the nearest writer's child below its own, so a writer's release
//     wakes the run of readers queued right behind it together.
//   - A semaphore's first in line (N holders below it) watches the deletion of
//     each of the N: any release frees the permit it is to take.
//   - A semaphore's other waiters watch their predecessor's deletion and data.
//     When the predecessor takes a permit, the one behind becomes first in line
//     and must watch the holders instead; the grant marks the predecessor's node
//     (see the data format in value.go), which fires that watch, and an attempt
//     that finds the mark already there when setting the watch lists again at
//     once.
//
// A release thus wakes the first in line; its grant wakes the next, which lists
// the queue and watches the holders: two listings and one write more than a
// mutex's handoff, whatever the length of the queue.
func (b *Backend) queue(ctx context.Context, e *entry, req driver.Request, preds []string, data bool, ahead int, solo bool, sent time.Time) (g driver.Grant, err error, again bool) {
	b.mu.Lock()
	if e.dead {
		b.mu.Unlock()
		return g, nil, true
	}
	b.armLocked(e, req.Patience)
	if sent.After(e.placed) {
		e.placed = sent
	}
	held := &driver.HeldError{Ahead: ahead, Queued: true}
	w := b.waiters[driver.Holder{Key: req.Key, Owner: req.Owner}]
	if w != nil {
		w.checked, w.ahead = time.Now(), held.Ahead
		w.solo, w.promoted = "", ""
		if solo {
			w.solo = e.name
		}
	}
	arm := w != nil && (w.data != data || !slices.Equal(w.preds, preds))
	b.mu.Unlock()
	if arm {
		b.watchPreds(ctx, w, preds, data)
	}
	return g, held, false
}

// watchPreds sets w's watches on preds (see queue), signalling w at once if one of
// them is gone or, watched for data, holds a permit already.
func (b *Backend) watchPreds(ctx context.Context, w *waiter, preds []string, data bool) {
	b.mu.Lock()
	b.unwatchLocked(w)
	w.preds, w.data = preds, data
	for _, p := range preds {
		if b.predOf[p] == nil {
			b.predOf[p] = make(map[*waiter]bool)
		}
		b.predOf[p][w] = data
	}
	b.mu.Unlock()
	// The watches, in one round trip.
	errs := make([]error, len(preds))
	var wg sync.WaitGroup
	for i, p := range preds {
		wg.Go(func() {
			errs[i] = b.call(ctx, func() error {
				if !data {
					_, _, _, err := b.conn.ChildrenW(p)
					return err
				}
				d, _, _, err := b.conn.GetW(p)
				if err == nil && decodeData(d).held {
					err = errPromoted
				}
				return err
			})
		})
	}
	wg.Wait()
	b.mu.Lock()
	if err := driver.Join(errs...); err != nil {
		// Gone already, holding (errPromoted), or unknown: try again at once
		// rather than wait.
		b.unwatchLocked(w)
		b.mu.Unlock()
		w.signal()
		return
	}
	// The watches are in place unless one fired already (which cleared preds).
	w.watching = slices.Equal(w.preds, preds)
	b.mu.Unlock()
}

// errPromoted is what queue makes of a predecessor found holding a permit.
var errPromoted = errors.New("the place ahead took a permit")

// created is the outcome of create: the child's name, its czxid when the reply was
// observed, and the queue when it could be listed right behind the create.
type created struct {
	name    string
	czxid   int64
	session int64
	names   []string
	listed  bool
	adopted bool // found by its GUID after a lost reply
}

// freshSession makes sure a request reached the leader recently enough for the
// session to be certainly alive, sending a sync if not.
func (b *Backend) freshSession(ctx context.Context) error {
	b.mu.Lock()
	ok := time.Since(b.heard) < sessionValidity(b.timeout)/2
	sess := b.session
	b.mu.Unlock()
	if ok {
		return nil
	}
	sent := time.Now()
	if err := b.call(ctx, func() error { _, err := b.conn.Sync(b.rootPath()); return err }); err != nil {
		return fmt.Errorf("session in doubt: %w", err)
	}
	b.markHeard(sent, sess)
	return nil
}

// create makes e's child, settling a lost reply by looking for the attempt's GUID.
// The first try lists the queue in the same round trip: the listing is sent right
// behind the create, and a session's requests are processed in order, so it sees the
// new child. On failure, an entry whose create may have happened is left to expire
// locally (which deletes whatever carries its GUID); one whose create certainly did
// not happen is dropped. It is one function of about 130 lines: a retry loop whose
// every branch decides, from what the wire sniffer saw, whether the create happened.
func (b *Backend) create(ctx context.Context, e *entry, data []byte, req driver.Request) (res created, err error) {
	b.mu.Lock()
	if e.guid == "" {
		e.guid = newGUID(e.limit, e.shared)
	}
	guid, limit := e.guid, b.timeout
	b.mu.Unlock()
	unknown := false
	defer func() {
		if err == nil {
			return
		}
		b.mu.Lock()
		defer b.mu.Unlock()
		if unknown && !errors.Is(err, driver.ErrClosed) {
			b.armLocked(e, max(req.TTL, req.Patience))
		} else {
			b.dropLocked(e, false)
		}
	}()
	prefix := e.parent + "/" + childPrefix + e.owner + "-" + guid + "-"
	cw := b.expectCreate(prefix)
	defer b.forgetCreate(prefix)
	giveUp := time.Now().Add(limit)
	var last error
	unsettled := false // a create's outcome is unknown: find out before creating again
	for try := 0; ; try++ {
		if try > 0 {
			if time.Now().After(giveUp) {
				return res, wrap("acquire", e.key, last)
			}
			if try > 1 {
				select {
				case <-ctx.Done():
					return res, wrap("acquire", e.key, driver.Join(last, context.Cause(ctx)))
				case <-b.closing:
					return res, driver.ErrClosed
				case <-time.After(50 * time.Millisecond):
				}
			}
		}
		if unsettled {
			// The request may have been applied and its reply lost. Look for the
			// attempt's GUID before creating again.
			sess, sent := b.currentSession(), time.Now()
			var names []string
			lerr := b.call(ctx, func() error {
				var err error
				names, _, err = b.conn.Children(e.parent)
				return err
			})
			switch {
			case errors.Is(lerr, zk.ErrNoNode):
				unsettled = false // no lock node, so no child either
			case lerr != nil:
				last = driver.Join(last, lerr)
				if ctx.Err() != nil || permanent(lerr) {
					return res, wrap("acquire", e.key, last)
				}
				continue
			default:
				unsettled = false
				for _, c := range queue(names) {
					if c.guid == guid {
						b.log.Debug("zklock: adopted a contender whose create reply was lost", "key", e.key, "node", c.name)
						b.markHeard(sent, sess)
						name, _ := b.setName(e, c.name)
						return created{name: name, session: sess, adopted: true}, nil
					}
				}
			}
		}
		sess := b.currentSession()
		sent := time.Now()
		var path string
		createFn := func() error {
			var err error
			path, err = b.conn.Create(prefix, data, zk.FlagEphemeralSequential, b.acl)
			return err
		}
		var names []string
		var lerr error
		listed := false
		if try == 0 {
			errc := make(chan error, 1)
			if !b.async(func() { errc <- b.call(ctx, createFn) }) {
				return res, driver.ErrClosed
			}
			select {
			case <-cw.written:
				listed = true
				lerr = b.call(ctx, func() error {
					var err error
					names, _, err = b.conn.Children(e.parent)
					return err
				})
				err = <-errc
			case err = <-errc:
			}
		} else {
			err = b.call(ctx, createFn)
		}
		switch {
		case err == nil:
			b.markHeard(sent, sess)
			name, _ := b.setName(e, pathBase(path))
			res = created{name: name, czxid: b.createZxid(cw), session: sess}
			if listed && lerr == nil {
				res.names, res.listed = names, true
			}
			return res, nil
		case errors.Is(err, zk.ErrNoNode):
			if err := b.makeParent(ctx, e.parent); err != nil {
				return res, wrap("acquire", e.key, err)
			}
			continue
		case permanent(err):
			return res, wrap("acquire", e.key, err)
		case ctx.Err() != nil:
			unknown = true // the request may still be on its way
			return res, wrap("acquire", e.key, err)
		case errors.Is(err, zk.ErrSessionExpired):
			last = err // nothing of the old session survives: create again
			continue
		}
		// The outcome is unknown (connection lost with the request in flight).
		unknown, unsettled = true, true
		last = err
	}
}

func (b *Backend) setName(e *entry, name string) (string, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	e.name, e.path = name, e.parent+"/"+name
	return name, nil
}

// makeParent creates the lock's container node. The server deletes a container once
// its last child is gone, so lock nodes do not pile up.
func (b *Backend) makeParent(ctx context.Context, p string) error {
	err := b.call(ctx, func() error {
		_, err := b.conn.CreateContainer(p, nil, zk.FlagContainer, b.acl)
		return err
	})
	switch {
	case err == nil, errors.Is(err, zk.ErrNodeExists):
		return nil
	case errors.Is(err, zk.ErrNoNode):
		return fmt.Errorf("root %s does not exist: %w", b.rootPath(), err)
	}
	return err
}
