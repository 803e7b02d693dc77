// Package mysqlops registers the storeops store of the mysql and mariadb schemes: a
// database/sql pool with go-sql-driver/mysql (mysqllock's driver), the floor (INSERT
// and DELETE of a row, each a statement prepared once: one round trip) and the
// statements the server counted (Questions).
package mysqlops

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"net"
	"net/url"
	"strings"
	"sync/atomic"

	"github.com/go-sql-driver/mysql"

	"github.com/dlockio/dlock/driver"
	"github.com/dlockio/dlock/internal/storeops"
)

func init() {
	for _, s := range []string{"mysql", "mariadb"} {
		storeops.Register(s, openMySQL)
	}
}

// floorTable holds the floor's rows. It has the shape of mysqllock's lock table (a
// VARBINARY primary key, the owner, a token and an expiry), so that a floor row costs
// what a lock row costs.
const floorTable = "dlock_floor"

// dlockParams are the URL parameters of dlock and mysqllock, not of the driver.
var dlockParams = []string{"table", "max_conns", "ttl", "renew", "drift", "owner", "linger", "strict"}

type store struct {
	db       *sql.DB
	ins, del *sql.Stmt    // the floor's statements, prepared once
	reads    atomic.Int64 // Ops reads so far, each a statement the server counted
}

// DSN turns a mysql:// dlock URL into a go-sql-driver/mysql DSN: its user, password,
// host (port 3306 by default) and database, and its query parameters but dlock's own
// (the driver reads tls, timeout and the others under their names), with autocommit
// on.
func DSN(u *url.URL) (string, error) {
	q := u.Query()
	for _, p := range dlockParams {
		q.Del(p)
	}
	host := u.Host
	if host == "" {
		return "", fmt.Errorf("%w: no host", driver.ErrInvalid)
	}
	if _, _, err := net.SplitHostPort(host); err != nil {
		host = net.JoinHostPort(host, "3306")
	}
	dsn := "tcp(" + host + ")/" + strings.TrimPrefix(u.Path, "/")
	if len(q) > 0 {
		dsn += "?" + q.Encode()
	}
	cfg, err := mysql.ParseDSN(dsn)
	if err != nil {
		return "", fmt.Errorf("%w: %v", driver.ErrInvalid, err)
	}
	if u.User != nil {
		cfg.User = u.User.Username()
		cfg.Passwd, _ = u.User.Password()
	}
	// The floor and the peers commit each statement on its own, as mysqllock's
	// do, whatever the server's default.
	if cfg.Params == nil {
		cfg.Params = map[string]string{}
	}
	cfg.Params["autocommit"] = "1"
	return cfg.FormatDSN(), nil
}

// openMySQL connects to the database of u and creates the floor table if it is
// missing (CREATE TABLE IF NOT EXISTS: safe when stores start at once).
func openMySQL(ctx context.Context, u *url.URL) (storeops.Store, error) {
	dsn, err := DSN(u)
	if err != nil {
		return nil, fmt.Errorf("storeops: %w", err)
	}
	db, err := sql.Open("mysql", dsn)
	if err != nil {
		return nil, fmt.Errorf("storeops: %w", err)
	}
	db.SetMaxIdleConns(8)
	_, err = db.ExecContext(ctx, "CREATE TABLE IF NOT EXISTS "+floorTable+" (lock_key VARBINARY(512) NOT NULL PRIMARY KEY, "+
		"owner VARBINARY(128) NOT NULL, token BIGINT UNSIGNED NOT NULL, expires_at DATETIME(6) NOT NULL) ENGINE=InnoDB")
	if err != nil {
		db.Close()
		return nil, fmt.Errorf("storeops: connect to %s: %w", driver.Redact(u), err)
	}
	// Prepared once, as mysqllock prepares its own: a statement with parameters
	// sent unprepared costs a prepare and an execute, two round trips.
	s := &store{db: db}
	if s.ins, err = db.PrepareContext(ctx, "INSERT INTO "+floorTable+" VALUES (?, ?, 0, UTC_TIMESTAMP(6) + INTERVAL 15 SECOND)"); err == nil {
		s.del, err = db.PrepareContext(ctx, "DELETE FROM "+floorTable+" WHERE lock_key = ? AND owner = ?")
	}
	if err != nil {
		s.Close()
		return nil, fmt.Errorf("storeops: prepare the floor: %w", err)
	}
	return s, nil
}

// FloorCycle implements Store with the least a lock on a table does: INSERT a row
// under the primary key, then DELETE it comparing the owner, each its own committed
// statement (autocommit).
func (s *store) FloorCycle(ctx context.Context, key string) error {
	owner := driver.RandomHex(8)
	res, err := s.ins.ExecContext(ctx, key, owner)
	if err != nil {
		return fmt.Errorf("storeops: floor insert: %w", err)
	}
	if n, _ := res.RowsAffected(); n != 1 {
		return errors.New("storeops: floor insert: no row inserted")
	}
	if _, err := s.del.ExecContext(ctx, key, owner); err != nil {
		return fmt.Errorf("storeops: floor delete: %w", err)
	}
	return nil
}

// Ops implements Store: the statements clients sent the server (the global
// Questions status variable), less this store's reads of it (each one counted).
func (s *store) Ops(ctx context.Context) (int64, error) {
	var name string
	var n int64
	reads := s.reads.Add(1)
	if err := s.db.QueryRowContext(ctx, "SHOW GLOBAL STATUS LIKE 'Questions'").Scan(&name, &n); err != nil {
		return 0, fmt.Errorf("storeops: mysql ops: %w", err)
	}
	return n - reads, nil
}

// OpsSource implements Store.
func (s *store) OpsSource() string { return "MySQL statements received (Questions)" }

// Close implements Store.
func (s *store) Close() error {
	for _, st := range []*sql.Stmt{s.ins, s.del} {
		if st != nil {
			st.Close()
		}
	}
	return s.db.Close()
}
