package pglock

import (
	"context"
	"errors"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/dlockio/dlock/driver"
)

// Refresh implements driver.Backend.
func (b *Backend) Refresh(ctx context.Context, key, owner string, ttl time.Duration) error {
	if b.closed.Load() {
		return driver.ErrClosed
	}
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

// handOff locks key's row and runs a release-like statement (see the function
// handOff in sql.go), after the statements pre (with args key, owner and extra), in
// one transaction. It returns ErrNotHeld when the grant had expired or the statement
// found nothing to do.
func (b *Backend) handOff(ctx context.Context, op, sql, key, owner string, pre ...string) error {
	var live, wrote, notified bool
	err := retry(ctx, func() error {
		batch := &pgx.Batch{}
		batch.Queue(b.sql.lockRow, key)
		for i := 0; i+1 < len(pre); i += 2 {
			batch.Queue(pre[i], key, owner, pre[i+1])
		}
		batch.Queue(sql, key, owner)
		br := b.pool.SendBatch(ctx, batch)
		var err error
		for range 1 + len(pre)/2 {
			if _, err = br.Exec(); err != nil {
				break
			}
		}
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
	if !live {
		return driver.ErrNotHeld
	}
	return nil
}

// Release implements driver.Backend. With waiters queued, the lock is reserved for
// the longest-waiting live one and its client is notified; otherwise the row goes.
func (b *Backend) Release(ctx context.Context, key, owner string) error {
	if b.closed.Load() {
		return driver.ErrClosed
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

// ForceRelease implements driver.ForceReleaser: it frees key whoever holds it, and
// hands it to the longest waiter like Release. The old holder learns at its next
// renewal; its fencing token is below every later grant's.
func (b *Backend) ForceRelease(ctx context.Context, key string) error {
	if b.closed.Load() {
		return driver.ErrClosed
	}
	return b.handOff(ctx, "force release", b.sql.forceRelease, key, "")
}

// withdraw gives up owner's place in key's queue, passing a reservation on.
func (b *Backend) withdraw(ctx context.Context, key, owner string) error {
	if b.closed.Load() {
		return driver.ErrClosed
	}
	place := b.lst.place(key, owner)
	drop := b.sql.withdrawOwner // the place is not known: every place of owner's
	if place != "" {
		drop = b.sql.withdrawPlace
	}
	err := b.handOff(ctx, "withdraw waiter", b.sql.withdraw, key, owner, drop, place)
	if err != nil && !errors.Is(err, driver.ErrNotHeld) {
		return err
	}
	b.lst.setPlace(key, owner, "")
	return nil
}

// Inspect implements driver.Inspector. Waiters counts the live places in the queue.
func (b *Backend) Inspect(ctx context.Context, key string) (driver.Info, error) {
	if b.closed.Load() {
		return driver.Info{}, driver.ErrClosed
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

// SetValue implements driver.Valuer: one UPDATE of owner's live grant, which
// compares the owner and leaves the expiry as it was, and notifies the key's
// watches.
func (b *Backend) SetValue(ctx context.Context, key, owner string, value []byte) error {
	if b.closed.Load() {
		return driver.ErrClosed
	}
	if len(value) == 0 {
		value = nil // none
	}
	var tag pgconn.CommandTag
	err := retry(ctx, func() (err error) {
		tag, err = b.pool.Exec(ctx, b.sql.setValue, key, owner, value)
		return err
	})
	if err != nil {
		return b.ctxErr(ctx, wrap("set value", key, err))
	}
	if tag.RowsAffected() == 0 {
		return wrap("set value", key, driver.ErrNotHeld)
	}
	return nil
}
