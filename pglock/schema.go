package pglock

import (
	"context"
	"errors"
	"fmt"
	"hash/fnv"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/dlockio/dlock/driver"
)

// hasValueColumn is true when table $1 exists and has the value column, which
// versions before values did not create.
const hasValueColumn = `EXISTS (SELECT FROM pg_attribute WHERE attrelid = to_regclass($1) AND attname = 'value' AND NOT attisdropped)`

// ensureSchema checks the session's durability setting, creates the table and
// sequence when they are missing, adds the value column to a table made by an
// earlier version and creates the permit table (semaphores) when it is missing
// and the role may. It returns the table's oid.
func (b *Backend) ensureSchema(ctx context.Context) (uint32, error) {
	t, seq, permits := b.table.Sanitize(), b.seq.Sanitize(), b.permits.Sanitize()
	var syncCommit, isolation string
	var haveTable, haveSeq, haveValue, havePermits bool
	err := b.pool.QueryRow(ctx, `SELECT current_setting('synchronous_commit'), current_setting('transaction_isolation'), to_regclass($1) IS NOT NULL, to_regclass($2) IS NOT NULL, `+hasValueColumn+`, to_regclass($3) IS NOT NULL`,
		t, seq, permits).Scan(&syncCommit, &isolation, &haveTable, &haveSeq, &haveValue, &havePermits)
	if err != nil {
		return 0, b.ctxErr(ctx, fmt.Errorf("connect: %w", err))
	}
	if !durableCommit(syncCommit) {
		return 0, fmt.Errorf("the session's synchronous_commit is %q: a crash could lose grants and reissue fencing tokens; add synchronous_commit=on to the URL or fix the role's or server's setting", syncCommit)
	}
	if isolation != "read committed" {
		return 0, fmt.Errorf("%w: the session's transaction isolation is %q: dlock's statements need read committed (under repeatable read or serializable they fail with serialization errors); set default_transaction_isolation to read committed on the pool's connections, as Open does", driver.ErrInvalid, isolation)
	}
	if !haveTable || !haveSeq || !haveValue {
		if err := b.createSchema(ctx); err != nil {
			return 0, err
		}
	}
	if !havePermits {
		if err := b.createPermits(ctx); err != nil {
			return 0, err
		}
	}
	oid, err := b.checkTable(ctx)
	if err != nil {
		return 0, err
	}
	b.semErr = b.checkPermits(ctx)
	if b.semErr == nil {
		b.semErr = b.ensureShared(ctx)
	}
	return oid, nil
}

// hasSharedColumn is true when the permit table $1 has the shared column, which
// versions before read-write locks did not create.
const hasSharedColumn = `EXISTS (SELECT FROM pg_attribute WHERE attrelid = to_regclass($1) AND attname = 'shared' AND NOT attisdropped)`

// ensureShared adds the shared column (read-write locks) to a permit table made
// by an earlier version, under the schema's advisory lock. A constant default
// changes only the catalog, and clients of the older version go on working (they
// never name it). It returns why semaphores and read-write locks cannot work when
// the column is missing and this role may not add it, or nil.
func (b *Backend) ensureShared(ctx context.Context) error {
	permits := b.permits.Sanitize()
	var have bool
	if err := b.pool.QueryRow(ctx, `SELECT `+hasSharedColumn, permits).Scan(&have); err != nil {
		return b.ctxErr(ctx, fmt.Errorf("permit table %s: %w", permits, err))
	}
	if have {
		return nil
	}
	err := pgx.BeginFunc(ctx, b.pool, func(tx pgx.Tx) error {
		if err := b.schemaLock(ctx, tx); err != nil {
			return err
		}
		_, err := tx.Exec(ctx, `ALTER TABLE `+permits+` ADD COLUMN IF NOT EXISTS shared boolean NOT NULL DEFAULT false`)
		return err
	})
	if err != nil {
		return b.ctxErr(ctx, fmt.Errorf("permit table %s was made by an earlier version of dlock and lacks the column shared, which this role could not add (have its owner run ALTER TABLE %s ADD COLUMN IF NOT EXISTS shared boolean NOT NULL DEFAULT false): %w", permits, permits, err))
	}
	return nil
}

// schemaLock takes the transaction-level advisory lock under which clients create
// the table's relations.
func (b *Backend) schemaLock(ctx context.Context, tx pgx.Tx) error {
	h := fnv.New64a()
	h.Write([]byte("dlock schema " + b.table.Sanitize()))
	_, err := tx.Exec(ctx, `SELECT pg_advisory_xact_lock($1)`, int64(h.Sum64()))
	return err
}

// createPermits creates the permit table of the semaphores, in a transaction of its
// own under the schema's advisory lock. A role that may not create it still gets a
// working backend for mutexes (checkPermits then tells why semaphores fail).
func (b *Backend) createPermits(ctx context.Context) error {
	t, permits := b.table.Sanitize(), b.permits.Sanitize()
	err := pgx.BeginFunc(ctx, b.pool, func(tx pgx.Tx) error {
		if err := b.schemaLock(ctx, tx); err != nil {
			return err
		}
		_, err := tx.Exec(ctx, `CREATE TABLE IF NOT EXISTS `+permits+` (
	key        text COLLATE "C" NOT NULL,
	owner      text NOT NULL,
	token      bigint NOT NULL,
	expires_at timestamptz NOT NULL,
	reserved   boolean NOT NULL DEFAULT false,
	channel    text NOT NULL DEFAULT '',
	value      bytea,
	shared     boolean NOT NULL DEFAULT false,
	PRIMARY KEY (key, owner)
)`)
		return err
	})
	var pe *pgconn.PgError
	if err != nil && !(errors.As(err, &pe) && pe.Code == "42501") {
		return b.ctxErr(ctx, fmt.Errorf("create the permit table %s of %s: %w", permits, t, err))
	}
	return nil
}

// checkPermits reports why semaphores cannot work on this table set (the permit
// table is missing, or the role lacks a privilege on it), or nil.
func (b *Backend) checkPermits(ctx context.Context) error {
	permits := b.permits.Sanitize()
	var ok bool
	err := b.pool.QueryRow(ctx, `SELECT to_regclass($1) IS NOT NULL AND has_table_privilege($1, 'SELECT') AND has_table_privilege($1, 'INSERT')
		AND has_table_privilege($1, 'UPDATE') AND has_table_privilege($1, 'DELETE')`, permits).Scan(&ok)
	if err != nil {
		return b.ctxErr(ctx, fmt.Errorf("permit table %s: %w", permits, err))
	}
	if !ok {
		return fmt.Errorf("semaphores need the permit table %s with SELECT, INSERT, UPDATE and DELETE, which this role could not create or lacks (see the pglock documentation)", permits)
	}
	return nil
}

// createSchema creates the table and sequence, or adds the value column, in one
// transaction under the schema's advisory lock.
func (b *Backend) createSchema(ctx context.Context) error {
	t, seq := b.table.Sanitize(), b.seq.Sanitize()
	err := pgx.BeginFunc(ctx, b.pool, func(tx pgx.Tx) error {
		if err := b.schemaLock(ctx, tx); err != nil {
			return err
		}
		// Re-check under the lock: another client may have just created them.
		var haveTable, haveSeq, haveValue bool
		start := int64(1)
		if err := tx.QueryRow(ctx, `SELECT to_regclass($1) IS NOT NULL, to_regclass($2) IS NOT NULL, (extract(epoch FROM clock_timestamp()) * 1000000)::bigint, `+hasValueColumn,
			t, seq).Scan(&haveTable, &haveSeq, &start, &haveValue); err != nil {
			return err
		}
		if haveTable {
			if err := checkColumns(ctx, tx, t, false); err != nil {
				return err
			}
		}
		if !haveSeq {
			if haveTable {
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
		}
		if !haveTable {
			if _, err := tx.Exec(ctx, `CREATE TABLE IF NOT EXISTS `+t+` (
	key        text COLLATE "C" PRIMARY KEY,
	owner      text NOT NULL,
	token      bigint NOT NULL,
	expires_at timestamptz NOT NULL,
	reserved   boolean NOT NULL DEFAULT false,
	queue_owner   text[] NOT NULL DEFAULT '{}',
	queue_channel text[] NOT NULL DEFAULT '{}',
	queue_expires timestamptz[] NOT NULL DEFAULT '{}',
	value      bytea
)`); err != nil {
				return fmt.Errorf("create table %s: %w", t, err)
			}
		}
		if haveTable && !haveValue {
			// A table of a version before values. Adding a nullable column without
			// a default changes only the catalog; clients of the older version go
			// on working (they never name it), though they neither store values
			// nor notify watches.
			if _, err := tx.Exec(ctx, `ALTER TABLE `+t+` ADD COLUMN IF NOT EXISTS value bytea`); err != nil {
				return fmt.Errorf("%w: add column value: %w", errAlter, err)
			}
		}
		return nil
	})
	if err != nil {
		var pe *pgconn.PgError
		switch {
		case errors.Is(err, errAlter) && errors.As(err, &pe) && pe.Code == "42501":
			return fmt.Errorf("table %s was made by an earlier version of dlock and lacks the column value, which only its owner can add (nothing was changed; have the owner run ALTER TABLE %s ADD COLUMN IF NOT EXISTS value bytea): %w", t, t, pe)
		case errors.As(err, &pe) && pe.Code == "42501":
			return fmt.Errorf("create the lock table (nothing was created; grant CREATE on the schema, or have an administrator create the table and sequence shown in the pglock documentation): %w", err)
		case errors.Is(err, errNotLockTable):
			return b.ctxErr(ctx, err)
		}
		return b.ctxErr(ctx, fmt.Errorf("create the lock table: %w", err))
	}
	return nil
}

// errAlter marks a failure to add the value column to an existing table.
var errAlter = errors.New("alter the lock table")

// checkTable makes sure an existing table has the columns pglock uses, and returns
// its oid.
func (b *Backend) checkTable(ctx context.Context) (uint32, error) {
	t := b.table.Sanitize()
	if err := checkColumns(ctx, b.pool, t, true); err != nil {
		return 0, b.ctxErr(ctx, err)
	}
	var oid uint32
	var cache *int64
	seq := b.seq.Sanitize()
	err := b.pool.QueryRow(ctx, `SELECT to_regclass($1)::oid, (SELECT seqcache FROM pg_sequence WHERE seqrelid = to_regclass($2))`, t, seq).Scan(&oid, &cache)
	if err != nil {
		return 0, b.ctxErr(ctx, fmt.Errorf("table %s: %w", t, err))
	}
	if cache != nil && *cache != 1 {
		// Each session would draw from a block of its own: a later grant could
		// get a lower token.
		return 0, fmt.Errorf("%w: sequence %s has CACHE %d: fencing tokens drawn by different sessions would not rise in the order of the grants; run ALTER SEQUENCE %s CACHE 1", driver.ErrInvalid, seq, *cache, seq)
	}
	return oid, nil
}

var errNotLockTable = errors.New("not usable as a dlock table")

type querier interface {
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
}

// checkColumns checks that table has the columns pglock uses (withValue: also the
// value column, which ensureSchema adds to a table of an earlier version).
func checkColumns(ctx context.Context, q querier, table string, withValue bool) error {
	cols := "key, owner, token, expires_at, reserved, queue_owner, queue_channel, queue_expires"
	if withValue {
		cols += ", value"
	}
	rows, err := q.Query(ctx, `SELECT `+cols+` FROM `+table+` WHERE false`)
	if err == nil {
		rows.Close()
		err = rows.Err()
	}
	if err != nil {
		return fmt.Errorf("table %s is %w: %w", table, errNotLockTable, err)
	}
	return nil
}
