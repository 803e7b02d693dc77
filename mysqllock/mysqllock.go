package mysqllock

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"net/url"
	"sync"
	"sync/atomic"
	"time"

	"github.com/go-sql-driver/mysql"

	"github.com/dlockio/dlock/driver"
	"github.com/dlockio/dlock/internal/permits"
	"github.com/dlockio/dlock/internal/recent"
)

// Scheme is the URL scheme of this backend, registered with package driver;
// SchemeAlias ("mariadb") is registered as well.
const (
	Scheme      = "mysql"
	SchemeAlias = "mariadb"
)

func init() {
	for _, s := range []string{Scheme, SchemeAlias} {
		driver.Register(s, func(ctx context.Context, u *url.URL) (driver.Backend, error) {
			return Open(ctx, u)
		})
	}
}

// DefaultTable is the default lock table.
const DefaultTable = "dlock_locks"

// Backend is the MySQL/MariaDB backend. It implements driver.Backend,
// driver.Notifier, driver.Inspector, driver.ForceReleaser, driver.Valuer,
// driver.MultiAcquirer, driver.Queuer, driver.Lister, driver.Semaphorer and
// driver.Sharer, and is safe for concurrent use.
type Backend struct {
	config
	db       *sql.DB
	batch    *sql.DB     // Open's pool for several statements in one request (quickBatch), or nil
	batchOff atomic.Bool // the server gave batch a connection whose character set is not escapeSafe
	own      bool
	closed   atomic.Bool
	q        statements
	stmts    prepared // the hot statements of q, prepared
	lst      *listener
	places   sync.Map       // placeKey -> *place: places this client queued
	hot      sync.Map       // key -> struct{}: granted to a queued place (its release hands the key on at once)
	handedOn *recent.Keys   // the keys this client handed to a waiter lately (see contended)
	dropping sync.Map       // placeKey -> *drop: the deletion of a place that had its turn
	drops    sync.WaitGroup // deletions of places that had their turn, scheduled or under way
	dmu      sync.Mutex
	dq       []*drop        // deletions scheduled, under dmu
	dtimer   *time.Timer    // runs them (runDrops), nil if none is scheduled; under dmu
	closing  chan struct{}  // closed by Close: background withdrawals stop
	bg       sync.WaitGroup // background withdrawals (withdrawLater)

	sq     semStatements
	semErr error       // why semaphores and read-write locks do not work (no permit table), or nil
	grants permits.Set // grants this client took as permits
	ids    connIDs     // the server's ids of the pool's connections
}

var (
	_ driver.Inspector     = (*Backend)(nil)
	_ driver.ForceReleaser = (*Backend)(nil)
	_ driver.Notifier      = (*Backend)(nil)
	_ driver.Valuer        = (*Backend)(nil)
	_ driver.Semaphorer    = (*Backend)(nil)
	_ driver.Sharer        = (*Backend)(nil)
)

func newBackend(ctx context.Context, db *sql.DB, opts []Option) (*Backend, error) {
	b := &Backend{db: db, config: config{table: DefaultTable}, handedOn: recent.New(contendedFor), closing: make(chan struct{})}
	for _, o := range opts {
		if o == nil {
			return nil, fmt.Errorf("%w: nil option", driver.ErrInvalid)
		}
		if err := o(&b.config); err != nil {
			return nil, err
		}
	}
	if err := b.ensureSchema(ctx); err != nil {
		return nil, err
	}
	b.q = newStatements(b.table)
	b.sq = newSemStatements(b.table)
	stmts, err := b.prepare(ctx)
	if err != nil {
		return nil, err
	}
	b.stmts = stmts
	b.lst = newListener(b)
	return b, nil
}

// DB returns the connection pool.
func (b *Backend) DB() *sql.DB { return b.db }

// Table returns the lock table's name.
func (b *Backend) Table() string { return b.table }

func micros(d time.Duration) int64 {
	us := d.Microseconds()
	if us < 1 {
		us = 1
	}
	return us
}

// ctxErr makes an error of a request whose context ended wrap the context's error.
func (b *Backend) ctxErr(ctx context.Context, err error) error {
	if err == nil {
		return nil
	}
	if b.closed.Load() && !errors.Is(err, driver.ErrClosed) {
		return fmt.Errorf("%w: %v", driver.ErrClosed, err)
	}
	if cerr := ctx.Err(); cerr != nil && !errors.Is(err, cerr) {
		return fmt.Errorf("mysqllock: %w (%v)", cerr, err)
	}
	return fmt.Errorf("mysqllock: %w", authErr(err))
}

// Acquire implements driver.Backend: one INSERT ... ON DUPLICATE KEY UPDATE. A
// refused attempt that will wait takes (or renews) its place in the key's queue and
// then tries once more, since a release that ran before the place was there woke
// no one. A waiting attempt first returns a grant a release handed to its place
// (see the package documentation, Waiting).
func (b *Backend) Acquire(ctx context.Context, req driver.Request) (driver.Grant, error) {
	if b.closed.Load() {
		return driver.Grant{}, driver.ErrClosed
	}
	if req.Limit > 1 || req.Shared {
		return b.semAcquire(ctx, req)
	}
	// A plain attempt on a key whose row is a state row (a semaphore's or a
	// read-write key's) is decided by the semaphore path, and one that the
	// semaphore path finds a mutex's row again by the mutex path.
	sem := b.semPlaced(req.Key, req.Owner)
	for i := 0; ; i++ {
		var g driver.Grant
		var err error
		if sem {
			g, err = b.semAcquire(ctx, req)
			if !errors.Is(err, errMutexRow) {
				return g, err
			}
		} else {
			g, err = b.acquireMutex(ctx, req)
			if !errors.Is(err, errStateRow) {
				return g, err
			}
		}
		if i == 4 {
			return driver.Grant{}, &driver.HeldError{}
		}
		sem = !sem
	}
}

// semPlaced reports whether the caller's place was made (or last renewed) by
// the semaphore path.
func (b *Backend) semPlaced(key, owner string) bool {
	v, ok := b.places.Load(placeKey{key, owner})
	return ok && v.(*place).sem.Load()
}

// acquireMutex is an attempt at a mutex: see Acquire. It returns errStateRow when
// it finds the key's row a state row.
func (b *Backend) acquireMutex(ctx context.Context, req driver.Request) (driver.Grant, error) {
	if req.Wait {
		if tok, nonce, ok := b.lst.takeHanded(req.Key, req.Owner); ok && b.ownPlace(req.Key, req.Owner, nonce) {
			if g, ok := b.handedGrant(req.Key, req.Owner, tok); ok {
				return g, nil
			}
		}
	}
	// The first waiting attempt on a key this client lately handed on queues
	// at once: the attempt would most likely be refused, after waiting for the
	// row's lock.
	var g driver.Grant
	var err error
	r := refused
	skipped := req.Wait && b.lst.firstAttempt(req.Key, req.Owner) && b.contended(req.Key)
	if !skipped {
		if g, r, err = b.attempt(ctx, req); err != nil {
			return driver.Grant{}, err
		}
		if err := b.stateRefusal(ctx, req.Key, r); err != nil {
			return driver.Grant{}, err
		}
		if r != granted && !req.Wait {
			return driver.Grant{}, b.held(ctx, req.Key)
		}
	}
	if r != granted {
		if r == heldUnmarked {
			// The key's first place: the row is marked before the place is
			// written, so that a newcomer's attempt, which reads only the mark
			// (acquireFast), does not pass the place once it is there.
			if _, err := b.exec(ctx, b.q.mark, req.Key); err != nil {
				return driver.Grant{}, b.ctxErr(ctx, err)
			}
		}
		fresh, qerr := b.queue(ctx, req)
		if qerr != nil {
			return driver.Grant{}, qerr
		}
		var ws waitState
		g, ws, err = b.refused(ctx, req)
		if !errors.Is(err, driver.ErrLocked) || !fresh || (ws.queued && ws.us > 0 && !(skipped && ws.mine)) {
			return g, err
		}
		// A new place on a row not marked queued: mark it, so that its release
		// hands the key on (a row read as marked after the place was written
		// stays marked while the place is live: it is unmarked only by a
		// handoff that finds no live place). A release that ran before handed
		// the key to no one: attempt again.
		if !ws.queued {
			if _, err := b.exec(ctx, b.q.mark, req.Key); err != nil {
				return driver.Grant{}, b.ctxErr(ctx, err)
			}
		}
		if g, r, err = b.attempt(ctx, req); err != nil {
			return driver.Grant{}, err
		}
		if err := b.stateRefusal(ctx, req.Key, r); err != nil {
			return driver.Grant{}, err
		}
		if r != granted {
			return driver.Grant{}, &driver.HeldError{}
		}
	}
	if req.Wait {
		// The grant stands if this fails; the place then lapses after its
		// patience (and had its turn: no release hands it the key).
		b.dropPlaceAsync(req.Key, req.Owner)
	}
	return g, nil
}

// handedGrant returns the grant of token handed to the caller's place, with its
// Age: the key was handed after the insert that made the place (its nonce), sent
// after since.
func (b *Backend) handedGrant(key, owner string, tok uint64) (driver.Grant, bool) {
	v, ok := b.places.Load(placeKey{key, owner})
	if !ok {
		return driver.Grant{}, false
	}
	age := time.Since(v.(*place).since)
	if age <= 0 {
		age = time.Nanosecond
	}
	b.dropPlaceAsync(key, owner)
	return driver.Grant{Token: tok, Age: age}, true
}

// refused reads, for a refused waiting attempt, whether a release handed the key
// to the caller's place (a wake-up lost: the grant is claimed here), whether the
// place has had its turn otherwise (it is then made again at the end of the
// line), and the holder's TTL left.
// The grant is zero and err a HeldError otherwise.
func (b *Backend) refused(ctx context.Context, req driver.Request) (driver.Grant, waitState, error) {
	ws, err := b.waitState(ctx, req.Key, req.Owner)
	if err != nil {
		return driver.Grant{}, ws, b.ctxErr(ctx, err)
	}
	if ws.state {
		return driver.Grant{}, ws, errStateRow
	}
	if ws.claim {
		if g, ok := b.handedGrant(req.Key, req.Owner, ws.tok); ok {
			return g, ws, nil
		}
	}
	switch {
	case ws.consumed && ws.own:
		if err := b.dropPlace(ctx, req.Key, req.Owner); err != nil {
			return driver.Grant{}, ws, b.ctxErr(ctx, err)
		}
	case ws.consumed:
		// The place is one a waiter of the same owner on another client made,
		// and the key may be handed to it: that waiter claims it and deletes the
		// place. This client forgets its own (its next attempt queues again).
		b.places.Delete(placeKey{req.Key, req.Owner})
	}
	return driver.Grant{}, ws, &driver.HeldError{RetryAfter: time.Duration(ws.us) * time.Microsecond}
}

// waitState reads the holder's TTL left, whether the key is handed to the
// caller's place made by this client (and its token), and whether that place has
// had its turn.
func (b *Backend) waitState(ctx context.Context, key, owner string) (ws waitState, err error) {
	var handed bool
	var nonce []byte
	err = b.queryRow(ctx, b.q.waitState, owner, owner, owner, key).Scan(&ws.us, &handed, &nonce, &ws.tok, &ws.consumed, &ws.queued, &ws.mine, &ws.state)
	if errors.Is(err, sql.ErrNoRows) {
		return waitState{}, nil
	}
	ws.own = b.ownPlace(key, owner, nonce)
	ws.claim = handed && ws.own
	return ws, err
}

// waitState is what a waiter reads of its key: the holder's TTL left in
// microseconds (0: free), whether the key is handed to its place (claim, tok),
// whether the place had its turn otherwise, whether the row is marked queued,
// whether the caller's owner holds the key (mine), and whether the caller's
// owner's place is the one this client made (own; its nonce).
type waitState struct {
	us                          int64
	claim                       bool
	tok                         uint64
	consumed, queued, mine, own bool
	state                       bool // the row is a state row (see semaphore.go)
}

// contendedFor is how long after this client handed a key on to a waiter its
// next waiting Lock of the key queues before attempting.
const contendedFor = 20 * time.Millisecond

// contended reports whether this client handed key on to a waiter lately.
func (b *Backend) contended(key string) bool { return b.handedOn.Within(key, time.Now()) }

// ownPlace reports whether nonce is that of the caller's place this client made.
func (b *Backend) ownPlace(key, owner string, nonce []byte) bool {
	v, ok := b.places.Load(placeKey{key, owner})
	return ok && len(nonce) > 0 && string(nonce) == v.(*place).nonce
}

// refusal is what an attempt learnt: granted, or refused and whether the row is
// held and marked queued, when the statement said so.
type refusal int

const (
	granted      refusal = iota
	refused              // held by another owner, or places queued ahead
	heldUnmarked         // held, and the row is not marked queued
	heldMarked           // held, and the row is marked queued
	heldState            // a live state row (a semaphore's or a read-write key's)
	refusedFree          // free but marked queued, and refused by the FIFO check (or a state row)
)

// stateRefusal returns errStateRow when an attempt's refusal says, or leaves
// open, that the key's row is a state row (one read in the second case: an
// attempt without a place refused by the full statement).
func (b *Backend) stateRefusal(ctx context.Context, key string, r refusal) error {
	switch r {
	case heldState:
		return errStateRow
	case refusedFree:
		var state bool
		err := b.queryRow(ctx, b.sq.isState, key).Scan(&state)
		if err != nil && !errors.Is(err, sql.ErrNoRows) {
			return b.ctxErr(ctx, err)
		}
		if state {
			return errStateRow
		}
	}
	return nil
}

// attempt runs the acquire statement once: acquireFast for a caller with no place
// made by this client, and acquire (FIFO among the places) for a waiter with one,
// or when acquireFast found the row free but marked queued.
func (b *Backend) attempt(ctx context.Context, req driver.Request) (driver.Grant, refusal, error) {
	v, waiting := b.places.Load(placeKey{req.Key, req.Owner})
	if !waiting {
		g, ok, last, err := b.upsert(ctx, req, b.q.acquireFast, req.Key, req.Owner, value(req.Value), micros(req.TTL), req.Reenter, req.Reenter)
		switch {
		case err != nil:
			return driver.Grant{}, refused, err
		case ok:
			return g, granted, nil
		case last == refusedHeld:
			return driver.Grant{}, heldUnmarked, nil
		case last == refusedHeld+1:
			return driver.Grant{}, heldMarked, nil
		case last == refusedHeld+stateQueued:
			return driver.Grant{}, heldState, nil
		}
		// refusedQueued: places are queued, and the full statement decides
		// whether the caller is ahead of every live one.
		g, ok, _, err = b.upsert(ctx, req, b.q.acquire, acquireArgs(req, nil, req.Reenter)...)
		if err != nil || !ok {
			return driver.Grant{}, refusedFree, err
		}
		return g, granted, nil
	}
	g, ok, _, err := b.upsert(ctx, req, b.q.acquire, acquireArgs(req, []byte(v.(*place).nonce), req.Reenter)...)
	if err != nil || !ok {
		return driver.Grant{}, refused, err
	}
	return g, granted, nil
}

// placeNonce returns the nonce of the place of owner on key that this client
// made, or nil when it made none.
func (b *Backend) placeNonce(key, owner string) []byte {
	if v, ok := b.places.Load(placeKey{key, owner}); ok {
		return []byte(v.(*place).nonce)
	}
	return nil
}

// acquireArgs are the parameters of the acquire statement for req, whose caller's
// place (made by this client) has nonce: nil when it has none, which no place
// matches.
func acquireArgs(req driver.Request, nonce []byte, reenter bool) []any {
	return []any{req.Key, req.Owner, value(req.Value), micros(req.TTL),
		req.Key, req.Owner, req.Key, req.Owner, nonce, req.Key, req.Owner, nonce, reenter}
}

// upsert runs an acquire statement (acquire or acquireFast) and returns the grant
// and true if the caller holds the key after it; otherwise last is the statement's
// LAST_INSERT_ID (acquireFast's refusal, see refusedHeld).
func (b *Backend) upsert(ctx context.Context, req driver.Request, stmt string, args ...any) (g driver.Grant, ok bool, last int64, err error) {
	res, err := b.exec(ctx, stmt, args...)
	var n int64
	if err == nil {
		n, err = res.RowsAffected()
	}
	if err == nil {
		last, err = res.LastInsertId()
	}
	if err != nil {
		return driver.Grant{}, false, 0, b.ctxErr(ctx, err)
	}
	if n == 1 || n == 2 {
		return driver.Grant{Token: uint64(last)}, true, 0, nil
	}
	if req.Reenter && (stmt != b.q.acquireFast || last > refusedHeld+stateQueued) {
		// A re-entry that set the same expiry (within the same microsecond)
		// changed nothing: read whether the row is the caller's.
		var tok uint64
		err := b.queryRow(ctx, b.q.owned, req.Key, req.Owner).Scan(&tok)
		if err == nil {
			return driver.Grant{Token: tok}, true, 0, nil
		}
		if !errors.Is(err, sql.ErrNoRows) {
			return driver.Grant{}, false, 0, b.ctxErr(ctx, err)
		}
	}
	return driver.Grant{}, false, last, nil
}

// held returns the HeldError of a refused attempt, with the holder's TTL left.
func (b *Backend) held(ctx context.Context, key string) error {
	var us int64
	err := b.queryRow(ctx, b.q.heldTTL, key).Scan(&us)
	if err != nil && !errors.Is(err, sql.ErrNoRows) {
		return b.ctxErr(ctx, err)
	}
	return &driver.HeldError{RetryAfter: time.Duration(us) * time.Microsecond}
}

// Refresh implements driver.Backend.
func (b *Backend) Refresh(ctx context.Context, key, owner string, ttl time.Duration) error {
	if b.closed.Load() {
		return driver.ErrClosed
	}
	// Zero rows changed: not held, or the same expiry written again within a
	// microsecond.
	return b.grants.Either(key, owner, b.semErr == nil, func() error {
		return b.updateOwned(ctx, key, owner, b.q.refresh, micros(ttl), key, owner)
	}, func() error {
		return b.semRefresh(ctx, key, owner, ttl)
	})
}

// updateOwned runs stmt, an UPDATE of the row of key that compares owner and its
// expiry, and returns nil if it changed the row or the row is the owner's live
// grant anyway (the statement wrote what was there), ErrNotHeld otherwise.
func (b *Backend) updateOwned(ctx context.Context, key, owner, stmt string, args ...any) error {
	res, err := b.exec(ctx, stmt, args...)
	if err != nil {
		return b.ctxErr(ctx, err)
	}
	if n, err := res.RowsAffected(); err != nil {
		return b.ctxErr(ctx, err)
	} else if n == 1 {
		return nil
	}
	var tok uint64
	err = b.queryRow(ctx, b.q.owned, key, owner).Scan(&tok)
	if errors.Is(err, sql.ErrNoRows) {
		return driver.ErrNotHeld
	}
	return b.ctxErr(ctx, err)
}

// Release implements driver.Backend.
func (b *Backend) Release(ctx context.Context, key, owner string) error {
	if b.closed.Load() {
		return driver.ErrClosed
	}
	err := b.grants.Either(key, owner, b.semErr == nil, func() error {
		return b.releaseMutex(ctx, key, owner)
	}, func() error {
		return b.semRelease(ctx, key, owner)
	})
	b.grants.Forget(key, owner)
	return err
}

// releaseMutex releases a mutex's grant.
func (b *Backend) releaseMutex(ctx context.Context, key, owner string) error {
	if _, hot := b.hot.LoadAndDelete(key); !hot {
		res, err := b.exec(ctx, b.q.release, key, owner)
		if err != nil {
			return b.ctxErr(ctx, err)
		}
		if n, err := res.RowsAffected(); err != nil {
			return b.ctxErr(ctx, err)
		} else if n == 1 {
			return nil
		}
	}
	// Not held, or places are queued (or were lately): hand the key to the
	// first live place, if any.
	return b.handOn(ctx, b.q.handoff, key, owner)
}

// handOn runs the handoff statement (handoff or force) and wakes the client of the
// place it handed the key to.
func (b *Backend) handOn(ctx context.Context, query, key string, args ...any) error {
	res, err := b.exec(ctx, query, append([]any{key}, args...)...)
	if err != nil {
		return b.ctxErr(ctx, err)
	}
	if n, err := res.RowsAffected(); err != nil {
		return b.ctxErr(ctx, err)
	} else if n == 0 {
		return driver.ErrNotHeld
	}
	conn, _ := res.LastInsertId()
	if conn != 0 {
		b.handedOn.Mark(key, time.Now())
		b.wake(ctx, uint64(conn))
	} else {
		b.handedOn.Forget(key)
	}
	return nil
}

// Inspect implements driver.Inspector; Waiters counts the live queued places.
func (b *Backend) Inspect(ctx context.Context, key string) (driver.Info, error) {
	if b.closed.Load() {
		return driver.Info{}, driver.ErrClosed
	}
	var owner, val []byte
	var tok uint64
	var us int64
	var waiters int
	err := b.queryRow(ctx, b.q.inspect, key).Scan(&owner, &val, &tok, &us, &waiters)
	if errors.Is(err, sql.ErrNoRows) {
		return driver.Info{}, driver.ErrNotHeld
	}
	if err != nil {
		return driver.Info{}, b.ctxErr(ctx, err)
	}
	if string(owner) == stateOwner {
		_, hs, err := b.Holders(ctx, key)
		if err != nil {
			return driver.Info{}, err
		}
		if len(hs) == 0 {
			return driver.Info{}, driver.ErrNotHeld
		}
		return hs[0], nil
	}
	return driver.Info{Key: key, Owner: string(owner), Token: tok, TTL: time.Duration(us) * time.Microsecond, Waiters: waiters, Value: val}, nil
}

// SetValue implements driver.Valuer: one UPDATE comparing the owner and the expiry.
func (b *Backend) SetValue(ctx context.Context, key, owner string, v []byte) error {
	if b.closed.Load() {
		return driver.ErrClosed
	}
	// Zero rows changed: not held, or the same value written again.
	return b.grants.Either(key, owner, b.semErr == nil, func() error {
		return b.updateOwned(ctx, key, owner, b.q.setValue, value(v), key, owner)
	}, func() error {
		return b.semSetValue(ctx, key, owner, v)
	})
}

// value is the column value of a grant's value: NULL for none.
func value(v []byte) any {
	if len(v) == 0 {
		return nil
	}
	return v
}

// ForceRelease implements driver.ForceReleaser.
func (b *Backend) ForceRelease(ctx context.Context, key string) error {
	if b.closed.Load() {
		return driver.ErrClosed
	}
	err := b.handOn(ctx, b.q.force, key)
	if errors.Is(err, driver.ErrNotHeld) && b.semErr == nil {
		// Not a mutex's live row: perhaps a state row, whose permits go.
		err = b.semFree(ctx, key, "", false, "")
	}
	return err
}

// Close implements driver.Backend: when the backend was made by Open, it closes the
// pool. Grants still held stay until they expire.
func (b *Backend) Close() error {
	if b.closed.Swap(true) {
		return nil
	}
	b.lst.close()
	close(b.closing)
	b.bg.Wait()
	b.flushDrops()
	b.drops.Wait()
	b.stmts.close()
	if b.batch != nil {
		b.batch.Close()
	}
	if b.own {
		return b.db.Close()
	}
	return nil
}

// exec runs one autocommitted statement, again (up to 16 times, after a short
// random pause) if InnoDB chose it as a deadlock's victim (it was then rolled back
// whole, so running it again is safe). The reads
// of the queue table inside the acquire statement take shared locks (REPEATABLE
// READ), which can meet a waiter's upsert of its place.
func (b *Backend) exec(ctx context.Context, query string, args ...any) (sql.Result, error) {
	var res sql.Result
	err := retryTx(ctx, func() (err error) {
		if st := b.stmts[query]; st != nil {
			res, err = st.ExecContext(ctx, args...)
		}
		if st := b.stmts[query]; st == nil || isErr(err, errTooManyPrepared) {
			res, err = b.db.ExecContext(ctx, query, args...)
		}
		return err
	})
	return res, err
}

// errTooManyPrepared is ER_MAX_PREPARED_STMT_COUNT_REACHED: the server holds
// max_prepared_stmt_count prepared statements already.
const errTooManyPrepared = 1461

// retryable reports whether err ended a statement or transaction that changed
// nothing and may simply run again: InnoDB chose it as a deadlock's victim (1213),
// or it waited for a row lock longer than the session's innodb_lock_wait_timeout
// (1205; see "Cancelled calls" in the package documentation).
func retryable(err error) bool { return isErr(err, 1213) || isErr(err, 1205) }

func isErr(err error, number uint16) bool {
	var me *mysql.MySQLError
	return errors.As(err, &me) && me.Number == number
}

// queryRow runs a query of one row, prepared if it is one of the hot statements.
func (b *Backend) queryRow(ctx context.Context, query string, args ...any) *sql.Row {
	if st := b.stmts[query]; st != nil {
		if r := st.QueryRowContext(ctx, args...); !isErr(r.Err(), errTooManyPrepared) {
			return r
		}
	}
	return b.db.QueryRowContext(ctx, query, args...)
}
