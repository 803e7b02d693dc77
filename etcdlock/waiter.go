package etcdlock

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"time"

	"go.etcd.io/etcd/api/v3/mvccpb"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/dlockio/dlock/driver"
)

// Watch implements driver.Notifier. It only registers the wait: no request is made
// until an attempt finds the lock taken, so an uncontended Lock costs nothing here.
func (b *Backend) Watch(ctx context.Context, key, owner string) (driver.Waiter, error) {
	w := &waiter{b: b, key: key, owner: owner, c: make(chan struct{}, 1)}
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.closed {
		return nil, driver.ErrClosed
	}
	b.waiters[driver.Holder{Key: key, Owner: owner}] = w
	return w, nil
}

// waiter is one waiting Lock. Attempts that find the lock taken tell it which member
// is just ahead (follow); it then watches that one key and signals C when it is
// deleted, or when the waiter's own session ends.
type waiter struct {
	b          *Backend
	key, owner string
	c          chan struct{}

	mu        sync.Mutex
	stopped   bool
	attempted bool     // an attempt may have created a member key
	member    string   // the name of that key
	rev       int64    // create revision of the own member key, once queued
	sess      *session // the session the own member key is on
	unsure    *session // an attempt whose outcome is unknown ran on it: it may hold a place
	predKey   string   // the member watched
	predRev   int64
	cancel    context.CancelFunc // of the watch goroutine, if any
	done      chan struct{}      // closed when that goroutine returns
	gen       int64              // of the watch goroutine, one more for each
	// watching is gen<<2 | a watch state (watchPending, ...) of the watch
	// goroutine of generation gen. The goroutine sets it without w.mu: follow and
	// Stop hold w.mu while they wait for the goroutine to end, so a goroutine that
	// took w.mu could deadlock with them.
	watching atomic.Int64
	// deletedAt is a revision at which the watch found the member it watched
	// deleted (the delete's, or the one the watch started at), 0 when it has not
	// (see deletion); the watch goroutine sets it before it wakes the waiter.
	deletedAt atomic.Int64
	checked   time.Time // when an attempt last read the queue on the server
	ahead     int       // members ahead of the own key then, the holder not counted
}

// recheck bounds how long the attempts of a waiter whose watch is in place are
// answered without a request (see still).
const recheck = 30 * time.Second

// still reports whether a waiting attempt on session s can be answered without a
// request: the waiter's watch on the member just ahead is in place and has not seen
// it deleted, or is still being set up (it wakes the waiter if it finds that member
// gone, or ends), and the queue was read on the server within recheck. etcd
// delivers every event of a watch, resuming it after a broken stream, so the waiter
// is woken when that member is deleted. ahead is the count read then. Without this,
// every waiter's fallback attempt (the core's guard against a lost wake-up, every
// few seconds) would be a read of the whole queue on the server: N waiters, N reads
// of N members every few seconds.
func (w *waiter) still(s *session) (ahead int, ok bool) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.cancel == nil || w.sess != s || time.Since(w.checked) >= recheck {
		return 0, false
	}
	if st := w.watching.Load(); st>>2 != w.gen || st&3 == watchEnded {
		return 0, false
	}
	select {
	case <-w.done:
		return 0, false
	default:
	}
	return w.ahead, true
}

// placed records that an attempt read the waiter's place on the server, with
// ahead members ahead of it; -1 when the read did not count them (one fewer than
// last time is then a fair guess: the waiter was woken by a delete ahead).
func (w *waiter) placed(ahead int) {
	w.mu.Lock()
	if ahead < 0 {
		ahead = max(w.ahead-1, 0)
	}
	w.checked, w.ahead = time.Now(), ahead
	w.mu.Unlock()
}

// woken wakes the waiter from its watch, which ends: the next attempt asks the
// server (still no longer answers for it).
func (w *waiter) woken(gen int64) {
	for {
		st := w.watching.Load()
		if st>>2 != gen || w.watching.CompareAndSwap(st, gen<<2|watchEnded) {
			break
		}
	}
	w.wake()
}

// States of a waiter's watch (see waiter.watching).
const (
	watchPending = 0 // being set up
	watchInPlace = 1 // in place, and the member watched was still there
	watchEnded   = 2 // it woke the waiter
)

// setWatching records that the watch of generation gen is in place, unless it
// ended or a newer one replaced it.
func (w *waiter) setWatching(gen int64) {
	w.watching.CompareAndSwap(gen<<2|watchPending, gen<<2|watchInPlace)
}

// deletion returns, and forgets, the revision at which the waiter's watch saw the
// member ahead deleted, or 0. The woken attempt reads its place at that revision
// (see placedAttempt).
func (w *waiter) deletion() int64 { return w.deletedAt.Swap(0) }

func (w *waiter) C() <-chan struct{} { return w.c }

func (w *waiter) wake() {
	select {
	case w.c <- struct{}{}:
	default:
	}
}

func (w *waiter) markAttempted(member string) {
	w.mu.Lock()
	w.attempted, w.member = true, member
	w.mu.Unlock()
}

// place returns the own member key's create revision, session and name, once queued.
func (w *waiter) place() (int64, *session, string) {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.rev, w.sess, w.member
}

// placedOn reports whether the waiter has, or may have, a place in the queue on
// session s.
func (w *waiter) placedOn(s *session) bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	return (w.rev > 0 && w.sess == s) || w.unsure == s
}

// placeLost reports whether the waiter had, or may have had, a place in the queue
// on a session that has ended: the place went with the session's lease.
func (w *waiter) placeLost() bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	return (w.rev > 0 && w.sess.isDone()) || (w.unsure != nil && w.unsure.isDone())
}

// mayBePlaced records that an attempt on session s, whose outcome is unknown, may
// have made the waiter a place in the queue.
func (w *waiter) mayBePlaced(s *session) {
	w.mu.Lock()
	w.unsure = s
	w.mu.Unlock()
}

// follow records the waiter's place (its key member, created at myRev on session s)
// and makes sure it watches the member just ahead, predKey created at predRev, as
// read at revision readRev.
func (w *waiter) follow(predKey string, predRev, readRev int64, s *session, myRev int64, member string) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.stopped {
		return
	}
	w.rev, w.sess, w.member, w.unsure = myRev, s, member, nil
	if w.cancel != nil && w.predKey == predKey && w.predRev == predRev {
		select {
		case <-w.done: // that watch ended (and woke us): start another
		default:
			return // already watching it
		}
	}
	if w.startLocked(func(ctx context.Context, gen int64) { w.watch(ctx, gen, predKey, predRev, readRev, s) }) {
		w.predKey, w.predRev = predKey, predRev
	}
}

// followDeletes records the waiter's place in a semaphore (its key member, created
// at myRev on session s) and watches the lock's members for deletes after revision
// readRev, waking the waiter once need of them have been deleted: then fewer than
// the limit may be ahead of it (see Semaphores in the package documentation).
func (w *waiter) followDeletes(prefix string, need int, readRev int64, s *session, myRev int64, member string) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.stopped {
		return
	}
	w.rev, w.sess, w.member, w.unsure = myRev, s, member, nil
	w.startLocked(func(ctx context.Context, gen int64) { w.watchDeletes(ctx, gen, prefix, need, readRev, s) })
	w.predKey, w.predRev = "", 0
}

// startLocked ends the waiter's watch goroutine, if any, and starts run as the
// next; it reports false if the backend is closed.
func (w *waiter) startLocked(run func(ctx context.Context, gen int64)) bool {
	w.stopWatchLocked()
	w.deletedAt.Store(0)
	w.gen++
	gen := w.gen
	w.watching.Store(gen<<2 | watchPending)
	b := w.b
	b.mu.Lock()
	if b.closed {
		b.mu.Unlock()
		return false
	}
	if !b.idleWatch {
		b.idleWatch = true
		b.wg.Go(b.keepWatchStream)
	}
	b.wg.Add(1)
	b.mu.Unlock()
	ctx, cancel := context.WithCancel(b.ctx)
	done := make(chan struct{})
	w.cancel, w.done = cancel, done
	go func() {
		defer b.wg.Done()
		defer close(done)
		defer cancel()
		run(ctx, gen)
	}()
	return true
}

// watchDeletes waits for need deletes of the lock's members after revision readRev
// (deletes only: etcd filters out the puts), or the end of session s, and wakes the
// waiter. A delete behind the waiter counts too: it wakes the waiter early, and its
// next attempt reads the queue and watches again.
func (w *waiter) watchDeletes(ctx context.Context, gen int64, prefix string, need int, readRev int64, s *session) {
	wch := w.b.cli.Watch(clientv3.WithRequireLeader(ctx), prefix, clientv3.WithPrefix(),
		clientv3.WithRev(readRev+1), clientv3.WithFilterPut(), clientv3.WithCreatedNotify())
	for {
		select {
		case resp, ok := <-wch:
			if !ok || resp.Canceled || resp.Err() != nil {
				if ctx.Err() == nil {
					w.woken(gen) // the next attempt reads the queue and watches again
				}
				return
			}
			if resp.Created {
				w.setWatching(gen)
			}
			for _, ev := range resp.Events {
				if ev.Type == mvccpb.DELETE {
					need--
				}
			}
			if need <= 0 {
				w.woken(gen)
				return
			}
		case <-s.done:
			w.woken(gen)
			return
		case <-ctx.Done():
			return
		}
	}
}

func (w *waiter) stopWatchLocked() {
	if w.cancel != nil {
		w.cancel()
		<-w.done
		w.cancel, w.done = nil, nil
	}
}

// watch waits for the delete of predKey, or the end of session s, and wakes the
// waiter. The watch starts at the current revision so that etcd puts it in its synced
// group and delivers the delete at once; if the revision moved past readRev before
// the watch was in place, predKey is read again so a delete in between is not missed.
func (w *waiter) watch(ctx context.Context, gen int64, predKey string, predRev, readRev int64, s *session) {
	b := w.b
	// Watch is called here, not in follow: it blocks until the client's watch stream
	// takes the request, which lasts as long as no member is reachable.
	// WithRequireLeader: a member cut off from the leader ends the watch instead of
	// keeping it open with nothing to deliver.
	wch := b.cli.Watch(clientv3.WithRequireLeader(ctx), predKey, clientv3.WithCreatedNotify())
	created := false
	for {
		select {
		case resp, ok := <-wch:
			if !ok || resp.Canceled || resp.Err() != nil {
				if ctx.Err() == nil {
					w.woken(gen) // the next attempt watches again
				}
				return
			}
			for _, ev := range resp.Events {
				if ev.Type == mvccpb.DELETE {
					w.deletedAt.Store(ev.Kv.ModRevision)
					w.woken(gen)
					return
				}
			}
			if resp.Created && !created {
				created = true
				if rev := resp.Header.Revision; rev <= readRev {
					w.setWatching(gen)
				}
				if rev := resp.Header.Revision; rev > readRev {
					// Was predKey still there at the revision the watch starts
					// after? History does not change, so any member that has
					// applied that revision answers, without a quorum read.
					gctx, cancel := b.opCtx(ctx)
					var g *clientv3.GetResponse
					err := b.retry(gctx, func(ctx context.Context) (err error) {
						g, err = b.cli.Get(ctx, predKey, clientv3.WithKeysOnly(), clientv3.WithRev(rev), clientv3.WithSerializable())
						if errors.Is(err, rpctypes.ErrFutureRev) {
							// That member lags behind the watch's: ask the leader.
							g, err = b.cli.Get(ctx, predKey, clientv3.WithKeysOnly(), clientv3.WithRev(rev))
						}
						return err
					})
					cancel()
					if err != nil || len(g.Kvs) == 0 || g.Kvs[0].CreateRevision != predRev {
						if err == nil {
							w.deletedAt.Store(rev) // gone by then
						}
						if ctx.Err() == nil {
							w.woken(gen)
						}
						return
					}
					w.setWatching(gen)
				}
			}
		case <-s.done:
			w.woken(gen) // the next attempt gives up: the place went with the session
			return
		case <-ctx.Done():
			return
		}
	}
}

// Stop implements driver.Waiter. A waiter that did not get the lock deletes its
// member key, which wakes the waiter behind it.
func (w *waiter) Stop(ctx context.Context, acquired bool) error {
	b := w.b
	b.mu.Lock()
	if b.waiters[driver.Holder{Key: w.key, Owner: w.owner}] == w {
		delete(b.waiters, driver.Holder{Key: w.key, Owner: w.owner})
	}
	closed := b.closed
	b.mu.Unlock()
	w.mu.Lock()
	w.stopped = true
	w.stopWatchLocked()
	attempted, sess, member := w.attempted, w.sess, w.member
	w.mu.Unlock()
	ok := driver.Holder{Key: w.key, Owner: w.owner}
	if acquired || !attempted || closed {
		b.freeName(ok)
		return nil
	}
	ctx, cancel := b.opCtx(ctx)
	defer cancel()
	// The tail stays even if it names the member key (a hint gone stale, which
	// the next waiter's watch finds gone): a tail missing while members queue
	// would make the next waiter's write read the lock's whole range (see create).
	if _, err := b.deleteOwn(ctx, member, w.owner, plain); err != nil {
		b.orphan(ok, sess, 0) // keep trying in the background
		return wrap("withdraw waiter", w.key, err)
	}
	b.untrackOrphan(ok)
	b.freeName(ok)
	return nil
}

// keepWatchStream keeps one watch open, on a key nobody writes, for as long as the
// backend lives. The etcd client closes its watch stream (a gRPC stream, with
// goroutines on both ends) when its last watch ends, and opens a new one for the
// next: without this, a client that waits for locks one at a time would pay for a
// new stream on every wait.
func (b *Backend) keepWatchStream() {
	idle := b.prefix + "/\x00idle" // inside the prefix range (permissions), never written
	for {
		for range b.cli.Watch(clientv3.WithRequireLeader(b.ctx), idle) {
		}
		select {
		case <-b.ctx.Done():
			return
		case <-time.After(100 * time.Millisecond): // the watch was cancelled (no leader): again
		}
	}
}
