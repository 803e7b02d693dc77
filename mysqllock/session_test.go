package mysqllock_test

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/dlockio/dlock/driver"
	"github.com/dlockio/dlock/drivertest"
	"github.com/dlockio/dlock/internal/testserver"
	"github.com/dlockio/dlock/mysqllock"
)

// TestHostileServerDefaults: on a server whose sessions default to READ COMMITTED
// and autocommit off, Open's sessions run REPEATABLE READ with autocommit on and
// pass the conformance suite and the limit workload. Without the isolation level,
// 16 clients of a semaphore of 3 held up to 7 permits at once; without autocommit,
// the suite's first test hung. New refuses a pool left with either setting and
// takes one that sets both.
func TestHostileServerDefaults(t *testing.T) {
	srv := testserver.StartMariaDB(t, "--transaction-isolation=READ-COMMITTED", "--autocommit=0")
	ctx := context.Background()
	var level string
	var autocommit int
	if err := admin(t, srv).QueryRow("SELECT @@GLOBAL.tx_isolation, @@GLOBAL.autocommit").Scan(&level, &autocommit); err != nil || level != "READ-COMMITTED" || autocommit != 0 {
		t.Fatalf("the server's defaults: %q, autocommit %d, %v; want READ-COMMITTED, 0", level, autocommit, err)
	}
	t.Run("Conformance", func(t *testing.T) { drivertest.Run(t, harness(t, srv)) })
	t.Run("Limit", func(t *testing.T) { testLimit(t, srv) })
	for _, tc := range []struct {
		name   string
		params map[string]string
		want   string // in the error; "" for none
	}{
		{"ReadCommitted", map[string]string{"autocommit": "1"}, "READ-COMMITTED"},
		{"AutocommitOff", map[string]string{"tx_isolation": "'REPEATABLE-READ'"}, "autocommit off"},
		{"Both", map[string]string{"autocommit": "1", "tx_isolation": "'REPEATABLE-READ'"}, ""},
	} {
		t.Run("New"+tc.name, func(t *testing.T) {
			b, err := mysqllock.New(ctx, adminWith(t, srv, tc.params))
			if b != nil {
				defer b.Close()
			}
			if tc.want == "" {
				if err != nil {
					t.Fatalf("New: %v", err)
				}
				return
			}
			if !errors.Is(err, driver.ErrInvalid) || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("New: %v, want ErrInvalid saying %q", err, tc.want)
			}
		})
	}
}
