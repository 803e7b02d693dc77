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

var _ driver.MultiAcquirer = (*Backend)(nil)

// AcquireAll implements driver.MultiAcquirer: one batch, in one transaction and one
// round trip, locks the rows of the keys that have one in ascending key order
// (lock_row), decides on every key and, when all are free, takes them
// (acquire_all.sql), then draws the tokens of the rows it inserted (stamp). A key
// whose row another client inserts or locks between the two statements fails the
// batch, which changes nothing then, and the attempt runs again.
func (b *Backend) AcquireAll(ctx context.Context, reqs []driver.Request) ([]driver.Grant, error) {
	if b.closed.Load() {
		return nil, driver.ErrClosed
	}
	if len(reqs) == 0 {
		return nil, nil
	}
	keys := make([]string, len(reqs))
	for i, req := range reqs {
		keys[i] = req.Key
	}
	owner, ttl := reqs[0].Owner, micros(reqs[0].TTL)
	for range casAttempts {
		gs, err := b.acquireAll(ctx, keys, owner, ttl)
		if !lostRace(err) {
			return gs, err
		}
	}
	return nil, fmt.Errorf("pglock: %q: %w", keys[0], &driver.HeldError{RetryAfter: time.Microsecond})
}

// lostRace reports whether err is the failure of an AcquireAll batch that raced
// another client: a key's row inserted meanwhile (unique_violation), or locked
// meanwhile (lock_not_available, see acquire_all.sql); deadlock_detected too,
// which the key order should rule out.
func lostRace(err error) bool {
	var pe *pgconn.PgError
	return errors.As(err, &pe) && (pe.Code == "23505" || pe.Code == "55P03" || pe.Code == "40P01")
}

// acquireAll is one attempt of AcquireAll.
func (b *Backend) acquireAll(ctx context.Context, keys []string, owner string, ttl int64) ([]driver.Grant, error) {
	type keyRow struct {
		free               bool
		token, left, limit *int64
	}
	var rows []keyRow
	var stamped map[string]int64
	err := retry(ctx, func() error {
		rows, stamped = rows[:0], map[string]int64{}
		batch := &pgx.Batch{}
		batch.Queue(b.sql.lockRows, keys)
		acquireAll := b.sql.acquireAll
		if b.semErr != nil {
			acquireAll = b.sql.acquireAllMutex
		}
		batch.Queue(acquireAll, keys, owner, ttl)
		batch.Queue(b.sql.stampAll, keys, owner)
		br := b.pool.SendBatch(ctx, batch)
		_, err := br.Exec()
		var rs pgx.Rows
		if err == nil {
			rs, err = br.Query()
		}
		if err == nil {
			var r keyRow
			_, err = pgx.ForEachRow(rs, []any{&r.free, &r.token, &r.left, &r.limit}, func() error {
				rows = append(rows, r)
				return nil
			})
		}
		if err == nil {
			rs, err = br.Query()
		}
		if err == nil {
			var key string
			var token int64
			_, err = pgx.ForEachRow(rs, []any{&key, &token}, func() error {
				stamped[key] = token
				return nil
			})
		}
		return driver.Join(err, br.Close())
	})
	if err == nil && len(rows) != len(keys) {
		err = fmt.Errorf("%d rows for %d keys", len(rows), len(keys))
	}
	if err != nil {
		if lostRace(err) {
			return nil, err
		}
		return nil, b.ctxErr(ctx, fmt.Errorf("pglock: acquire %q and %d more: %w", keys[0], len(keys)-1, err))
	}
	for i, r := range rows {
		if r.free {
			continue
		}
		if r.limit != nil && *r.limit > 1 {
			return nil, mismatch(keys[i], *r.limit, 1) // a semaphore's key, as Acquire says
		}
		// Held, reserved for a waiter, queued for, or a read-write key's (which
		// LockAll then takes on its own, as Acquire would).
		held := &driver.HeldError{}
		if r.left != nil {
			held.RetryAfter = time.Duration(max(*r.left, 1)) * time.Microsecond
		}
		return nil, fmt.Errorf("pglock: %q: %w", keys[i], held)
	}
	gs := make([]driver.Grant, len(keys))
	for i, r := range rows {
		var token int64
		if r.token != nil {
			token = *r.token
		}
		if token == 0 {
			token = stamped[keys[i]] // the row was inserted
		}
		if token == 0 {
			return nil, fmt.Errorf("pglock: acquire %q: granted without a token", keys[i])
		}
		gs[i].Token = uint64(token)
	}
	return gs, nil
}
