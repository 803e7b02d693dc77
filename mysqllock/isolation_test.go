package mysqllock_test

import (
	"context"
	"database/sql"
	"errors"
	"strings"
	"testing"

	"github.com/go-sql-driver/mysql"

	"github.com/dlockio/dlock/driver"
	"github.com/dlockio/dlock/drivertest"
	"github.com/dlockio/dlock/internal/testserver"
	"github.com/dlockio/dlock/mysqllock"
)

// TestReadCommittedServer: on a server whose default isolation level is READ
// COMMITTED, Open's sessions run REPEATABLE READ and pass the conformance suite
// (without it, SemaphoreExclusion saw 4 holders of a semaphore of 3, and 8 in
// TestQuickReviewLimit's workload); New refuses a pool left at READ COMMITTED and
// takes one that sets REPEATABLE READ.
func TestReadCommittedServer(t *testing.T) {
	srv := testserver.StartMariaDB(t, "--transaction-isolation=READ-COMMITTED")
	ctx := context.Background()
	var level string
	if err := admin(t, srv).QueryRow("SELECT @@SESSION.tx_isolation").Scan(&level); err != nil || level != "READ-COMMITTED" {
		t.Fatalf("the server's sessions run %q, %v; want READ-COMMITTED", level, err)
	}
	t.Run("Conformance", func(t *testing.T) { drivertest.Run(t, harness(t, srv)) })
	t.Run("Limit", func(t *testing.T) { testLimit(t, srv) })
	t.Run("NewRefuses", func(t *testing.T) {
		b, err := mysqllock.New(ctx, admin(t, srv))
		if !errors.Is(err, driver.ErrInvalid) || !strings.Contains(err.Error(), "READ-COMMITTED") {
			t.Fatalf("New on a READ COMMITTED pool: %v, want ErrInvalid naming the level", err)
		}
		if b != nil {
			b.Close()
		}
	})
	t.Run("NewWithRepeatableRead", func(t *testing.T) {
		cfg := mysql.NewConfig()
		cfg.User, cfg.Passwd, cfg.Net, cfg.Addr, cfg.DBName = srv.User, srv.Password, "tcp", srv.Addr(), srv.Database
		cfg.Params = map[string]string{"tx_isolation": "'REPEATABLE-READ'"}
		c, err := mysql.NewConnector(cfg)
		if err != nil {
			t.Fatal(err)
		}
		db := sql.OpenDB(c)
		defer db.Close()
		b, err := mysqllock.New(ctx, db)
		if err != nil {
			t.Fatalf("New on a REPEATABLE READ pool: %v", err)
		}
		b.Close()
	})
}
