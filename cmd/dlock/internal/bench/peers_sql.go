package bench

// The peers on SQL stores: PostgreSQL (pg_advisory_lock, a polled row) and MySQL
// (GET_LOCK, a polled row).

import (
	"context"
	"crypto/sha256"
	"database/sql"
	"encoding/hex"
	"errors"
	"net/url"
	"time"

	"github.com/go-sql-driver/mysql"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/dlockio/dlock/driver"
	"github.com/dlockio/dlock/internal/storeops/mysqlops"
)

// pgConnect connects with pgx to the database of a postgres:// dlock URL, without
// dlock's own parameters.
func pgConnect(ctx context.Context, u *url.URL) (*pgx.Conn, error) {
	c := *u
	q := c.Query()
	for _, p := range []string{"table", "ttl", "renew", "drift", "owner", "linger", "strict"} {
		q.Del(p)
	}
	c.RawQuery = q.Encode()
	return pgx.Connect(ctx, c.String())
}

func openPgAdvisory(ctx context.Context, u *url.URL) (peerConn, error) {
	conn, err := pgConnect(ctx, u)
	if err != nil {
		return peerConn{}, err
	}
	return peerConn{
		acquire: func(ctx context.Context, key string) (func(context.Context) error, error) {
			if _, err := conn.Exec(ctx, `SELECT pg_advisory_lock(hashtextextended($1, 0))`, key); err != nil {
				return nil, err
			}
			return func(ctx context.Context) error {
				var ok bool
				if err := conn.QueryRow(ctx, `SELECT pg_advisory_unlock(hashtextextended($1, 0))`, key).Scan(&ok); err != nil {
					return err
				}
				if !ok {
					return driver.ErrNotHeld
				}
				return nil
			}, nil
		},
		close: func() error { return conn.Close(context.Background()) },
	}, nil
}

func openPgRow(ctx context.Context, u *url.URL) (peerConn, error) {
	conn, err := pgConnect(ctx, u)
	if err != nil {
		return peerConn{}, err
	}
	_, err = conn.Exec(ctx, `CREATE TABLE IF NOT EXISTS `+peerRowTable+` (key text PRIMARY KEY)`)
	var pe *pgconn.PgError
	if errors.As(err, &pe) && pe.Code == "23505" { // created at the same moment elsewhere
		err = nil
	}
	if err != nil {
		conn.Close(ctx)
		return peerConn{}, err
	}
	return peerConn{
		acquire: func(ctx context.Context, key string) (func(context.Context) error, error) {
			for {
				tag, err := conn.Exec(ctx, `INSERT INTO `+peerRowTable+` (key) VALUES ($1) ON CONFLICT DO NOTHING`, key)
				if err != nil {
					return nil, err
				}
				if tag.RowsAffected() == 1 {
					break
				}
				if err := pollPause(ctx); err != nil {
					return nil, err
				}
			}
			return func(ctx context.Context) error {
				tag, err := conn.Exec(ctx, `DELETE FROM `+peerRowTable+` WHERE key = $1`, key)
				if err == nil && tag.RowsAffected() != 1 {
					err = driver.ErrNotHeld
				}
				return err
			}, nil
		},
		close: func() error { return conn.Close(context.Background()) },
	}, nil
}

// mysqlConn opens one connection, with go-sql-driver/mysql, to the database of a
// mysql:// dlock URL, without dlock's own parameters.
func mysqlConn(ctx context.Context, u *url.URL) (*sql.DB, *sql.Conn, error) {
	dsn, err := mysqlops.DSN(u)
	if err != nil {
		return nil, nil, err
	}
	db, err := sql.Open("mysql", dsn)
	if err != nil {
		return nil, nil, err
	}
	db.SetMaxOpenConns(1)
	c, err := db.Conn(ctx)
	if err != nil {
		db.Close()
		return nil, nil, err
	}
	return db, c, nil
}

func closeMySQL(db *sql.DB, c *sql.Conn) func() error {
	return func() error {
		_ = c.Close()
		return db.Close()
	}
}

// mysqlLockName is a GET_LOCK name for key: MySQL takes at most 64 characters.
func mysqlLockName(key string) string {
	h := sha256.Sum256([]byte(key))
	return "dlock-bench-" + hex.EncodeToString(h[:16])
}

func openMySQLGetLock(ctx context.Context, u *url.URL) (peerConn, error) {
	db, conn, err := mysqlConn(ctx, u)
	if err != nil {
		return peerConn{}, err
	}
	get, rel, err := prepare2(ctx, conn, `SELECT GET_LOCK(?, 3600)`, `SELECT RELEASE_LOCK(?)`)
	if err != nil {
		_ = closeMySQL(db, conn)()
		return peerConn{}, err
	}
	return peerConn{
		acquire: func(ctx context.Context, key string) (func(context.Context) error, error) {
			name := mysqlLockName(key)
			for {
				// GET_LOCK waits in the server, 1 if granted, 0 on its timeout
				// (an hour; asked again then).
				var got sql.NullInt64
				if err := get.QueryRowContext(ctx, name).Scan(&got); err != nil {
					return nil, err
				}
				if got.Valid && got.Int64 == 1 {
					break
				}
			}
			return func(ctx context.Context) error {
				var ok sql.NullInt64
				if err := rel.QueryRowContext(ctx, name).Scan(&ok); err != nil {
					return err
				}
				if !ok.Valid || ok.Int64 != 1 {
					return driver.ErrNotHeld
				}
				return nil
			}, nil
		},
		close: closeMySQL(db, conn),
	}, nil
}

// prepare2 prepares two statements on conn, as a user who cares about round trips
// would (a statement with parameters sent unprepared costs two); they are closed
// with the connection.
func prepare2(ctx context.Context, conn *sql.Conn, q1, q2 string) (*sql.Stmt, *sql.Stmt, error) {
	s1, err := conn.PrepareContext(ctx, q1)
	if err != nil {
		return nil, nil, err
	}
	s2, err := conn.PrepareContext(ctx, q2)
	if err != nil {
		s1.Close()
		return nil, nil, err
	}
	return s1, s2, nil
}

func openMySQLRow(ctx context.Context, u *url.URL) (peerConn, error) {
	db, conn, err := mysqlConn(ctx, u)
	if err != nil {
		return peerConn{}, err
	}
	// CREATE TABLE IF NOT EXISTS is safe when peers start at once.
	if _, err := conn.ExecContext(ctx, `CREATE TABLE IF NOT EXISTS `+peerRowTable+` (lock_key VARBINARY(512) NOT NULL PRIMARY KEY) ENGINE=InnoDB`); err != nil {
		_ = closeMySQL(db, conn)()
		return peerConn{}, err
	}
	ins, del, err := prepare2(ctx, conn, `INSERT IGNORE INTO `+peerRowTable+` (lock_key) VALUES (?)`, `DELETE FROM `+peerRowTable+` WHERE lock_key = ?`)
	if err != nil {
		_ = closeMySQL(db, conn)()
		return peerConn{}, err
	}
	return peerConn{
		acquire: func(ctx context.Context, key string) (func(context.Context) error, error) {
			for {
				res, err := ins.ExecContext(ctx, key)
				var me *mysql.MySQLError
				if errors.As(err, &me) && me.Number == 1213 { // deadlock victim: try again
					err = nil
				} else if err == nil {
					if n, _ := res.RowsAffected(); n == 1 {
						break
					}
				}
				if err != nil {
					return nil, err
				}
				if err := pollPause(ctx); err != nil {
					return nil, err
				}
			}
			return func(ctx context.Context) error {
				res, err := del.ExecContext(ctx, key)
				if err == nil {
					if n, _ := res.RowsAffected(); n != 1 {
						err = driver.ErrNotHeld
					}
				}
				return err
			}, nil
		},
		close: closeMySQL(db, conn),
	}, nil
}

// pollPause waits peerRowPoll, the row-polling peers' interval, or until ctx ends.
func pollPause(ctx context.Context) error {
	t := time.NewTimer(peerRowPoll)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}
