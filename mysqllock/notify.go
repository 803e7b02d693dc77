package mysqllock

import (
	"context"
	"crypto/rand"
	"database/sql"
	"errors"
	"fmt"
	"maps"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/dlockio/dlock/driver"
)

// placeKey names a queued place this client made.
type placeKey struct{ key, owner string }

// place is a queued place this client made: since is when its first write was
// sent (a key handed to it was handed later), nonce what that write stored in it.
type place struct {
	since time.Time
	nonce string
	sem   atomic.Bool // made or renewed by the semaphore path
}

func newPlace() *place {
	var n [16]byte
	_, _ = rand.Read(n[:])
	return &place{since: time.Now(), nonce: string(n[:])}
}

// queue makes (or renews) the caller's place at the end of the key's queue, with
// its client's listening connection for the wake-up and the grant's TTL for a
// handoff (Acquire then marks the key's row as having places if it is not, so
// that its release hands the key on). It reports whether the place is new to this client: a place already made
// only has its patience renewed.
func (b *Backend) queue(ctx context.Context, req driver.Request) (bool, error) {
	id, err := b.lst.ensure(ctx)
	if err != nil {
		return false, b.ctxErr(ctx, err)
	}
	pk := placeKey{req.Key, req.Owner}
	stmt := b.q.enqueue
	if b.settleDrop(pk) {
		// This owner's last place, which had its turn, is still there: the new
		// place replaces it (deleted and inserted at the end of the line, in
		// one statement).
		stmt = b.q.requeue
	}
	// Remembered before the insert is sent: a withdrawal deletes the place even
	// if the reply to the insert never came.
	v, had := b.places.LoadOrStore(pk, newPlace())
	if had && v.(*place).sem.Swap(false) {
		// A place the semaphore path made (on a state row, which is not marked
		// queued as a mutex's row is): new to the mutex path, which marks the
		// row for it, and whose Stop hands on a grant handed to it.
		had = false
	}
	// The write runs to its end even if ctx ends meanwhile. Cut short, it would
	// lose only its reply: the driver closes the connection and the server runs
	// the statement on, so the place could be made after this wait's Stop
	// withdrew it (finding nothing), and stay live, first in line, for its
	// patience; a release would hand the key to it, held by no one for its TTL.
	// Waited for, it is withdrawn by Stop as any other.
	wctx, cancel := driver.Outlive(ctx, placeWriteWithin)
	defer cancel()
	if _, err := b.exec(wctx, stmt, req.Key, req.Owner, value(req.Value), id, micros(req.TTL), []byte(v.(*place).nonce), micros(req.Patience)); err != nil {
		return false, b.ctxErr(ctx, err)
	}
	return !had, b.ctxErr(ctx, ctx.Err())
}

// placeWriteWithin is how long the write of a place may run on after its call
// ends (see queue): a few row lock waits (innodb_lock_wait_timeout is a second).
const placeWriteWithin = 5 * time.Second

// settleDrop cancels the scheduled deletion of the place pk, and reports whether
// it did (the place is still there), or waits for the deletion under way.
func (b *Backend) settleDrop(pk placeKey) bool {
	v, ok := b.dropping.Load(pk)
	if !ok {
		return false
	}
	d := v.(*drop)
	if d.cancel(b) {
		b.dropping.CompareAndDelete(pk, d)
		return true
	}
	<-d.done // the deletion of this owner's last place first
	return false
}

// dropPlace deletes the caller's place, if this client made one.
func (b *Backend) dropPlace(ctx context.Context, key, owner string) error {
	if _, ok := b.places.LoadAndDelete(placeKey{key, owner}); !ok {
		return nil
	}
	_, err := b.exec(ctx, b.q.withdraw, key, owner)
	return err
}

// dropPlaceAsync deletes, in the background, the place of a waiter that was
// granted the key: the place has had its turn (no release hands it the key
// again), so the grant need not wait for the deletion. Deletions wait up to
// dropDelay and run together, one statement (one commit) for all the places of
// this client that had their turn meanwhile; a new place of the same owner made
// before then replaces the old one in the statement that makes it (queue), and
// one made while the deletion runs waits for it.
func (b *Backend) dropPlaceAsync(key, owner string) {
	pk := placeKey{key, owner}
	if _, ok := b.places.LoadAndDelete(pk); !ok {
		return
	}
	// Granted after queueing: the key is contended, and its release (by this
	// client, most likely) hands it on at once.
	b.hot.Store(key, struct{}{})
	d := &drop{pk: pk, done: make(chan struct{})}
	b.drops.Add(1)
	if old, loaded := b.dropping.Swap(pk, d); loaded {
		// The deletion scheduled before deletes the same row: this one does.
		if o := old.(*drop); !o.cancel(b) {
			<-o.done
		}
	}
	b.dmu.Lock()
	b.dq = append(b.dq, d)
	if b.dtimer == nil {
		b.dtimer = time.AfterFunc(dropDelay, b.runDrops)
	}
	b.dmu.Unlock()
}

// dropDelay is how long the deletion of a place that had its turn waits, for
// others to run with it and for a new place of the same owner to replace it.
const dropDelay = 100 * time.Millisecond

// dropBatch is the most places one deletion statement names.
const dropBatch = 64

// drop is the deletion of a place that had its turn, scheduled by dropPlaceAsync.
type drop struct {
	pk    placeKey
	mu    sync.Mutex
	state int           // dropPending, dropRunning or dropCancelled
	done  chan struct{} // closed when the deletion is done or cancelled
}

const (
	dropPending = iota
	dropRunning
	dropCancelled
)

// runDrops deletes the places whose deletion is scheduled and not cancelled.
func (b *Backend) runDrops() {
	b.dmu.Lock()
	ds := b.dq
	b.dq, b.dtimer = nil, nil
	b.dmu.Unlock()
	var run []*drop
	for _, d := range ds {
		d.mu.Lock()
		if d.state == dropPending {
			d.state = dropRunning
			run = append(run, d)
		}
		d.mu.Unlock()
	}
	for len(run) > 0 {
		n := min(len(run), dropBatch)
		b.deletePlaces(run[:n])
		for _, d := range run[:n] {
			close(d.done)
			b.dropping.CompareAndDelete(d.pk, d)
			b.drops.Done()
		}
		run = run[n:]
	}
}

// deletePlaces deletes the places of ds in one statement.
func (b *Backend) deletePlaces(ds []*drop) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if len(ds) == 1 {
		_, _ = b.exec(ctx, b.q.withdraw, ds[0].pk.key, ds[0].pk.owner)
		return
	}
	var q strings.Builder
	q.WriteString(b.q.withdrawMany)
	args := make([]any, 0, 2*len(ds))
	for i, d := range ds {
		if i > 0 {
			q.WriteString(" OR ")
		}
		q.WriteString("(lock_key = ? AND owner = ?)")
		args = append(args, d.pk.key, d.pk.owner)
	}
	_, _ = b.exec(ctx, q.String(), args...)
}

// cancel cancels the deletion if it has not started, and reports whether it did
// (the place is then still there).
func (d *drop) cancel(b *Backend) bool {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.state != dropPending {
		return false
	}
	d.state = dropCancelled
	close(d.done)
	b.drops.Done()
	return true
}

// flushDrops runs at once the deletions still waiting (Close).
func (b *Backend) flushDrops() {
	b.dmu.Lock()
	now := b.dtimer != nil && b.dtimer.Stop()
	b.dmu.Unlock()
	if now {
		b.runDrops()
	}
}

// wake ends the wait of the listening connection conn (KILL QUERY), whose client
// then reads the grants handed to its places. Errors are dropped: a waiter whose
// wake-up is lost claims its grant on its fallback attempt.
func (b *Backend) wake(ctx context.Context, conn uint64) {
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
	attempted  bool   // an Acquire of this wait was made; under the listener's mu
	handed     uint64 // the token of a grant handed to the place, not yet returned; under the listener's mu
	nonce      []byte // that place's nonce
}

func (w *waiter) C() <-chan struct{} { return w.c }

// afterWaitState, when set (by tests), runs in a mutex waiter's Stop between
// reading its wait state and handing on a grant handed to its place.
var afterWaitState atomic.Pointer[func()]

func (w *waiter) Stop(ctx context.Context, acquired bool) error {
	b := w.b
	b.lst.remove(w)
	if acquired {
		b.dropPlaceAsync(w.key, w.owner)
		return nil
	}
	err := w.withdraw(ctx)
	if err != nil && !errors.Is(err, driver.ErrClosed) {
		b.withdrawLater(w)
	}
	return err
}

// withdrawRetry is the first pause before a failed withdrawal is tried again, and
// withdrawTimeout bounds each try (see withdrawLater).
const (
	withdrawRetry   = 25 * time.Millisecond
	withdrawTimeout = 10 * time.Second
)

// withdrawLater withdraws w's place in the background, again and again with
// pauses growing to a second, after Stop failed to (the server down or
// restarting, say): the place would otherwise stay live until its patience ran
// out, first in line, and once the holder's lease lapsed without a release no one
// could take the key meanwhile. It stops when the withdrawal succeeds, when the
// client closes, or when the owner waits for the key again through this client
// (that wait's own Stop withdraws).
func (b *Backend) withdrawLater(w *waiter) {
	if b.closed.Load() {
		return
	}
	b.bg.Add(1)
	go func() {
		defer b.bg.Done()
		for pause := withdrawRetry; ; pause = min(2*pause, time.Second) {
			t := time.NewTimer(pause)
			select {
			case <-b.closing:
				t.Stop()
				return
			case <-t.C:
			}
			if b.lst.waiting(w.key, w.owner) {
				return
			}
			ctx, cancel := context.WithTimeout(context.Background(), withdrawTimeout)
			stop := make(chan struct{})
			go func() {
				select {
				case <-b.closing:
					cancel()
				case <-stop:
				}
			}()
			err := w.withdraw(ctx)
			close(stop)
			cancel()
			if err == nil || errors.Is(err, driver.ErrClosed) || b.closed.Load() {
				return
			}
		}
	}()
}

// withdraw gives up the place of a wait that did not get the key (see Stop).
func (w *waiter) withdraw(ctx context.Context) error {
	b := w.b
	if _, ok := b.places.Load(placeKey{w.key, w.owner}); !ok {
		return nil
	}
	if b.semPlaced(w.key, w.owner) {
		// Deleted under the key's row lock, waking the places its going may
		// let in.
		b.places.Delete(placeKey{w.key, w.owner})
		return b.semFree(ctx, w.key, w.owner, true, "")
	}
	// The place lapses first, so that no release hands it the key after this;
	// then a grant already handed to it (Acquire returned it or not) is handed
	// on, and the place is deleted.
	if _, err := b.exec(ctx, b.q.lapse, w.key, w.owner); err != nil {
		return b.ctxErr(ctx, err)
	}
	ws, err := b.waitState(ctx, w.key, w.owner)
	if err != nil {
		return b.ctxErr(ctx, err)
	}
	if f := afterWaitState.Load(); f != nil {
		(*f)()
	}
	if ws.claim {
		err := b.handOn(ctx, b.q.handoff, w.key, w.owner)
		if err != nil && !errors.Is(err, driver.ErrNotHeld) {
			return err
		}
		// Not held as a mutex's grant any more: a reader may have made it a
		// writer's permit since the wait state was read.
		ws.state = ws.state || err != nil
	}
	if ws.state {
		// A grant handed to the place that a reader has made a writer's
		// permit since goes too.
		var nonce string
		if v, ok := b.places.LoadAndDelete(placeKey{w.key, w.owner}); ok {
			nonce = v.(*place).nonce
		}
		return b.semFree(ctx, w.key, w.owner, true, nonce)
	}
	return b.ctxErr(ctx, b.dropPlace(ctx, w.key, w.owner))
}

func (w *waiter) wake() {
	select {
	case w.c <- struct{}{}:
	default:
	}
}

// listener is a client's listening connection: it waits in GET_LOCK for a name
// its anchor connection holds, and a release that hands the key to a place of
// this client ends the wait with KILL QUERY. The listener then reads the grants
// handed to its places (one read) and gives each to its waiter, whose next
// Acquire returns it.
type listener struct {
	b        *Backend
	mu       sync.Mutex
	id       uint64 // CONNECTION_ID() of the running connection, 0 if none
	anchorID uint64 // CONNECTION_ID() of its anchor
	cancel   context.CancelFunc
	done     chan struct{}
	closed   bool
	waiters  map[*waiter]struct{}
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

// waiting reports whether a wait of key and owner is registered.
func (l *listener) waiting(key, owner string) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	for w := range l.waiters {
		if w.key == key && w.owner == owner {
			return true
		}
	}
	return false
}

// firstAttempt reports whether a wait of key and owner is registered and has not
// attempted yet (and notes that it now has).
func (l *listener) firstAttempt(key, owner string) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	for w := range l.waiters {
		if w.key == key && w.owner == owner {
			first := !w.attempted
			w.attempted = true
			return first
		}
	}
	return false
}

// takeHanded returns, once, the token of a grant the listener read as handed to
// the place of key and owner.
func (l *listener) takeHanded(key, owner string) (uint64, []byte, bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	for w := range l.waiters {
		if w.key == key && w.owner == owner && w.handed != 0 {
			tok, nonce := w.handed, w.nonce
			w.handed, w.nonce = 0, nil
			return tok, nonce, true
		}
	}
	return 0, nil, false
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
	// The anchor holds the lock name that the listener waits for (see sleep).
	anchor, err := l.b.db.Conn(ctx)
	if err != nil {
		return 0, err
	}
	name := "dlock-wake-" + driver.RandomHex(16)
	var got sql.NullInt64
	var anchorID uint64
	if err := anchor.QueryRowContext(ctx, "SELECT GET_LOCK(?, 0), CONNECTION_ID()", name).Scan(&got, &anchorID); err != nil || got.Int64 != 1 {
		anchor.Close()
		if err == nil {
			err = fmt.Errorf("mysqllock: the listener's lock %s was not granted", name)
		}
		return 0, err
	}
	conn, err := l.b.db.Conn(ctx)
	if err != nil {
		anchor.Close()
		return 0, err
	}
	var id uint64
	fail := func(err error, stmts ...*sql.Stmt) (uint64, error) {
		for _, st := range stmts {
			st.Close()
		}
		conn.Close()
		anchor.Close()
		return 0, err
	}
	if err := conn.QueryRowContext(ctx, "SELECT CONNECTION_ID()").Scan(&id); err != nil {
		return fail(err)
	}
	// The listener's two statements, prepared on its connection (one round
	// trip each), before its id is known to any release that could KILL them.
	sleep, err := conn.PrepareContext(ctx, l.b.q.sleep)
	if err != nil {
		return fail(err)
	}
	grants, err := conn.PrepareContext(ctx, l.b.q.grants)
	if err != nil {
		return fail(err, sleep)
	}
	lctx, cancel := context.WithCancel(context.Background())
	l.id, l.anchorID, l.cancel, l.done = id, anchorID, cancel, make(chan struct{})
	go l.loop(lctx, listening{conn, anchor, sleep, grants, id, name}, l.done)
	return id, nil
}

// listening is a running listener's connections and statements.
type listening struct {
	conn, anchor  *sql.Conn
	sleep, grants *sql.Stmt
	id            uint64 // conn's CONNECTION_ID()
	name          string // the lock name the anchor holds
}

func (l *listener) loop(ctx context.Context, c listening, done chan struct{}) {
	defer close(done)
	defer c.anchor.Close()
	defer c.conn.Close()
	defer c.sleep.Close()
	defer c.grants.Close()
	delivered := map[uint64]bool{} // places whose grant was delivered, while they are there
	woken := map[uint64]uint64{}   // places woken by a semaphore's release: their woken count delivered
	l.run(ctx, c, delivered, woken)
}

// run is the listener's loop: wait until a KILL QUERY (or a grant not yet
// delivered), deliver the grants, again; on an error it stops.
func (l *listener) run(ctx context.Context, c listening, delivered map[uint64]bool, woken map[uint64]uint64) {
	for {
		// The wait checks for grants not yet delivered first: a KILL QUERY
		// that came between two statements (and ended none) is not lost. A KILL
		// ends the wait with NULL or error 1317; 1 means the anchor's lock was
		// free (its connection gone): the listener starts again.
		ids := "0"
		for p := range delivered {
			ids += "," + strconv.FormatUint(p, 10)
		}
		wids := "0"
		for p, n := range woken {
			wids += "," + strconv.FormatUint(p, 10) + ":" + strconv.FormatUint(n, 10)
		}
		var slept sql.NullInt64
		err := c.sleep.QueryRowContext(ctx, c.id, ids, c.id, wids, c.name).Scan(&slept)
		if err != nil && ctx.Err() == nil && isErr(err, 1317) { // interrupted
			err = nil
		}
		if err == nil && slept.Valid && slept.Int64 == 1 {
			err = errors.New("the listener's anchor connection is gone")
		}
		for i := 0; err == nil; i++ {
			err = l.deliver(ctx, c.grants, c.id, delivered, woken)
			if err == nil || ctx.Err() != nil || !isErr(err, 1317) || i == 3 {
				break
			}
			// A KILL for a later handoff ended the read: read again.
			err = nil
		}
		if err != nil {
			l.stop(ctx)
			return
		}
	}
}

// stop ends the listening connection's use after an error: every waiter is woken
// (its attempt finds what it was waiting for, or waits again on a new connection).
func (l *listener) stop(ctx context.Context) {
	l.wakeAll()
	l.mu.Lock()
	l.id = 0
	l.mu.Unlock()
	if ctx.Err() == nil {
		time.Sleep(10 * time.Millisecond)
	}
}

// deliver reads the grants handed to the places of this listening connection (one
// read) and gives each to its waiter. A grant whose waiter is gone is left to that
// waiter's Stop, which hands it on. delivered is updated to the places read.
func (l *listener) deliver(ctx context.Context, grants *sql.Stmt, id uint64, delivered map[uint64]bool, woken map[uint64]uint64) error {
	rows, err := grants.QueryContext(ctx, id, id)
	if err != nil {
		return err
	}
	defer rows.Close()
	type grant struct {
		key, owner string
		nonce      []byte
		tok        uint64
	}
	var gs []grant
	clear(delivered)
	was := maps.Clone(woken)
	clear(woken)
	for rows.Next() {
		var p, w uint64
		var k, o, n []byte
		var tok uint64
		if err := rows.Scan(&p, &k, &o, &n, &tok, &w); err != nil {
			return err
		}
		if tok == 0 {
			// A place woken by a semaphore's release: its waiter attempts
			// again (once per bump).
			woken[p] = w
			if was[p] != w {
				gs = append(gs, grant{key: string(k), owner: string(o)})
			}
			continue
		}
		delivered[p] = true
		gs = append(gs, grant{string(k), string(o), n, tok})
	}
	if err := rows.Err(); err != nil {
		return err
	}
	l.mu.Lock()
	for w := range l.waiters {
		for _, g := range gs {
			if w.key == g.key && w.owner == g.owner {
				if g.tok != 0 {
					w.handed, w.nonce = g.tok, g.nonce
				}
				w.wake()
			}
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
