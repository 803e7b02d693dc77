package pglock

import (
	"context"
	"time"
	"unicode/utf8"

	"github.com/dlockio/dlock/driver"
)

// List implements driver.Lister: one statement (sql/list.sql) over the key rows of
// the lock table from prefix up to its successor (a range of the primary key, which
// is COLLATE "C", so byte order: the prefix matches literally, whatever characters
// it holds), with the permits of the semaphore and read-write keys among them,
// keeping the live holders as Holders does, expiry by the server's clock, and
// counting each key's live places as Inspect does.
func (b *Backend) List(ctx context.Context, prefix string) ([]driver.Info, error) {
	if b.closed.Load() {
		return nil, driver.ErrClosed
	}
	q := b.sql.list
	if b.semErr != nil {
		q = b.sql.listMutex
	}
	var end *string
	if s, ok := successor(prefix); ok {
		end = &s
	}
	rows, err := b.pool.Query(ctx, q, prefix, end)
	if err != nil {
		return nil, b.ctxErr(ctx, wrap("list", prefix, err))
	}
	defer rows.Close()
	var infos []driver.Info
	for rows.Next() {
		var key, owner string
		var token, left, waiters int64
		var value []byte
		var shared bool
		if err := rows.Scan(&key, &owner, &token, &left, &waiters, &value, &shared); err != nil {
			return nil, b.ctxErr(ctx, wrap("list", prefix, err))
		}
		infos = append(infos, driver.Info{Key: key, Owner: owner, Token: uint64(token), TTL: time.Duration(max(left, 0)) * time.Microsecond, Waiters: int(waiters), Value: value, Shared: shared})
	}
	if err := rows.Err(); err != nil {
		return nil, b.ctxErr(ctx, wrap("list", prefix, err))
	}
	return infos, nil
}

// successor returns the least string greater than every string that starts with
// prefix, in byte order (UTF-8's byte order is its code points' order): prefix
// with its last code point below utf8.MaxRune incremented (skipping the
// surrogates) and what follows it dropped. It reports false when there is none
// (prefix is empty or all utf8.MaxRune): every key from prefix on starts with it.
func successor(prefix string) (string, bool) {
	for i := len(prefix); i > 0; {
		r, n := utf8.DecodeLastRuneInString(prefix[:i])
		i -= n
		if r == utf8.MaxRune || r == utf8.RuneError && n == 1 {
			continue
		}
		r++
		if r >= 0xD800 && r <= 0xDFFF {
			r = 0xE000
		}
		return prefix[:i] + string(r), true
	}
	return "", false
}
