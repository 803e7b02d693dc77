package pgfence_test

import (
	"context"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/dlockio/dlock/fence/internal/fencetest"
	"github.com/dlockio/dlock/fence/pgfence"
	"github.com/dlockio/dlock/internal/testserver"
)

// BenchmarkWrite compares one row update without a guard and with each form of the
// guard, on one server in one run. The token stays the same: one holder writing
// again, the common case.
func BenchmarkWrite(b *testing.B) {
	srv := testserver.StartPostgres(b)
	db := pool(b, srv)
	g := guard(b, db)
	exec(b, db, `CREATE TABLE bench (id int PRIMARY KEY, v bigint NOT NULL, fence numeric(20,0) NOT NULL DEFAULT 0)`)
	exec(b, db, `INSERT INTO bench (id, v) VALUES (1, 0)`)
	const update = "UPDATE bench SET v = v + 1 WHERE id = 1"
	const tk = 1 << 40
	col := pgfence.Column{Table: "bench", Key: "id", Fence: "fence"}
	b.Run("statement/unguarded", func(b *testing.B) {
		fencetest.Measure(b, func(ctx context.Context) error { _, err := db.Exec(ctx, update); return err })
	})
	b.Run("statement/batch", func(b *testing.B) {
		fencetest.Measure(b, func(ctx context.Context) error {
			batch := &pgx.Batch{}
			batch.Queue(update)
			return g.SendBatch(ctx, db, "bench", tk, batch)
		})
	})
	b.Run("statement/column", func(b *testing.B) {
		fencetest.Measure(b, func(ctx context.Context) error { return col.Update(ctx, db, 1, tk, "v = v + 1") })
	})
	b.Run("tx/unguarded", func(b *testing.B) {
		fencetest.Measure(b, func(ctx context.Context) error {
			return pgx.BeginFunc(ctx, db, func(tx pgx.Tx) error { _, err := tx.Exec(ctx, update); return err })
		})
	})
	b.Run("tx/check", func(b *testing.B) {
		fencetest.Measure(b, func(ctx context.Context) error {
			return g.Do(ctx, db, "bench", tk, func(tx pgx.Tx) error { _, err := tx.Exec(ctx, update); return err })
		})
	})
	unguarded := func(ctx context.Context) error { _, err := db.Exec(ctx, update); return err }
	b.Run("pair/batch", func(b *testing.B) {
		fencetest.Pair(b, unguarded, func(ctx context.Context) error {
			batch := &pgx.Batch{}
			batch.Queue(update)
			return g.SendBatch(ctx, db, "bench", tk, batch)
		})
	})
	b.Run("pair/column", func(b *testing.B) {
		fencetest.Pair(b, unguarded, func(ctx context.Context) error { return col.Update(ctx, db, 1, tk, "v = v + 1") })
	})
	b.Run("pair/tx", func(b *testing.B) {
		fencetest.Pair(b, func(ctx context.Context) error {
			return pgx.BeginFunc(ctx, db, func(tx pgx.Tx) error { _, err := tx.Exec(ctx, update); return err })
		}, func(ctx context.Context) error {
			return g.Do(ctx, db, "bench", tk, func(tx pgx.Tx) error { _, err := tx.Exec(ctx, update); return err })
		})
	})
}
