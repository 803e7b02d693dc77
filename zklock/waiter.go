package zklock

import (
	"context"
	"errors"
	"time"

	"github.com/dlockio/dlock/driver"
	"github.com/go-zookeeper/zk"
)

// Watch implements driver.Notifier. A waiting attempt watches its predecessor child
// only (a semaphore's first in line its holders, see queue); the waiter is
// signalled when a watched child is deleted (or, for a semaphore, takes a permit),
// when its own child is, and when the session ends. A waiter whose queued place was lost with the session
// (it expired, or nothing was heard from the ensemble for the whole session
// timeout) is signalled, and its next attempt fails with an error that does not
// match driver.ErrLocked, so that its Lock fails at once rather than queue again at
// the back.
func (b *Backend) Watch(ctx context.Context, key, owner string) (driver.Waiter, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.closed {
		return nil, driver.ErrClosed
	}
	k := driver.Holder{Key: key, Owner: owner}
	if old := b.waiters[k]; old != nil {
		b.unwatchLocked(old)
	}
	w := &waiter{b: b, key: key, owner: owner, c: make(chan struct{}, 1)}
	b.waiters[k] = w
	return w, nil
}

type waiter struct {
	b          *Backend
	key, owner string
	c          chan struct{}

	// Guarded by Backend.mu.
	preds    []string  // watched paths: the predecessor, or a semaphore's holders
	data     bool      // preds' data is watched too
	watching bool      // the watches on preds are set on the server and none has fired
	checked  time.Time // when an attempt last listed the queue on the server
	ahead    int       // children between the holder and the own child then
	lost     error     // the session that carried the queued place ended
	// solo is the name of a mutex's queued child whose predecessor was, at the
	// last listing, the only child below it (the holder); promoted is set to it
	// when that predecessor is deleted. No child can come below a child later
	// (sequence numbers only rise), so the child is then the lowest: the
	// waiter's next attempt is granted without listing the queue again.
	solo, promoted string
}

// placeLost returns the error of a waiting attempt whose queued place went with its
// session (see loseSessionLocked), nil otherwise.
func (b *Backend) placeLost(key, owner string) error {
	b.mu.Lock()
	defer b.mu.Unlock()
	if w := b.waiters[driver.Holder{Key: key, Owner: owner}]; w != nil {
		return w.lost
	}
	return nil
}

// recheck bounds how long the attempts of a queued waiter whose watch on its
// predecessor is in place are answered without a request. ZooKeeper delivers a
// watch's event whenever the node goes while the session lives (the client library
// sets the watches again on reconnection; a session's end wakes every waiter), so
// the waiter is woken when its predecessor goes. Without this, every queued
// waiter's fallback attempt (the core's guard against a lost wake-up, every few
// seconds) would list the whole queue on the server: N waiters, N listings of N
// children every few seconds, which at a few thousand waiters saturates the server
// and delays the holder's heartbeats past the session's validity. The recheck
// still finds, within its bound, a child of ours that was deleted behind our back.
const recheck = 30 * time.Second

func (w *waiter) C() <-chan struct{} { return w.c }

func (w *waiter) signal() {
	select {
	case w.c <- struct{}{}:
	default:
	}
}

// unwatchLocked forgets w's predecessor watch (the server-side watch stays until the
// predecessor is deleted or the session ends; it then fires into nothing).
func (b *Backend) unwatchLocked(w *waiter) {
	w.watching = false
	for _, p := range w.preds {
		if m := b.predOf[p]; m != nil {
			delete(m, w)
			if len(m) == 0 {
				delete(b.predOf, p)
			}
		}
	}
	w.preds, w.data = nil, false
}

// Stop implements driver.Waiter: a waiter that did not acquire deletes its child.
func (w *waiter) Stop(ctx context.Context, acquired bool) error {
	b := w.b
	k := driver.Holder{Key: w.key, Owner: w.owner}
	b.mu.Lock()
	b.unwatchLocked(w)
	if b.waiters[k] == w {
		delete(b.waiters, k)
	}
	e := b.entries[k]
	b.mu.Unlock()
	if acquired || e == nil {
		return nil
	}
	e.op.Lock()
	defer e.op.Unlock()
	b.mu.Lock()
	if e.dead || e.granted {
		b.mu.Unlock()
		return nil
	}
	p, guid := e.path, e.guid
	b.mu.Unlock()
	var err error
	switch {
	case p != "":
		err = b.call(ctx, func() error { return b.conn.Delete(p, -1) })
		if errors.Is(err, zk.ErrNoNode) {
			err = nil
		}
	case guid != "":
		_, err = b.deleteMatching(ctx, e.parent, func(c child) bool { return c.guid == guid })
	}
	b.mu.Lock()
	b.dropLocked(e, err != nil)
	b.mu.Unlock()
	if err != nil {
		return wrap("withdraw waiter", w.key, err)
	}
	return nil
}
