package mysqllock

import (
	"context"
	"database/sql"
	sqldriver "database/sql/driver"
	"errors"
	"fmt"
	"io"
	"strconv"

	"github.com/dlockio/dlock/driver"
)

// quickAcquire is a reader's or a permit's short grant when no place is queued:
// readGrant (permitGrant) and putPermit in one transaction. ok is false when the
// statement does not apply (the full attempt decides).
func (b *Backend) quickAcquire(ctx context.Context, req driver.Request, limit int) (tok uint64, ok bool, err error) {
	if b.batch != nil && !b.batchOff.Load() {
		tok, ok, err := b.quickBatch(ctx, req, limit)
		if !errors.Is(err, errUnsafeCharset) {
			return tok, ok, err
		}
		// The server speaks a character set in which the driver's escaping
		// does not hold (checkedConnector): statements one by one from now on.
		b.batchOff.Store(true)
	}
	err = b.semTx(ctx, func(tx *sql.Tx) error {
		ok = false
		var res sql.Result
		var err error
		if req.Shared {
			res, err = b.txExec(ctx, tx, b.sq.readGrant, micros(req.TTL), req.Key, req.Key, req.Owner, req.Key)
		} else {
			res, err = b.txExec(ctx, tx, b.sq.permitGrant, micros(req.TTL), req.Key, strconv.Itoa(limit), req.Key, req.Owner, req.Key, limit, req.Key)
		}
		if err != nil {
			return err
		}
		if n, err := res.RowsAffected(); err != nil || n == 0 {
			return err
		}
		last, err := res.LastInsertId()
		if err != nil {
			return err
		}
		if _, err := b.txExec(ctx, tx, b.sq.putPermit, req.Key, req.Owner, last, value(req.Value), req.Shared); err != nil {
			return err
		}
		tok, ok = uint64(last), true
		return nil
	})
	return tok, ok, err
}

// quickBatch is quickAcquire in one request on the batch pool: the transaction's
// statements (START TRANSACTION, the grant statement, the permit's INSERT, a read
// of the outcome, COMMIT) run on the server one after the other, so the key's row
// stays locked for the time the server takes to run them, not for three round
// trips. A statement that fails stops the rest and may leave the transaction
// open: the connection is then dropped, which rolls it back.
func (b *Backend) quickBatch(ctx context.Context, req driver.Request, limit int) (tok uint64, ok bool, err error) {
	var args []any
	text := "START TRANSACTION; "
	if req.Shared {
		text += b.sq.readGrant
		args = []any{micros(req.TTL), req.Key, req.Key, req.Owner, req.Key}
	} else {
		text += b.sq.permitGrant
		args = []any{micros(req.TTL), req.Key, strconv.Itoa(limit), req.Key, req.Owner, req.Key, limit, req.Key}
	}
	text += b.sq.quickTail
	args = append(args, req.Key, req.Owner, value(req.Value), req.Shared)
	err = retryTx(ctx, func() error {
		return b.onConn(ctx, b.batch, func(c *sql.Conn) error {
			var n int64
			var last uint64
			rows, err := c.QueryContext(ctx, text, args...)
			if err == nil {
				for {
					for rows.Next() {
						err = driver.Join(err, rows.Scan(&n, &last))
					}
					if !rows.NextResultSet() {
						break
					}
				}
				err = driver.Join(err, rows.Err(), rows.Close())
			}
			if err != nil {
				dropConn(c)
				return err
			}
			tok, ok = last, n > 0
			return nil
		})
	})
	return tok, ok, err
}

// errUnsafeCharset is the error of a batch connection whose character set is not
// escapeSafe.
var errUnsafeCharset = errors.New("mysqllock: the connection's character set does not read escaped literals as written")

// checkedConnector makes the batch pool's connections: each new one is asked for
// the character set the server reads its statements in (character_set_client),
// which may not be the one the driver asked for (a server started with
// skip-character-set-client-handshake uses its own, init_connect may change it);
// a connection whose set is not escapeSafe is closed and errUnsafeCharset
// returned, since the driver writes parameters into the text escaped for an
// ASCII-safe set (a GBK value could end its literal).
type checkedConnector struct{ sqldriver.Connector }

func (c checkedConnector) Connect(ctx context.Context) (sqldriver.Conn, error) {
	conn, err := c.Connector.Connect(ctx)
	if err != nil {
		return nil, err
	}
	cs, err := charsetClient(ctx, conn)
	if err != nil {
		conn.Close()
		return nil, err
	}
	if !escapeSafe(cs) {
		conn.Close()
		return nil, fmt.Errorf("%w (%s)", errUnsafeCharset, cs)
	}
	return conn, nil
}

// charsetClient reads conn's character_set_client.
func charsetClient(ctx context.Context, conn sqldriver.Conn) (string, error) {
	q, ok := conn.(sqldriver.QueryerContext)
	if !ok {
		return "", errUnsafeCharset
	}
	rows, err := q.QueryContext(ctx, "SELECT @@character_set_client", nil)
	if err != nil {
		return "", err
	}
	defer rows.Close()
	dest := make([]sqldriver.Value, 1)
	if err := rows.Next(dest); err != nil {
		if err == io.EOF {
			err = errUnsafeCharset
		}
		return "", err
	}
	switch v := dest[0].(type) {
	case []byte:
		return string(v), nil
	case string:
		return v, nil
	}
	return "", errUnsafeCharset
}
