package mysqllock

import (
	"context"
	"database/sql"
	sqldriver "database/sql/driver"
	"errors"
	"fmt"
	"strings"

	"github.com/dlockio/dlock/driver"
)

// The backend's statements need sessions that commit each statement on its own
// (autocommit, which Open sets with the driver's parameters) and run REPEATABLE
// READ (see the package documentation, Safety model): under READ COMMITTED, InnoDB
// reads the subqueries of an UPDATE or INSERT ... SELECT without locks, so a grant
// may count a key's permits as they were before another grant committed, and a
// semaphore grants more permits than its limit.

// setRepeatableRead is the statement that gives a session the isolation the
// backend needs, in the syntax MySQL 8 and MariaDB share (their variables'
// names differ).
const setRepeatableRead = "SET SESSION TRANSACTION ISOLATION LEVEL REPEATABLE READ"

// repeatableRead makes the connections of a pool made by Open: each new one runs
// setRepeatableRead first, whatever the server's default
// (transaction_isolation, tx_isolation before MariaDB 11.1) or init_connect set.
type repeatableRead struct{ sqldriver.Connector }

func (c repeatableRead) Connect(ctx context.Context) (sqldriver.Conn, error) {
	conn, err := c.Connector.Connect(ctx)
	if err != nil {
		return nil, err
	}
	ex, ok := conn.(sqldriver.ExecerContext)
	if !ok {
		conn.Close()
		return nil, errors.New("mysqllock: the driver's connection cannot run statements")
	}
	if _, err := ex.ExecContext(ctx, setRepeatableRead, nil); err != nil {
		conn.Close()
		return nil, err
	}
	return conn, nil
}

// checkSession reads the settings of a session of pool (New's: Open's set theirs)
// and refuses autocommit off, READ COMMITTED and READ UNCOMMITTED with an error
// matching driver.ErrInvalid.
func checkSession(ctx context.Context, pool *sql.DB) error {
	var autocommit int
	if err := pool.QueryRowContext(ctx, "SELECT @@SESSION.autocommit").Scan(&autocommit); err != nil {
		return err
	}
	if autocommit != 1 {
		return fmt.Errorf("%w: the pool's sessions run with autocommit off, which would leave grants "+
			"uncommitted: set autocommit=1 on each connection, as Open does (mysql.Config.Params)", driver.ErrInvalid)
	}
	var level string
	err := pool.QueryRowContext(ctx, "SELECT @@SESSION.transaction_isolation").Scan(&level)
	if isErr(err, errUnknownVariable) {
		err = pool.QueryRowContext(ctx, "SELECT @@SESSION.tx_isolation").Scan(&level)
	}
	if err != nil {
		return err
	}
	switch strings.ToUpper(level) {
	case "REPEATABLE-READ", "SERIALIZABLE":
		return nil
	}
	return fmt.Errorf("%w: the pool's sessions run %s, and dlock needs REPEATABLE READ "+
		"(a semaphore would grant more permits than its limit): set it on each connection, as Open does "+
		"(mysql.Config.Params: transaction_isolation, tx_isolation before MariaDB 11.1, = 'REPEATABLE-READ')",
		driver.ErrInvalid, level)
}

// errUnknownVariable is ER_UNKNOWN_SYSTEM_VARIABLE.
const errUnknownVariable = 1193
