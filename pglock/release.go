package pglock

import (
	"context"
	"errors"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/dlockio/dlock/driver"
)

// Refresh implements driver.Backend: an UPDATE of the caller's row, or of its
// permit of a semaphore key.
func (b *Backend) Refresh(ctx context.Context, key, owner string, ttl time.Duration) error {
	if b.closed.Load() {
		return driver.ErrClosed
	}
	err := b.grants.Either(key, owner, b.semErr == nil,
		func() error { return b.refresh(ctx, key, owner, ttl) },
		func() error { return b.semRefresh(ctx, key, owner, ttl) })
	if errors.Is(err, driver.ErrNotHeld) {
		b.grants.Forget(key, owner)
	}
	return err
}

// refresh extends owner's grant of a mutex key.
func (b *Backend) refresh(ctx context.Context, key, owner string, ttl time.Duration) error {
	var tag pgconn.CommandTag
	err := retry(ctx, func() (err error) {
		tag, err = b.pool.Exec(ctx, b.sql.refresh, key, owner, micros(ttl))
		return err
	})
	if err != nil {
		return b.ctxErr(ctx, wrap("refresh", key, err))
	}
	if tag.RowsAffected() == 0 {
		return driver.ErrNotHeld
	}
	return nil
}

// handOff locks key's row and runs a mutex's release or force release (see the
// function handOff in sqlfiles.go) in one transaction. It returns ErrNotHeld when
// the grant had expired or the statement found nothing to do. Those statements
// change no state row (a read-write key's), so the row lock alone orders them
// (lockMutexRow: without the readers' barrier, which a handoff of the hot key
// would otherwise take each time).
func (b *Backend) handOff(ctx context.Context, op, sql, key, owner string) error {
	var live, wrote, notified bool
	err := retry(ctx, func() error {
		batch := &pgx.Batch{}
		batch.Queue(b.sql.lockMutexRow, key)
		batch.Queue(sql, key, owner, "") // no withdrawing place
		br := b.pool.SendBatch(ctx, batch)
		_, err := br.Exec()
		if err == nil {
			err = br.QueryRow().Scan(&live, &wrote, &notified)
		}
		return driver.Join(err, br.Close())
	})
	if errors.Is(err, pgx.ErrNoRows) {
		return driver.ErrNotHeld
	}
	if err != nil {
		return b.ctxErr(ctx, wrap(op, key, err))
	}
	if notified && owner != "" {
		b.handedOn.Mark(key, time.Now())
	} else {
		b.handedOn.Forget(key)
	}
	if !live {
		return driver.ErrNotHeld
	}
	return nil
}

// Release implements driver.Backend. With waiters queued, the lock (or the freed
// permit of a semaphore) is reserved for the longest-waiting live one and its
// client is notified; otherwise the row goes.
func (b *Backend) Release(ctx context.Context, key, owner string) error {
	if b.closed.Load() {
		return driver.ErrClosed
	}
	err := b.grants.Either(key, owner, b.semErr == nil,
		func() error { return b.release(ctx, key, owner) },
		func() error {
			if b.grants.Shared(key, owner) {
				if handled, err := b.readRelease(ctx, key, owner); handled {
					return err
				}
			}
			return b.semHandOff(ctx, "release", b.sql.semRelease, key, owner)
		})
	if err == nil || errors.Is(err, driver.ErrNotHeld) {
		b.grants.Forget(key, owner)
	}
	return err
}

// release frees owner's grant of a mutex key.
func (b *Backend) release(ctx context.Context, key, owner string) error {
	if b.lst.queuedBehind(key, owner) {
		// The grant was handed over with places queued behind it: hand it on at
		// once (the handoff deletes the row if no place is left).
		return b.handOff(ctx, "release", b.sql.release, key, owner)
	}
	// No one waits: a plain DELETE frees the key.
	var live bool
	err := retry(ctx, func() error {
		return b.pool.QueryRow(ctx, b.sql.fastRelease, key, owner).Scan(&live)
	})
	switch {
	case err == nil && live:
		return nil
	case err == nil:
		return driver.ErrNotHeld // it had expired
	case !errors.Is(err, pgx.ErrNoRows):
		return b.ctxErr(ctx, wrap("release", key, err))
	}
	return b.handOff(ctx, "release", b.sql.release, key, owner)
}

// ForceRelease implements driver.ForceReleaser: it frees key whoever holds it
// (every holder of a semaphore), and hands it to the longest waiter (the freed
// permits to the longest waiters) like Release. The old holders learn at their
// next renewal; their fencing tokens are below every later grant's.
func (b *Backend) ForceRelease(ctx context.Context, key string) error {
	if b.closed.Load() {
		return driver.ErrClosed
	}
	err := b.handOff(ctx, "force release", b.sql.forceRelease, key, "")
	if errors.Is(err, driver.ErrNotHeld) && b.semErr == nil {
		err = b.semHandOff(ctx, "force release", b.sql.semForceRelease, key, "")
	}
	return err
}

// withdraw gives up owner's place in key's queue, passing a reservation made for it
// on (the lock of a mutex, or a permit of a semaphore), in one transaction: lock
// the key's row, drop the place, then the handoffs, which change nothing when
// there is no reservation for owner and no unclaimed grant handed to its place
// (handed, when not "", names the place of a grant handed to this waiter), and,
// on a read-write key, a handoff to whom the key now admits (readers that queued
// behind a writer giving up).
func (b *Backend) withdraw(ctx context.Context, key, owner, handed string) error {
	if b.closed.Load() {
		return driver.ErrClosed
	}
	place := b.lst.place(key, owner)
	if handed == "" {
		handed = place
	}
	drop := b.sql.withdrawOwner // the place is not known: every place of owner's
	if place != "" {
		drop = b.sql.withdrawPlace
	}
	err := retry(ctx, func() error {
		batch := &pgx.Batch{}
		batch.Queue(b.sql.lockRow, key)
		batch.Queue(drop, key, owner, place)
		batch.Queue(b.sql.withdraw, key, owner, handed)
		if b.semErr == nil {
			batch.Queue(b.sql.semWithdraw, key, owner)
			batch.Queue(b.sql.semWake, key, owner)
		}
		br := b.pool.SendBatch(ctx, batch)
		var err error
		for range batch.Len() {
			if _, err = br.Exec(); err != nil {
				break
			}
		}
		return driver.Join(err, br.Close())
	})
	if err != nil {
		return b.ctxErr(ctx, wrap("withdraw waiter", key, err))
	}
	b.lst.setPlace(key, owner, "")
	return nil
}

// Inspect implements driver.Inspector: the holder of a mutex key, the oldest
// holder of a semaphore key. Waiters counts the live places in the queue.
func (b *Backend) Inspect(ctx context.Context, key string) (driver.Info, error) {
	if b.closed.Load() {
		return driver.Info{}, driver.ErrClosed
	}
	if b.semErr == nil {
		_, holders, err := b.Holders(ctx, key)
		if err != nil {
			return driver.Info{}, err
		}
		if len(holders) == 0 {
			return driver.Info{}, driver.ErrNotHeld
		}
		return holders[0], nil
	}
	var owner string
	var token, left, waiters int64
	var value []byte
	err := b.pool.QueryRow(ctx, b.sql.inspect, key).Scan(&owner, &token, &left, &waiters, &value)
	if errors.Is(err, pgx.ErrNoRows) {
		return driver.Info{}, driver.ErrNotHeld
	}
	if err != nil {
		return driver.Info{}, b.ctxErr(ctx, wrap("inspect", key, err))
	}
	return driver.Info{Key: key, Owner: owner, Token: uint64(token), TTL: time.Duration(max(left, 0)) * time.Microsecond, Waiters: int(waiters), Value: value}, nil
}

// SetValue implements driver.Valuer: one UPDATE of owner's live grant (or permit),
// which compares the owner and leaves the expiry as it was, and notifies the key's
// watches.
func (b *Backend) SetValue(ctx context.Context, key, owner string, value []byte) error {
	if b.closed.Load() {
		return driver.ErrClosed
	}
	if len(value) == 0 {
		value = nil // none
	}
	err := b.grants.Either(key, owner, b.semErr == nil,
		func() error { return b.setValue(ctx, key, owner, value) },
		func() error { return b.semSetValue(ctx, key, owner, value) })
	if errors.Is(err, driver.ErrNotHeld) {
		return wrap("set value", key, driver.ErrNotHeld)
	}
	return err
}

// setValue replaces the value of owner's grant of a mutex key.
func (b *Backend) setValue(ctx context.Context, key, owner string, value []byte) error {
	var tag pgconn.CommandTag
	err := retry(ctx, func() (err error) {
		tag, err = b.pool.Exec(ctx, b.sql.setValue, key, owner, value)
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

// Queue implements driver.Queuer: the live places of key in the order they will
// be served, a reader's place marked Shared, each with the value of its owner's
// attempt, in one statement (the same liveness test as the acquiring and handing
// statements). A place already handed over is a reserved grant, no longer a place.
func (b *Backend) Queue(ctx context.Context, key string) ([]driver.Info, error) {
	if b.closed.Load() {
		return nil, driver.ErrClosed
	}
	rows, err := b.pool.Query(ctx, b.sql.queue, key)
	if err != nil {
		return nil, b.ctxErr(ctx, wrap("queue", key, err))
	}
	places := []driver.Info{}
	for rows.Next() {
		var owner string
		var shared bool
		var left int64
		var value []byte
		if err := rows.Scan(&owner, &shared, &left, &value); err != nil {
			rows.Close()
			return nil, b.ctxErr(ctx, wrap("queue", key, err))
		}
		places = append(places, driver.Info{Key: key, Owner: owner, TTL: time.Duration(max(left, 0)) * time.Microsecond, Waiters: -1, Value: value, Shared: shared})
	}
	if err := rows.Err(); err != nil {
		return nil, b.ctxErr(ctx, wrap("queue", key, err))
	}
	return places, nil
}
