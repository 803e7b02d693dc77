// Package pgops registers the storeops store of the postgres and postgresql schemes:
// a pgx pool, the floor (INSERT and DELETE of a row) and the writing transactions
// the server counted (transaction ids).
package pgops

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"strconv"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/dlockio/dlock/driver"
	"github.com/dlockio/dlock/internal/storeops"
)

func init() {
	for _, s := range []string{"postgres", "postgresql"} {
		storeops.Register(s, openPostgres)
	}
}

// pgFloorTable holds the floor's rows. It has the shape of pglock's lock table (a
// text primary key, the owner, a token and an expiry), so that a floor row costs
// what a lock row costs.
const pgFloorTable = "dlock_floor"

// pgStore is a pgx pool on the database of a postgres:// URL.
type pgStore struct {
	pool *pgxpool.Pool
}

// openPostgres connects to the database of u with pgx, which reads the URL's
// connection parameters (sslmode and the others); dlock's own parameters (table,
// ttl, ...) are removed first. It creates the floor table if it is missing.
func openPostgres(ctx context.Context, u *url.URL) (storeops.Store, error) {
	c := *u
	q := c.Query()
	for _, p := range []string{"table", "ttl", "renew", "drift", "owner", "linger", "strict"} {
		q.Del(p)
	}
	c.RawQuery = q.Encode()
	pool, err := pgxpool.New(ctx, c.String())
	if err != nil {
		return nil, fmt.Errorf("storeops: %w", err)
	}
	_, err = pool.Exec(ctx, `CREATE TABLE IF NOT EXISTS `+pgFloorTable+` (key text PRIMARY KEY, owner text NOT NULL, token bigint NOT NULL, expires_at timestamptz NOT NULL)`)
	var pe *pgconn.PgError
	if errors.As(err, &pe) && pe.Code == "23505" { // two stores creating it at once
		err = nil
	}
	if err != nil {
		pool.Close()
		return nil, fmt.Errorf("storeops: connect to %s: %w", driver.Redact(u), err)
	}
	return &pgStore{pool: pool}, nil
}

// FloorCycle implements Store with the least a lock on a table does: INSERT a row
// under the primary key, then DELETE it comparing the owner, each its own committed
// statement.
func (s *pgStore) FloorCycle(ctx context.Context, key string) error {
	owner := driver.RandomHex(8)
	tag, err := s.pool.Exec(ctx, `INSERT INTO `+pgFloorTable+` (key, owner, token, expires_at) VALUES ($1::text, $2::text, 0, now() + interval '15 seconds')`, key, owner)
	if err != nil {
		return fmt.Errorf("storeops: floor insert: %w", err)
	}
	if tag.RowsAffected() != 1 {
		return errors.New("storeops: floor insert: no row inserted")
	}
	if _, err := s.pool.Exec(ctx, `DELETE FROM `+pgFloorTable+` WHERE key = $1::text AND owner = $2::text`, key, owner); err != nil {
		return fmt.Errorf("storeops: floor delete: %w", err)
	}
	return nil
}

// Ops implements Store: the transaction ids the server has assigned, that is, the
// transactions that wrote (each a WAL flush at commit with the default settings).
// Read-only statements, such as this one, are not counted.
func (s *pgStore) Ops(ctx context.Context) (int64, error) {
	var v string
	if err := s.pool.QueryRow(ctx, `SELECT pg_snapshot_xmax(pg_current_snapshot())::text`).Scan(&v); err != nil {
		return 0, fmt.Errorf("storeops: postgres ops: %w", err)
	}
	return strconv.ParseInt(v, 10, 64)
}

// OpsSource implements Store.
func (s *pgStore) OpsSource() string { return "PostgreSQL writing transactions (transaction ids)" }

// Close implements Store.
func (s *pgStore) Close() error {
	s.pool.Close()
	return nil
}
