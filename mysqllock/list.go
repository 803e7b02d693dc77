package mysqllock

import (
	"context"
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
		if err := rows.Scan(&owner, &val, &us); err != nil {
			return nil, b.ctxErr(ctx, err)
		}
		places = append(places, driver.Info{Key: key, Owner: string(owner), TTL: time.Duration(us) * time.Microsecond, Waiters: -1, Value: val})
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
	return out, nil
}
