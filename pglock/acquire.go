package pglock

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/dlockio/dlock/driver"
)

func micros(d time.Duration) int64 {
	return max(int64((d+time.Microsecond-1)/time.Microsecond), 1)
}

func wrap(op, key string, err error) error {
	return fmt.Errorf("pglock: %s %q: %w", op, key, err)
}

// ctxErr makes sure an error caused by the end of ctx matches ctx.Err().
func (b *Backend) ctxErr(ctx context.Context, err error) error {
	if err != nil && ctx.Err() != nil && !errors.Is(err, ctx.Err()) {
		return driver.Join(err, ctx.Err())
	}
	return err
}

// retry runs f up to three times while it fails on a broken connection (a pooled
// connection whose server went away, or that was terminated) and ctx lasts. Every
// statement here may run twice for its owner: Acquire re-enters the grant a lost reply
// may have made (same token), Refresh extends again, and a repeated Release finds
// nothing and reports ErrNotHeld, the cautious answer.
func retry(ctx context.Context, f func() error) error {
	err := f()
	for i := 0; i < 2 && err != nil && ctx.Err() == nil && connBroken(err); i++ {
		err = f()
	}
	return err
}

// connBroken reports whether err says the connection failed rather than the statement.
func connBroken(err error) bool {
	if pgconn.SafeToRetry(err) {
		return true
	}
	var ce *pgconn.ConnectError
	if errors.As(err, &ce) || errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) {
		return false // a new connection failed (retrying at once will not help), or ctx ended
	}
	var pe *pgconn.PgError
	if errors.As(err, &pe) {
		// FATAL ends the session; 57P01-57P05: administrator command, crash or
		// idle-session shutdown; class 08: connection exception.
		return pe.Severity == "FATAL" || strings.HasPrefix(pe.Code, "57P") || strings.HasPrefix(pe.Code, "08")
	}
	return !errors.Is(err, pgx.ErrNoRows) // an I/O error on a pooled connection
}

// casAttempts bounds how often a statement that lost a compare-and-set race is run
// again within one call.
const casAttempts = 8

// stamped is a batch of stmt (with args) and the statement that gives a row stmt
// inserted its token (see statements.stamp); pgx runs a batch in one implicit
// transaction and one round trip.
func (b *Backend) stamped(req driver.Request, stmt string, args ...any) *pgx.Batch {
	batch := &pgx.Batch{}
	batch.Queue(stmt, args...)
	batch.Queue(b.sql.stamp, req.Key, req.Owner)
	return batch
}

// Acquire implements driver.Backend.
func (b *Backend) Acquire(ctx context.Context, req driver.Request) (driver.Grant, error) {
	if b.closed.Load() {
		return driver.Grant{}, driver.ErrClosed
	}
	var w *waiter
	if req.Wait {
		w = b.lst.lookup(req.Key, req.Owner)
	}
	var g driver.Grant
	var err error
	switch {
	case w != nil:
		g, err = w.attempt(ctx, req) // tracked, so that Stop can withdraw what it leaves
	case ctx.Err() != nil:
		err = b.ctxErr(ctx, wrap("acquire", req.Key, ctx.Err())) // nothing sent
	default:
		// Not tracked: the attempt runs to its end (for up to attemptGrace after
		// ctx ends) before Acquire returns, and its outcome is the caller's. Cut
		// short, pgx sends a cancel request and closes the connection, but a
		// statement the server had not begun when the cancel came runs after it
		// and may grant the key to the caller that gave up: a generated owner
		// id's grant the core gives back, but a stable owner id's would stay for
		// its TTL, held by no one, and another client of that owner id could
		// release it as its own (TestAttemptOutlivesCancel).
		actx, cancel := driver.Outlive(ctx, attemptGrace)
		g, err = b.acquire(actx, req, 0)
		cancel()
	}
	if errors.Is(err, driver.ErrLocked) {
		b.heldLately.Mark(req.Key) // see WatchFirst
	}
	return g, err
}

// attemptGrace is how long an untracked attempt may run on after its call ends
// (see Acquire).
const attemptGrace = 5 * time.Second

// acquire is one attempt of Acquire. seq, when positive, is the number of a tracked
// wait's attempt (see waiter.number): a place it writes records it with the TTL, so
// that a release can grant the key to that place directly.
func (b *Backend) acquire(ctx context.Context, req driver.Request, seq int64) (driver.Grant, error) {
	if req.Limit > 1 || req.Shared {
		return b.semAcquire(ctx, req)
	}
	patience := req.Patience // how long a queued place lasts without another attempt
	if patience <= 0 {
		patience = req.TTL
	}
	var value []byte // NULL for none, empty or not
	if len(req.Value) > 0 {
		value = req.Value
	}
	place := ""
	if req.Wait {
		place = b.lst.place(req.Key, req.Owner)
	}
	if place == "" && !(req.Wait && b.contended(req.Key)) {
		// No row: the key is free, and a plain INSERT takes it. (A waiting
		// attempt on a key this client just handed to a waiter goes straight to
		// the full statement below, which also takes a free key.)
		var token int64
		err := retry(ctx, func() error {
			// A new batch for each try: pgx keeps in a sent batch the statement
			// descriptions of the connection it went out on, which a retry on
			// another connection must not reuse (prepared statement does not exist).
			batch := &pgx.Batch{}
			if value != nil {
				batch.Queue(b.sql.fastAcquireValue, req.Key, req.Owner, micros(req.TTL), value)
			} else {
				batch.Queue(b.sql.fastAcquire, req.Key, req.Owner, micros(req.TTL))
			}
			batch.Queue(b.sql.restamp, req.Key, req.Owner)
			br := b.pool.SendBatch(ctx, batch)
			var notified bool
			err := br.QueryRow().Scan(&token, &notified)
			if err == nil {
				// A token drawn again (see restamp.sql), or none: the first stands.
				if rerr := br.QueryRow().Scan(&token); !errors.Is(rerr, pgx.ErrNoRows) {
					err = rerr
				}
			}
			return driver.Join(err, br.Close())
		})
		if err == nil {
			return driver.Grant{Token: uint64(token)}, nil
		}
		if !errors.Is(err, pgx.ErrNoRows) {
			return driver.Grant{}, b.ctxErr(ctx, wrap("acquire", req.Key, err))
		}
	}
	if place == "" && req.Wait && b.contended(req.Key) {
		// Most likely held by the waiter this client handed it to, with others
		// queued: join the queue in the lighter statement.
		held, err := b.enqueue(ctx, req, patience, value, seq)
		if err != nil {
			return driver.Grant{}, err
		}
		if held != nil {
			return driver.Grant{}, held
		}
	}
	// A place whose client holds its advisory lock stays live without renewal: the
	// attempt of a waiter that has one then only reads, unless it takes the lock
	// (compare-and-set), like an attempt that will not wait. An attempt that may
	// add or renew a place locks the row.
	renew := req.Wait && !b.lst.guards(req.Key, req.Owner)
	sql := b.sql.acquireTry
	if req.Wait && (place == "" || renew) {
		sql = b.sql.acquireWait
	}
	for range casAttempts {
		var granted, mustWrite, wrote bool
		var token, left, limit *int64
		var ahead int64
		var newPlace string
		err := retry(ctx, func() error {
			br := b.pool.SendBatch(ctx, b.stamped(req, sql, req.Key, req.Owner, micros(req.TTL), req.Wait, b.channel, micros(patience), place, renew, req.Reenter, value, seq))
			var async *string // asyncUnless's NULL
			err := br.QueryRow().Scan(&granted, &mustWrite, &wrote, &token, &left, &ahead, &newPlace, &limit, &async)
			if err == nil && granted && wrote && token != nil && *token == 0 {
				err = br.QueryRow().Scan(token) // the row was inserted: its token
			}
			return driver.Join(err, br.Close())
		})
		if err != nil {
			return driver.Grant{}, b.ctxErr(ctx, wrap("acquire", req.Key, err))
		}
		if limit != nil {
			if *limit == 1 && b.semErr == nil {
				// A read-write key's state row: its writers take permits too.
				return b.semAcquire(ctx, req)
			}
			return driver.Grant{}, mismatch(req.Key, *limit, req.Limit) // a semaphore's key
		}
		if req.Wait {
			b.lst.setPlace(req.Key, req.Owner, newPlace)
			if place = newPlace; place == "" && !granted && sql != b.sql.acquireWait {
				sql = b.sql.acquireWait // the place lapsed: queue again, with the row lock
				continue
			}
		}
		if mustWrite && !wrote {
			continue // the row changed under us: decide again on the new version
		}
		if granted {
			return driver.Grant{Token: uint64(*token)}, nil
		}
		var after time.Duration
		if left != nil {
			after = time.Duration(max(*left, 1)) * time.Microsecond
		}
		held := &driver.HeldError{RetryAfter: after}
		if req.Wait {
			// The places still ahead of the caller's, counted up to 8.
			held.Ahead, held.Queued = int(ahead), true
		}
		return driver.Grant{}, held
	}
	return driver.Grant{}, &driver.HeldError{RetryAfter: time.Microsecond}
}

// enqueue adds a waiting caller's place behind a live grant of another owner whose
// row is marked queued (see enqueue.sql), and returns the attempt's refusal; or
// nil and nil when the row was in another state, for the full statement to decide.
func (b *Backend) enqueue(ctx context.Context, req driver.Request, patience time.Duration, value []byte, seq int64) (*driver.HeldError, error) {
	var place *string
	var left *int64
	var ahead int64
	var async *string // asyncUnless's NULL
	err := retry(ctx, func() error {
		return b.pool.QueryRow(ctx, b.sql.enqueue, req.Key, req.Owner, micros(req.TTL), b.channel, micros(patience), value, seq).
			Scan(&place, &left, &ahead, &async)
	})
	if err != nil {
		return nil, b.ctxErr(ctx, wrap("acquire", req.Key, err))
	}
	if place == nil || left == nil {
		return nil, nil
	}
	b.lst.setPlace(req.Key, req.Owner, *place)
	return &driver.HeldError{RetryAfter: time.Duration(max(*left, 1)) * time.Microsecond, Ahead: int(ahead), Queued: true}, nil
}
