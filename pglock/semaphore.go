package pglock

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/dlockio/dlock/driver"
)

// Semaphores (driver.Request.Limit > 1). A semaphore key's row in the lock table is
// its state row: owner '#' (no owner id can be '#'), token its limit, expires_at the
// latest expiry of its permits (so that a mutex attempt, which reads only the lock
// table, sees whether the key is bound), no value. Each holder's permit is a row of
// the permit table (table_permits), keyed (key, owner): its token, expiry (server
// clock) and value; a permit a release handed to a queued waiter is reserved
// (reserved, channel: the waiter's client's channel) until the waiter's attempt
// takes it with a new token. Waiters queue in the lock table's place rows, as for a
// mutex. Every statement that changes a semaphore locks its state row first, in the
// same transaction (sem_lock, lock_row), so each decides on every permit and place
// committed before it.

// mismatch is the error of an attempt whose limit differs from the key's.
func mismatch(key string, have int64, want int) error {
	return fmt.Errorf("pglock: acquire %q: %w: the key admits %d holders, the attempt asked for %d", key, driver.ErrLimitMismatch, have, max(want, 1))
}

// semAcquire is one attempt at a permit of key req.Key (req.Limit > 1), or at a
// read-write key's grant (limit 1: a shared attempt, or an exclusive one on a key
// whose row is a read-write state row): one batch, sem_lock then sem_acquire, in
// one transaction and one round trip.
func (b *Backend) semAcquire(ctx context.Context, req driver.Request) (driver.Grant, error) {
	if b.semErr != nil {
		return driver.Grant{}, wrap("acquire", req.Key, fmt.Errorf("%w: %w", driver.ErrUnsupported, b.semErr))
	}
	patience := req.Patience
	if patience <= 0 {
		patience = req.TTL
	}
	var value []byte
	if len(req.Value) > 0 {
		value = req.Value
	}
	place := ""
	if req.Wait {
		place = b.lst.place(req.Key, req.Owner)
	}
	renew := req.Wait && !b.lst.guards(req.Key, req.Owner)
	limit := int64(max(req.Limit, 1))
	if req.Shared && limit == 1 && place == "" {
		token, ok, err := b.readAcquire(ctx, req, value)
		if err != nil {
			return driver.Grant{}, b.ctxErr(ctx, wrap("acquire", req.Key, err))
		}
		if ok {
			b.grants.Remember(req.Key, req.Owner, true)
			return driver.Grant{Token: uint64(token)}, nil
		}
	}
	var granted bool
	var have, token, left *int64
	var ahead int64
	var newPlace string
	err := retry(ctx, func() error {
		batch := &pgx.Batch{}
		batch.Queue(b.sql.semLock, req.Key, limit)
		batch.Queue(b.sql.semAcquire, req.Key, req.Owner, micros(req.TTL), req.Wait, b.channel, micros(patience), place, renew, req.Reenter, value, limit, req.Shared)
		br := b.pool.SendBatch(ctx, batch)
		_, err := br.Exec()
		if err == nil {
			var async *string // asyncUnless's NULL
			err = br.QueryRow().Scan(&granted, &have, &token, &left, &ahead, &newPlace, &async)
		}
		return driver.Join(err, br.Close())
	})
	if err != nil {
		return driver.Grant{}, b.ctxErr(ctx, wrap("acquire", req.Key, err))
	}
	if req.Wait {
		b.lst.setPlace(req.Key, req.Owner, newPlace)
	}
	if have != nil {
		return driver.Grant{}, mismatch(req.Key, *have, req.Limit)
	}
	if granted && token != nil {
		b.grants.Remember(req.Key, req.Owner, req.Shared)
		return driver.Grant{Token: uint64(*token)}, nil
	}
	held := &driver.HeldError{}
	if left != nil {
		held.RetryAfter = time.Duration(max(*left, 1)) * time.Microsecond
	}
	if req.Wait {
		held.Ahead, held.Queued = int(ahead), true
	}
	return driver.Grant{}, held
}

// readAcquire is a reader's fast grant (read_lock, read_acquire in one batch and
// transaction): it takes the key's readers' barrier lock shared, no row lock, and
// writes only its own permit, so readers' grants run together. ok is false when
// the fast grant does not apply (no read-write state row bounding the permit, a
// writer's permit, a live place, a permit of the owner's own); the full attempt
// then decides.
func (b *Backend) readAcquire(ctx context.Context, req driver.Request, value []byte) (token int64, ok bool, err error) {
	err = retry(ctx, func() error {
		ok = false
		batch := &pgx.Batch{}
		batch.Queue(b.sql.readLock, req.Key)
		batch.Queue(b.sql.readAcquire, req.Key, req.Owner, micros(req.TTL), value)
		br := b.pool.SendBatch(ctx, batch)
		_, err := br.Exec()
		if err == nil {
			err = br.QueryRow().Scan(&token)
			if err == nil {
				ok = true
			} else if errors.Is(err, pgx.ErrNoRows) {
				err = nil
			}
		}
		return driver.Join(err, br.Close())
	})
	return token, ok, err
}

// readRelease is a reader's fast release (read_lock, read_release, read_last,
// read_wake in one batch and transaction): it deletes its shared permit under the
// key's readers' barrier, held shared. When a place is queued, or no other reader
// seems left, and the barrier can be taken exclusively and the state row locked
// at once, read_wake hands the key to whom it now admits or drops the key's rows
// in the same transaction. When a place is queued and they cannot be taken at
// once, the full handoff (lock_row, sem_wake) runs in a transaction of its own,
// which waits for the transactions in flight (in the background if the caller
// gives up first). When no place is queued and they cannot be taken at once
// (another reader's grant or release is in flight), nothing more is done: the
// state row is left, with perhaps no permit and no place, a free key to every
// statement (see read_last.sql), which the key's next release or handoff that
// finds it alone drops. handled is false when the owner holds no shared permit of
// key (the full release decides).
func (b *Backend) readRelease(ctx context.Context, key, owner string) (handled bool, err error) {
	var live, notified, wake, places bool
	err = retry(ctx, func() error {
		wake = false
		batch := &pgx.Batch{}
		batch.Queue(b.sql.readLock, key)
		batch.Queue(b.sql.readRelease, key, owner)
		batch.Queue(b.sql.readLast, key, owner)
		batch.Queue(b.sql.readWake, key, owner)
		br := b.pool.SendBatch(ctx, batch)
		_, err := br.Exec()
		if err == nil {
			err = br.QueryRow().Scan(&live, &notified)
		}
		if err == nil {
			err = br.QueryRow().Scan(&wake, &places)
		}
		if err == nil {
			_, err = br.Exec()
		}
		return driver.Join(err, br.Close())
	})
	if errors.Is(err, pgx.ErrNoRows) {
		return false, nil
	}
	if err != nil {
		return true, b.ctxErr(ctx, wrap("release", key, err))
	}
	if wake && places {
		// A writer may be let in: wait for the transactions in flight. A queued
		// writer must be woken even when the caller gives up meanwhile (the
		// permit is gone already): if the caller's context ends first, the
		// handoff runs again in the background, bounded, and Close waits for it.
		handOff := func(ctx context.Context) error {
			return retry(ctx, func() error {
				batch := &pgx.Batch{}
				batch.Queue(b.sql.lockRow, key)
				batch.Queue(b.sql.semWake, key, owner)
				return b.pool.SendBatch(ctx, batch).Close()
			})
		}
		if err := handOff(ctx); err != nil && ctx.Err() != nil {
			b.lst.mu.Lock()
			b.lst.background(func(ctx context.Context) { _ = handOff(ctx) })
			b.lst.mu.Unlock()
		}
	}
	if !live {
		return true, driver.ErrNotHeld
	}
	return true, nil
}

// semRefresh extends owner's permit of key (lock_row, then sem_refresh).
func (b *Backend) semRefresh(ctx context.Context, key, owner string, ttl time.Duration) error {
	var tag pgconn.CommandTag
	err := retry(ctx, func() error {
		batch := &pgx.Batch{}
		batch.Queue(b.sql.lockRow, key)
		batch.Queue(b.sql.semRefresh, key, owner, micros(ttl))
		br := b.pool.SendBatch(ctx, batch)
		_, err := br.Exec()
		if err == nil {
			tag, err = br.Exec()
		}
		return driver.Join(err, br.Close())
	})
	if err != nil {
		return b.ctxErr(ctx, wrap("refresh", key, err))
	}
	if tag.RowsAffected() == 0 {
		return driver.ErrNotHeld
	}
	return nil
}

// semHandOff locks key's state row and runs sql (one of the sem_hand_off
// variants) in one transaction. It returns ErrNotHeld when no permit it frees was
// live.
func (b *Backend) semHandOff(ctx context.Context, op, sql, key, owner string) error {
	var live bool
	var notified int64
	err := retry(ctx, func() error {
		batch := &pgx.Batch{}
		batch.Queue(b.sql.lockRow, key)
		batch.Queue(sql, key, owner)
		br := b.pool.SendBatch(ctx, batch)
		_, err := br.Exec()
		if err == nil {
			err = br.QueryRow().Scan(&live, &notified)
		}
		return driver.Join(err, br.Close())
	})
	if errors.Is(err, pgx.ErrNoRows) {
		return driver.ErrNotHeld
	}
	if err != nil {
		return b.ctxErr(ctx, wrap(op, key, err))
	}
	if !live {
		return driver.ErrNotHeld
	}
	return nil
}

// semSetValue replaces the value of owner's permit of key.
func (b *Backend) semSetValue(ctx context.Context, key, owner string, value []byte) error {
	var tag pgconn.CommandTag
	err := retry(ctx, func() (err error) {
		tag, err = b.pool.Exec(ctx, b.sql.semSetValue, key, owner, value)
		return err
	})
	if err != nil {
		return b.ctxErr(ctx, wrap("set value", key, err))
	}
	if tag.RowsAffected() == 0 {
		return driver.ErrNotHeld
	}
	return nil
}

// Holders implements driver.Semaphorer: the key's limit (1 for a mutex) and its
// live holders, the oldest grant (the lowest token) first, in one statement; limit
// 0 and none when no one holds the key. Waiters in each counts the live places.
func (b *Backend) Holders(ctx context.Context, key string) (int, []driver.Info, error) {
	if b.closed.Load() {
		return 0, nil, driver.ErrClosed
	}
	if b.semErr != nil {
		info, err := b.Inspect(ctx, key)
		if errors.Is(err, driver.ErrNotHeld) {
			return 0, nil, nil
		}
		if err != nil {
			return 0, nil, err
		}
		return 1, []driver.Info{info}, nil
	}
	rows, err := b.pool.Query(ctx, b.sql.holders, key)
	if err != nil {
		return 0, nil, b.ctxErr(ctx, wrap("holders", key, err))
	}
	var limit int64
	var infos []driver.Info
	for rows.Next() {
		var owner string
		var token, left, waiters int64
		var value []byte
		var shared bool
		if err := rows.Scan(&limit, &owner, &token, &left, &waiters, &value, &shared); err != nil {
			rows.Close()
			return 0, nil, b.ctxErr(ctx, wrap("holders", key, err))
		}
		infos = append(infos, driver.Info{Key: key, Owner: owner, Token: uint64(token), TTL: time.Duration(max(left, 0)) * time.Microsecond, Waiters: int(waiters), Value: value, Shared: shared})
	}
	if err := rows.Err(); err != nil {
		return 0, nil, b.ctxErr(ctx, wrap("holders", key, err))
	}
	if len(infos) == 0 {
		return 0, nil, nil
	}
	return int(limit), infos, nil
}
