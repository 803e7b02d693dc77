package pglock

import (
	"context"
	"errors"
	"fmt"
	"hash/fnv"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// ensureSchema checks the session's durability setting and creates the table and
// sequence when they are missing.
func (b *Backend) ensureSchema(ctx context.Context) error {
	t, seq := b.table.Sanitize(), b.seq.Sanitize()
	var syncCommit string
	var haveTable, haveSeq bool
	err := b.pool.QueryRow(ctx, `SELECT current_setting('synchronous_commit'), to_regclass($1) IS NOT NULL, to_regclass($2) IS NOT NULL`,
		t, seq).Scan(&syncCommit, &haveTable, &haveSeq)
	if err != nil {
		return b.ctxErr(ctx, fmt.Errorf("connect: %w", err))
	}
	if !durableCommit(syncCommit) {
		return fmt.Errorf("the session's synchronous_commit is %q: a crash could lose grants and reissue fencing tokens; add synchronous_commit=on to the URL or fix the role's or server's setting", syncCommit)
	}
	if haveTable && haveSeq {
		return b.checkTable(ctx)
	}
	err = pgx.BeginFunc(ctx, b.pool, func(tx pgx.Tx) error {
		h := fnv.New64a()
		h.Write([]byte("dlock schema " + t))
		if _, err := tx.Exec(ctx, `SELECT pg_advisory_xact_lock($1)`, int64(h.Sum64())); err != nil {
			return err
		}
		// Re-check under the lock: another client may have just created them.
		var haveTable bool
		start := int64(1)
		if err := tx.QueryRow(ctx, `SELECT to_regclass($1) IS NOT NULL, (extract(epoch FROM clock_timestamp()) * 1000000)::bigint`, t).Scan(&haveTable, &start); err != nil {
			return err
		}
		if haveTable {
			if err := checkColumns(ctx, tx, t); err != nil {
				return err
			}
			var maxTok *int64
			if err := tx.QueryRow(ctx, `SELECT max(token) FROM `+t).Scan(&maxTok); err != nil {
				return err
			}
			if maxTok != nil && *maxTok >= start {
				start = *maxTok + 1
			}
		}
		if _, err := tx.Exec(ctx, fmt.Sprintf(`CREATE SEQUENCE IF NOT EXISTS %s AS bigint START WITH %d`, seq, start)); err != nil {
			return fmt.Errorf("create sequence %s: %w", seq, err)
		}
		if _, err := tx.Exec(ctx, `CREATE TABLE IF NOT EXISTS `+t+` (
	key        text COLLATE "C" PRIMARY KEY,
	owner      text NOT NULL,
	token      bigint NOT NULL,
	expires_at timestamptz NOT NULL,
	reserved   boolean NOT NULL DEFAULT false,
	queue_owner   text[] NOT NULL DEFAULT '{}',
	queue_channel text[] NOT NULL DEFAULT '{}',
	queue_expires timestamptz[] NOT NULL DEFAULT '{}'
)`); err != nil {
			return fmt.Errorf("create table %s: %w", t, err)
		}
		return nil
	})
	if err != nil {
		var pe *pgconn.PgError
		if errors.As(err, &pe) && pe.Code == "42501" {
			return fmt.Errorf("create the lock table (nothing was created; grant CREATE on the schema, or have an administrator create the table and sequence shown in the pglock documentation): %w", err)
		}
		if errors.Is(err, errNotLockTable) {
			return b.ctxErr(ctx, err)
		}
		return b.ctxErr(ctx, fmt.Errorf("create the lock table: %w", err))
	}
	return b.checkTable(ctx)
}

// checkTable makes sure an existing table has the columns pglock uses.
func (b *Backend) checkTable(ctx context.Context) error {
	return b.ctxErr(ctx, checkColumns(ctx, b.pool, b.table.Sanitize()))
}

var errNotLockTable = errors.New("not usable as a dlock table")

type querier interface {
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
}

func checkColumns(ctx context.Context, q querier, table string) error {
	rows, err := q.Query(ctx, `SELECT key, owner, token, expires_at, reserved, queue_owner, queue_channel, queue_expires FROM `+table+` WHERE false`)
	if err == nil {
		rows.Close()
		err = rows.Err()
	}
	if err != nil {
		return fmt.Errorf("table %s is %w: %w", table, errNotLockTable, err)
	}
	return nil
}
