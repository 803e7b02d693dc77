package mysqllock

import (
	"context"
	"database/sql"
	sqldriver "database/sql/driver"
	"errors"
	"strconv"
	"sync"
	"time"

	"github.com/go-sql-driver/mysql"
)

// Transactions whose call is cut short end on the server at once (see "Cancelled
// calls" in the package documentation): the driver only closes the connection,
// which the server notices when the statement ends, so a statement waiting for a
// key's row lock would wait on, up to innodb_lock_wait_timeout, holding a server
// connection and its place in the row lock's queue while the client's next call
// opens another. A transaction holds a key's row for several round trips, so under
// many short calls such statements queue faster than the row lock serves them.

// killWithin bounds the KILL QUERY of a call cut short.
const killWithin = 5 * time.Second

// maxConnIDs bounds the connection ids remembered: beyond it (and beyond twice the
// pool's open connections) they are forgotten and learnt again.
const maxConnIDs = 256

// connIDs remembers the server's id of each of the pool's connections.
type connIDs struct {
	mu sync.Mutex
	m  map[any]uint64 // the driver's connection -> its CONNECTION_ID()
}

// connID returns the server's id of c's connection, asking the server once per
// connection.
func (b *Backend) connID(ctx context.Context, c *sql.Conn) (uint64, error) {
	var dc any
	if err := c.Raw(func(x any) error { dc = x; return nil }); err != nil {
		return 0, err
	}
	b.ids.mu.Lock()
	id, ok := b.ids.m[dc]
	b.ids.mu.Unlock()
	if ok {
		return id, nil
	}
	if err := c.QueryRowContext(ctx, "SELECT CONNECTION_ID()").Scan(&id); err != nil {
		return 0, err
	}
	open := b.db.Stats().OpenConnections
	b.ids.mu.Lock()
	defer b.ids.mu.Unlock()
	if b.ids.m == nil || len(b.ids.m) >= max(maxConnIDs, 2*open) {
		// Most are of connections closed since (a closed one is never
		// reused: the map keeps it).
		b.ids.m = make(map[any]uint64)
	}
	b.ids.m[dc] = id
	return id, nil
}

// tx runs fn in a transaction on a connection of the pool; if ctx is done before
// fn returns, the statement the connection is running on the server is ended
// (KILL QUERY), so that the transaction is gone from the server at once (the
// driver closes the connection; the server rolls the transaction back). That
// connection never goes back to the pool, so the KILL never meets another call's
// statement; it is dropped before the KILL is awaited, which frees its place in
// the pool for the KILL's own statement (calls cut short together while they
// hold every connection of the pool would otherwise each wait for a connection
// for their KILL, up to killWithin).
func (b *Backend) tx(ctx context.Context, fn func(tx *sql.Tx) error) error {
	return b.onConn(ctx, b.db, func(c *sql.Conn) error {
		tx, err := c.BeginTx(ctx, nil)
		if err != nil {
			return err
		}
		if err = fn(tx); err != nil {
			_ = tx.Rollback()
			return err
		}
		return tx.Commit()
	})
}

// onConn runs fn on a connection of pool db, which it ends on the server (KILL
// QUERY) and drops if ctx is done before fn returns (see tx).
func (b *Backend) onConn(ctx context.Context, db *sql.DB, fn func(c *sql.Conn) error) error {
	c, err := db.Conn(ctx)
	if err != nil {
		return err
	}
	defer c.Close()
	id, err := b.connID(ctx, c)
	if err != nil {
		return err
	}
	killed := make(chan struct{})
	stop := context.AfterFunc(ctx, func() {
		defer close(killed)
		kctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), killWithin)
		defer cancel()
		b.kill(kctx, db, id)
	})
	defer func() {
		if !stop() {
			dropConn(c)
			<-killed
		}
	}()
	return fn(c)
}

// kill ends the statement of connection id, of pool db, with KILL QUERY sent
// through db: the place in db that the connection leaves when it is dropped
// serves the KILL, so that it waits for no connection of another pool (the main
// pool's may all be busy while the batch pool's are cut short). If db cannot give
// a connection (a batch pool that the server gives unsafe connections, see
// checkedConnector), the KILL goes through the main pool.
func (b *Backend) kill(ctx context.Context, db *sql.DB, id uint64) {
	if db != b.db {
		_, err := db.ExecContext(ctx, "KILL QUERY "+strconv.FormatUint(id, 10))
		var me *mysql.MySQLError
		if err == nil || errors.As(err, &me) || ctx.Err() != nil {
			return
		}
	}
	b.wake(ctx, id)
}

// dropConn makes c's connection leave the pool when c is closed.
func dropConn(c *sql.Conn) { _ = c.Raw(func(any) error { return sqldriver.ErrBadConn }) }
