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
			err = br.QueryRow().Scan(&granted, &have, &token, &left, &ahead, &newPlace)
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
		if _, had := b.semGrants.LoadOrStore(driver.Holder{Key: req.Key, Owner: req.Owner}, struct{}{}); !had {
			b.semCount.Add(1)
		}
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

// isSem reports whether this client took owner's grant of key as a permit.
func (b *Backend) isSem(key, owner string) bool {
	if b.semCount.Load() == 0 {
		return false // no map lookup on a client that holds no permit
	}
	_, ok := b.semGrants.Load(driver.Holder{Key: key, Owner: owner})
	return ok
}

// forgetSem forgets that owner's grant of key was a permit.
func (b *Backend) forgetSem(key, owner string) {
	if b.semCount.Load() == 0 {
		return
	}
	if _, ok := b.semGrants.LoadAndDelete(driver.Holder{Key: key, Owner: owner}); ok {
		b.semCount.Add(-1)
	}
}

// either runs the operation on owner's grant of key in the table where this client
// last saw it (permit first for a grant it took as a permit, the lock table first
// for any other) and, when that says ErrNotHeld and semaphores work, in the other:
// a mutex grant costs nothing more unless it is not held.
func (b *Backend) either(key, owner string, mutex, sem func() error) error {
	first, second := mutex, sem
	if b.isSem(key, owner) {
		first, second = sem, mutex
	}
	err := first()
	if errors.Is(err, driver.ErrNotHeld) && b.semErr == nil {
		err = second()
	}
	return err
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
