package pglock

import (
	"context"
	"fmt"
	"strconv"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/dlockio/dlock/driver"
)

// Holder watches share the listener's connection (listen.go) with the waiters. For
// every watched key the connection holds a session-level shared advisory lock on
// the key's hash (watchID) and LISTENs on the table's watch channel
// (watchChannel). The statements that change a key's holder or value try to take
// that lock exclusively for their transaction (the notify fragment in
// sql/fragments.sql) and pg_notify the channel with the key only when they cannot:
// a change no one watches sends no NOTIFY. A try that succeeds holds the lock to
// commit, and the watch's lock waits for it, so a change that notified no one is
// committed before WatchHolder returns.

// watchChannel is the LISTEN channel of the holder watches of the table with oid
// tableID; the oid, not the name, so that "schema.table" and "table" agree.
func watchChannel(tableID uint32) string {
	return "dlock_watch_" + strconv.FormatUint(uint64(tableID), 10)
}

// watchID computes, on the server, the advisory lock key of watched key $1 of the
// table with oid tableID, as the notify fragment in sql/fragments.sql does.
func watchID(tableID uint32) string {
	return `hashtextextended($1::text COLLATE "C", ` + strconv.FormatUint(uint64(tableID), 10) + `)`
}

// readerID computes, on the server, the key of the readers' barrier lock of
// watched key $1, as the readerID fragment in sql/fragments.sql does.
func readerID(tableID uint32) string {
	return `hashtextextended($1::text COLLATE "C", ` + strconv.FormatUint(uint64(tableID), 10) + `::bigint + 4294967296)`
}

// watchedKey is the listener's state for one watched key. Guarded by listener.mu.
type watchedKey struct {
	watches map[*holderWatch]struct{}
	locked  bool // the connection holds the key's advisory lock
}

// holderWatch is one watch started by WatchHolder.
type holderWatch struct {
	l   *listener
	key string
	c   chan struct{}
	// Guarded by l.mu:
	ready   bool // the key's lock was taken for it: changes are notified from then on
	stopped bool
}

func (w *holderWatch) C() <-chan struct{} { return w.c }

func (w *holderWatch) wake() {
	select {
	case w.c <- struct{}{}:
	default:
	}
}

// Stop implements driver.HolderWatch. The listener gives up the key's lock when
// the last watch of the key stops, on its own goroutine.
func (w *holderWatch) Stop() {
	l := w.l
	l.mu.Lock()
	defer l.mu.Unlock()
	l.unwatchLocked(w)
}

// WatchHolder implements driver.HolderWatcher. It returns once the client's
// listening connection (opened if needed, see Watch) listens on the table's watch
// channel and holds the key's advisory lock: from then on every grant, release,
// force release, handoff and SetValue of key made by this version of pglock
// notifies the watch. Expiry is not notified (the core reads the holder again
// when its TTL runs out). After the connection was lost and made again, every
// watch receives once.
func (b *Backend) WatchHolder(ctx context.Context, key string) (driver.HolderWatch, error) {
	if b.closed.Load() {
		return nil, driver.ErrClosed
	}
	w, err := b.lst.watchHolder(ctx, key)
	if err != nil {
		return nil, b.ctxErr(ctx, err)
	}
	return w, nil
}

// watchHolder registers a watch of key and waits until the connection holds the
// key's lock for it.
func (l *listener) watchHolder(ctx context.Context, key string) (*holderWatch, error) {
	w := &holderWatch{l: l, key: key, c: make(chan struct{}, 1)}
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.closed {
		return nil, driver.ErrClosed
	}
	wk := l.watched[key]
	if wk == nil {
		wk = &watchedKey{watches: make(map[*holderWatch]struct{})}
		l.watched[key] = wk
	}
	wk.watches[w] = struct{}{}
	if wk.locked {
		w.ready = true // the connection already holds the key's lock
		return w, nil
	}
	l.demandLocked()
	since := l.attempts
	for !w.ready {
		var err error
		switch {
		case l.closed:
			err = driver.ErrClosed
		case l.failedAt > since:
			err = fmt.Errorf("pglock: watch holder %q: %w", key, l.failErr)
		}
		if err != nil {
			l.unwatchLocked(w)
			return nil, err
		}
		ch := l.changed
		l.mu.Unlock()
		select {
		case <-ch:
		case <-ctx.Done():
		}
		l.mu.Lock()
		if ctx.Err() != nil && !w.ready {
			l.unwatchLocked(w)
			return nil, fmt.Errorf("pglock: watch holder %q: %w", key, ctx.Err())
		}
	}
	return w, nil
}

// unwatchLocked unregisters w; the listener's goroutine gives up the key's lock if
// w was its last watch.
func (l *listener) unwatchLocked(w *holderWatch) {
	if w.stopped {
		return
	}
	w.stopped = true
	wk := l.watched[w.key]
	delete(wk.watches, w)
	if len(wk.watches) == 0 {
		l.demandLocked()
	}
}

// demandLocked asks the listener's goroutine to bring the connection in line with
// the watches (syncWatches): it starts the goroutine if needed and interrupts its
// wait.
func (l *listener) demandLocked() {
	if l.closed {
		return
	}
	l.watchDirty = true
	if !l.started {
		l.started = true
		l.wg.Add(1)
		go l.run()
	}
	select {
	case l.kick <- struct{}{}:
	default:
	}
	if l.interrupt != nil {
		l.interrupt()
	}
}

// wakeKeyLocked wakes every watch of key (a notification on the watch channel).
func (l *listener) wakeKeyLocked(key string) {
	if wk := l.watched[key]; wk != nil {
		for w := range wk.watches {
			w.wake()
		}
	}
}

// syncWatches brings conn in line with the registered watches: LISTEN on the watch
// channel while there are any, the advisory lock of every watched key (LISTEN
// first, so that no notification a lock asks for is missed), and neither for a
// key no longer watched. It runs on the listener's goroutine; an error leaves
// conn in an unknown state, to be closed.
func (l *listener) syncWatches(conn *pgconn.PgConn) error {
	l.mu.Lock()
	l.watchDirty = false
	listen := len(l.watched) > 0 && !l.watchListening
	var lock, unlock []string
	for k, wk := range l.watched {
		switch {
		case len(wk.watches) > 0 && !wk.locked:
			lock = append(lock, k)
		case len(wk.watches) == 0 && wk.locked:
			unlock = append(unlock, k)
		case len(wk.watches) == 0:
			delete(l.watched, k)
		}
	}
	unlisten := l.watchListening && len(lock) == 0 && len(unlock) == len(l.watched)
	if !l.busyLocked() {
		l.idleSince = time.Now()
	}
	l.mu.Unlock()
	if !listen && !unlisten && len(lock) == 0 && len(unlock) == 0 {
		return nil
	}

	ctx, cancel := context.WithTimeout(l.closeCtx, attemptTimeout)
	defer cancel()
	channel := pgx.Identifier{watchChannel(l.tableID)}.Sanitize()
	batch := &pgconn.Batch{}
	if listen {
		batch.ExecParams("LISTEN "+channel, nil, nil, nil, nil)
	}
	// The lock waits for a transaction that has tried it (a change of the key in
	// flight) to end.
	for _, k := range lock {
		batch.ExecParams("SELECT pg_advisory_lock_shared("+watchID(l.tableID)+")", [][]byte{[]byte(k)}, nil, nil, nil)
		// Then wait for the readers' fast grants and releases in flight, which give
		// the watch lock back at once rather than hold it to their commit
		// (readNotify in sql/fragments.sql).
		batch.ExecParams("SELECT pg_advisory_lock("+readerID(l.tableID)+")", [][]byte{[]byte(k)}, nil, nil, nil)
		batch.ExecParams("SELECT pg_advisory_unlock("+readerID(l.tableID)+")", [][]byte{[]byte(k)}, nil, nil, nil)
	}
	for _, k := range unlock {
		batch.ExecParams("SELECT pg_advisory_unlock_shared("+watchID(l.tableID)+")", [][]byte{[]byte(k)}, nil, nil, nil)
	}
	if unlisten {
		batch.ExecParams("UNLISTEN "+channel, nil, nil, nil, nil)
	}
	_, err := conn.ExecBatch(ctx, batch).ReadAll()
	if err != nil {
		return fmt.Errorf("pglock: watch holders: %w", err)
	}

	l.mu.Lock()
	defer l.mu.Unlock()
	if listen {
		l.watchListening = true
	}
	for _, k := range lock {
		wk := l.watched[k]
		wk.locked = true
		for w := range wk.watches {
			if w.ready {
				w.wake() // ready on an earlier connection: changes may have been missed
			}
			w.ready = true
		}
	}
	for _, k := range unlock {
		if wk := l.watched[k]; len(wk.watches) == 0 {
			delete(l.watched, k)
		} else {
			wk.locked = false // watched again meanwhile
			l.watchDirty = true
		}
	}
	if unlisten {
		l.watchListening = false
		l.watchDirty = len(l.watched) > 0
	}
	if !l.busyLocked() {
		l.idleSince = time.Now()
	}
	l.broadcastLocked()
	return nil
}
