package pglock_test

import (
	"context"
	"log"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/dlockio/dlock"
	"github.com/dlockio/dlock/pglock"
)

// A lock in a PostgreSQL table, from a URL: pgx's own connection parameters
// (sslmode, ...) plus table=. The token comes from a sequence, so it survives a
// server restart; waiters are woken by NOTIFY.
func Example() {
	ctx := context.Background()
	c, err := dlock.Open(ctx, "postgres://app:secret@127.0.0.1:5432/app?sslmode=require&table=dlock_locks&ttl=10s")
	if err != nil {
		log.Fatal(err)
	}
	defer c.Close()
	err = c.Do(ctx, "monthly-invoices", func(ctx context.Context, l *dlock.Lease) error {
		log.Printf("token %d", l.Token())
		return nil
	})
	if err != nil {
		log.Fatal(err)
	}
}

// New puts the locks on a pgx pool the program already has; the pool stays the
// caller's to close.
func ExampleNew() {
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, "postgres://app:secret@127.0.0.1:5432/app")
	if err != nil {
		log.Fatal(err)
	}
	defer pool.Close()
	b, err := pglock.New(ctx, pool, pglock.WithTable("app.locks"))
	if err != nil {
		log.Fatal(err)
	}
	c, err := dlock.New(b)
	if err != nil {
		log.Fatal(err)
	}
	defer c.Close()
}
