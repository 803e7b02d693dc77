package mysqllock

import (
	"context"
	"database/sql"
	"errors"
	"strconv"
	"sync"
	"time"

	"github.com/dlockio/dlock/driver"
)

// placeKey names a queued place this client made.
type placeKey struct{ key, owner string }

// queue makes (or renews) the caller's place at the end of the key's queue, with
// its client's listening connection for the wake-up, and marks the key's row as
// having places, so that its release looks for the first one.
// It reports whether the place is new to this client: a place already made only
// has its patience renewed.
func (b *Backend) queue(ctx context.Context, req driver.Request) (bool, error) {
	id, err := b.lst.ensure(ctx)
	if err != nil {
		return false, b.ctxErr(ctx, err)
	}
	// Remembered before the insert is sent: a withdrawal deletes the place even
	// if the reply to the insert never came.
	_, had := b.places.LoadOrStore(placeKey{req.Key, req.Owner}, struct{}{})
	if _, err := b.exec(ctx, b.q.enqueue, req.Key, req.Owner, id, micros(req.Patience)); err != nil {
		return false, b.ctxErr(ctx, err)
	}
	if had {
		return false, nil
	}
	if _, err := b.exec(ctx, b.q.mark, req.Key); err != nil {
		return false, b.ctxErr(ctx, err)
	}
	return true, nil
}

// dropPlace deletes the caller's place, if this client made one.
func (b *Backend) dropPlace(ctx context.Context, key, owner string) error {
	if _, ok := b.places.LoadAndDelete(placeKey{key, owner}); !ok {
		return nil
	}
	_, err := b.exec(ctx, b.q.withdraw, key, owner)
	return err
}

// wakeNext wakes the client of the first live place of key, if the key is free:
// KILL QUERY on that client's listening connection ends its SLEEP. With no live
// place left, the key's row is unmarked. Errors are dropped: a waiter whose
// wake-up is lost attempts again on its fallback timer.
func (b *Backend) wakeNext(ctx context.Context, key string) {
	var conn uint64
	err := b.db.QueryRowContext(ctx, b.q.next, key).Scan(&conn)
	if errors.Is(err, sql.ErrNoRows) {
		_, _ = b.exec(ctx, b.q.unmark, key, key)
		return
	}
	if err != nil {
		return
	}
	if b.lst.wakeLocal(conn, key) {
		return // the place is this client's: no KILL, and no wake-up lost
	}
	_, _ = b.db.ExecContext(ctx, "KILL QUERY "+strconv.FormatUint(conn, 10))
}

// Watch implements driver.Notifier. The client's listening connection is opened by
// the first wait and kept until Close.
func (b *Backend) Watch(ctx context.Context, key, owner string) (driver.Waiter, error) {
	if b.closed.Load() {
		return nil, driver.ErrClosed
	}
	w := &waiter{b: b, key: key, owner: owner, c: make(chan struct{}, 1)}
	b.lst.add(w)
	return w, nil
}

type waiter struct {
	b          *Backend
	key, owner string
	c          chan struct{}
}

func (w *waiter) C() <-chan struct{} { return w.c }

func (w *waiter) Stop(ctx context.Context, acquired bool) error {
	w.b.lst.remove(w)
	if acquired {
		return w.b.ctxErr(ctx, w.b.dropPlace(ctx, w.key, w.owner))
	}
	if _, ok := w.b.places.Load(placeKey{w.key, w.owner}); !ok {
		return nil
	}
	if err := w.b.dropPlace(ctx, w.key, w.owner); err != nil {
		return w.b.ctxErr(ctx, err)
	}
	// The turn may have come to this place: pass it on.
	w.b.wakeNext(ctx, w.key)
	return nil
}

func (w *waiter) wake() {
	select {
	case w.c <- struct{}{}:
	default:
	}
}

// listener is a client's listening connection: it sleeps in SELECT SLEEP, and a
// release that finds this client's place first in line ends the sleep with KILL
// QUERY. Every local waiter is then woken and attempts again (the statement, not
// the wake-up, decides who gets the key).
type listener struct {
	b       *Backend
	mu      sync.Mutex
	id      uint64 // CONNECTION_ID() of the running connection, 0 if none
	cancel  context.CancelFunc
	done    chan struct{}
	closed  bool
	waiters map[*waiter]struct{}
}

func newListener(b *Backend) *listener {
	return &listener{b: b, waiters: map[*waiter]struct{}{}}
}

func (l *listener) add(w *waiter) {
	l.mu.Lock()
	l.waiters[w] = struct{}{}
	l.mu.Unlock()
}

func (l *listener) remove(w *waiter) {
	l.mu.Lock()
	delete(l.waiters, w)
	l.mu.Unlock()
}

// wakeLocal wakes this client's waiters of key if conn is its listening
// connection, and reports whether it was.
func (l *listener) wakeLocal(conn uint64, key string) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	if conn == 0 || conn != l.id {
		return false
	}
	for w := range l.waiters {
		if w.key == key {
			w.wake()
		}
	}
	return true
}

func (l *listener) wakeAll() {
	l.mu.Lock()
	for w := range l.waiters {
		w.wake()
	}
	l.mu.Unlock()
}

// ensure starts the listening connection if it is not running and returns its id.
func (l *listener) ensure(ctx context.Context) (uint64, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.closed {
		return 0, driver.ErrClosed
	}
	if l.id != 0 {
		return l.id, nil
	}
	if l.done != nil {
		<-l.done // the previous loop is ending
	}
	conn, err := l.b.db.Conn(ctx)
	if err != nil {
		return 0, err
	}
	var id uint64
	if err := conn.QueryRowContext(ctx, "SELECT CONNECTION_ID()").Scan(&id); err != nil {
		conn.Close()
		return 0, err
	}
	lctx, cancel := context.WithCancel(context.Background())
	l.id, l.cancel, l.done = id, cancel, make(chan struct{})
	go l.loop(lctx, conn, l.done)
	return id, nil
}

func (l *listener) loop(ctx context.Context, conn *sql.Conn, done chan struct{}) {
	defer close(done)
	defer conn.Close()
	for {
		// A KILL QUERY ends the sleep with a result of 1 and no error.
		_, err := conn.ExecContext(ctx, "DO SLEEP(3600)")
		if err != nil && ctx.Err() == nil && isErr(err, 1317) { // interrupted
			err = nil
		}
		if err == nil {
			err = l.wakeFirst(ctx, conn)
		} else {
			l.wakeAll()
		}
		if err != nil {
			l.wakeAll()
			l.mu.Lock()
			l.id = 0
			l.mu.Unlock()
			if ctx.Err() == nil {
				time.Sleep(10 * time.Millisecond)
			}
			return
		}
	}
}

// wakeFirst wakes the local waiters whose place is first in line for a free key:
// one read on the listening connection, instead of every local waiter attempting.
func (l *listener) wakeFirst(ctx context.Context, conn *sql.Conn) error {
	l.mu.Lock()
	id := l.id
	l.mu.Unlock()
	rows, err := conn.QueryContext(ctx, l.b.q.firsts, id)
	if err != nil {
		return err
	}
	defer rows.Close()
	keys := map[string]bool{}
	for rows.Next() {
		var k []byte
		if err := rows.Scan(&k); err != nil {
			return err
		}
		keys[string(k)] = true
	}
	if err := rows.Err(); err != nil {
		return err
	}
	l.mu.Lock()
	for w := range l.waiters {
		if keys[w.key] {
			w.wake()
		}
	}
	l.mu.Unlock()
	return nil
}

func (l *listener) close() {
	l.mu.Lock()
	l.closed = true
	cancel, done := l.cancel, l.done
	l.mu.Unlock()
	if cancel != nil {
		cancel()
		<-done
	}
}
