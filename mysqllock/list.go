package mysqllock

import (
	"context"
	"database/sql"
	"errors"
	"strconv"
	"time"

	"github.com/dlockio/dlock/driver"
)

var (
	_ driver.Queuer = (*Backend)(nil)
	_ driver.Lister = (*Backend)(nil)
)

// Queue implements driver.Queuer: the live places of key in the queue table, in
// line order (their ids), each with the time left of its patience. A place whose
// owner holds the key (granted, its place not yet deleted) is not listed.
func (b *Backend) Queue(ctx context.Context, key string) ([]driver.Info, error) {
	if b.closed.Load() {
		return nil, driver.ErrClosed
	}
	rows, err := b.db.QueryContext(ctx, b.q.queue, key)
	if err != nil {
		return nil, b.ctxErr(ctx, err)
	}
	defer rows.Close()
	places := []driver.Info{}
	for rows.Next() {
		var owner, val []byte
		var us int64
		var shared bool
		if err := rows.Scan(&owner, &val, &us, &shared); err != nil {
			return nil, b.ctxErr(ctx, err)
		}
		places = append(places, driver.Info{Key: key, Owner: string(owner), TTL: time.Duration(us) * time.Microsecond, Waiters: -1, Value: val, Shared: shared})
	}
	if err := rows.Err(); err != nil {
		return nil, b.ctxErr(ctx, err)
	}
	return places, nil
}

// List implements driver.Lister: one read of the live rows whose key starts with
// prefix (a range scan of the primary key from prefix on), in key order, each with
// the count of its live queued places as Inspect reports it.
func (b *Backend) List(ctx context.Context, prefix string) ([]driver.Info, error) {
	if b.closed.Load() {
		return nil, driver.ErrClosed
	}
	rows, err := b.db.QueryContext(ctx, b.q.list, prefix, len(prefix), prefix)
	if err != nil {
		return nil, b.ctxErr(ctx, err)
	}
	defer rows.Close()
	var out []driver.Info
	for rows.Next() {
		var key, owner, val []byte
		var tok uint64
		var us int64
		var waiters int
		if err := rows.Scan(&key, &owner, &val, &tok, &us, &waiters); err != nil {
			return nil, b.ctxErr(ctx, err)
		}
		out = append(out, driver.Info{Key: string(key), Owner: string(owner), Token: tok, TTL: time.Duration(us) * time.Microsecond, Waiters: waiters, Value: val})
	}
	if err := rows.Err(); err != nil {
		return nil, b.ctxErr(ctx, err)
	}
	rows.Close()
	// A state row stands for its permits, oldest first.
	var all []driver.Info
	for _, in := range out {
		if in.Owner != stateOwner {
			all = append(all, in)
			continue
		}
		hs, err := b.permitHolders(ctx, in.Key, in.Waiters)
		if err != nil {
			return nil, err
		}
		all = append(all, hs...)
	}
	return all, nil
}

// Holders implements driver.Semaphorer: the key's limit (1 for a mutex and a
// read-write key) and its live holders, oldest grant first, each with the count
// of live places; limit 0 and none when no one holds the key.
func (b *Backend) Holders(ctx context.Context, key string) (int, []driver.Info, error) {
	if b.closed.Load() {
		return 0, nil, driver.ErrClosed
	}
	var owner, val []byte
	var tok uint64
	var us int64
	var waiters int
	err := b.queryRow(ctx, b.q.inspect, key).Scan(&owner, &val, &tok, &us, &waiters)
	if errors.Is(err, sql.ErrNoRows) {
		return 0, nil, nil
	}
	if err != nil {
		return 0, nil, b.ctxErr(ctx, err)
	}
	if string(owner) != stateOwner {
		return 1, []driver.Info{{Key: key, Owner: string(owner), Token: tok, TTL: time.Duration(us) * time.Microsecond, Waiters: waiters, Value: val}}, nil
	}
	hs, err := b.permitHolders(ctx, key, waiters)
	if err != nil || len(hs) == 0 {
		return 0, nil, err
	}
	limit, _ := strconv.Atoi(string(val))
	return max(limit, 1), hs, nil
}

// permitHolders reads the live permits of key, oldest first.
func (b *Backend) permitHolders(ctx context.Context, key string, waiters int) ([]driver.Info, error) {
	if b.semErr != nil {
		return nil, nil
	}
	rows, err := b.db.QueryContext(ctx, b.sq.holders, key)
	if err != nil {
		return nil, b.ctxErr(ctx, err)
	}
	defer rows.Close()
	var hs []driver.Info
	for rows.Next() {
		var owner, val []byte
		var tok uint64
		var us int64
		var shared bool
		if err := rows.Scan(&owner, &tok, &us, &val, &shared); err != nil {
			return nil, b.ctxErr(ctx, err)
		}
		hs = append(hs, driver.Info{Key: key, Owner: string(owner), Token: tok, TTL: time.Duration(us) * time.Microsecond, Waiters: waiters, Value: val, Shared: shared})
	}
	if err := rows.Err(); err != nil {
		return nil, b.ctxErr(ctx, err)
	}
	return hs, nil
}
