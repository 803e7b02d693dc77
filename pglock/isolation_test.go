package pglock_test

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/dlockio/dlock/driver"
	"github.com/dlockio/dlock/drivertest"
	"github.com/dlockio/dlock/internal/testserver"
	"github.com/dlockio/dlock/pglock"
)

// TestSerializableServer: on a server whose default isolation is serializable,
// Open's sessions run read committed and pass the conformance suite (without it,
// nine of its tests failed with serialization errors, SQLSTATE 40001); New
// refuses a pool left at serializable and takes one set to read committed.
func TestSerializableServer(t *testing.T) {
	srv := testserver.StartPostgres(t, "-c", "default_transaction_isolation=serializable")
	ctx := context.Background()
	var level string
	if err := admin(t, srv).QueryRow(ctx, "SHOW transaction_isolation").Scan(&level); err != nil || level != "serializable" {
		t.Fatalf("the server's sessions run %q, %v; want serializable", level, err)
	}
	t.Run("Conformance", func(t *testing.T) { drivertest.Run(t, harness(t, srv)) })
	t.Run("NewRefuses", func(t *testing.T) {
		b, err := pglock.New(ctx, admin(t, srv))
		if !errors.Is(err, driver.ErrInvalid) || !strings.Contains(err.Error(), "serializable") {
			t.Fatalf("New on a serializable pool: %v, want ErrInvalid naming the level", err)
		}
		if b != nil {
			b.Close()
		}
	})
	t.Run("NewReadCommitted", func(t *testing.T) {
		cfg, err := pgxpool.ParseConfig(srv.URL())
		if err != nil {
			t.Fatal(err)
		}
		cfg.ConnConfig.RuntimeParams["default_transaction_isolation"] = "read committed"
		pool, err := pgxpool.NewWithConfig(ctx, cfg)
		if err != nil {
			t.Fatal(err)
		}
		defer pool.Close()
		b, err := pglock.New(ctx, pool)
		if err != nil {
			t.Fatalf("New on a read committed pool: %v", err)
		}
		b.Close()
	})
}
