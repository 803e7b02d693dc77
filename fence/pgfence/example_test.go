package pgfence_test

import (
	"context"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/dlockio/dlock"
	"github.com/dlockio/dlock/fence/pgfence"
)

// A job under a lock writes its report in one transaction with the token check.
func Example() {
	ctx := context.Background()
	pool, _ := pgxpool.New(ctx, "postgres://app@db/app")
	c, _ := dlock.Open(ctx, "postgres://app@db/app")
	g, _ := pgfence.New()
	_ = g.Setup(ctx, pool) // once: creates dlock_fence and dlock_fence_check

	_ = c.Do(ctx, "nightly-report", func(ctx context.Context, l *dlock.Lease) error {
		return g.Do(ctx, pool, "nightly-report", uint64(l.Token()), func(tx pgx.Tx) error {
			_, err := tx.Exec(ctx, "INSERT INTO report (day, total) VALUES (current_date, $1)", 42)
			return err // a stale token: fence.ErrStale, and nothing committed
		})
	})
}

// One round trip: the check and the writes in one batch (an implicit transaction).
func ExampleGuard_SendBatch() {
	ctx := context.Background()
	pool, _ := pgxpool.New(ctx, "postgres://app@db/app")
	g, _ := pgfence.New()
	var token uint64 = 42 // lease.Token()

	b := &pgx.Batch{}
	b.Queue("UPDATE account SET balance = balance - $1 WHERE id = $2", 10, 7)
	b.Queue("INSERT INTO ledger (account, amount) VALUES ($1, $2)", 7, -10)
	_ = g.SendBatch(ctx, pool, "account/7", token, b)
}

// A table with its own fence column: the check is the UPDATE's WHERE clause.
func ExampleColumn() {
	ctx := context.Background()
	pool, _ := pgxpool.New(ctx, "postgres://app@db/app")
	// CREATE TABLE account (id int PRIMARY KEY, balance int, fence numeric(20,0) NOT NULL DEFAULT 0)
	accounts := pgfence.Column{Table: "account", Key: "id", Fence: "fence"}
	var token uint64 = 42 // lease.Token()
	_ = accounts.Update(ctx, pool, 7, token, "balance = balance - $1", 10)
}
