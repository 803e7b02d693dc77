package redisfence_test

import (
	"context"
	"testing"

	"github.com/dlockio/dlock/fence/internal/fencetest"
	"github.com/dlockio/dlock/fence/redisfence"
	"github.com/dlockio/dlock/internal/testserver"
)

// BenchmarkWrite compares a SET without a guard and through the guard's script, on
// one server in one run.
func BenchmarkWrite(b *testing.B) {
	rdb := client(b, testserver.StartRedis(b))
	const tk = 1 << 40
	b.Run("unguarded", func(b *testing.B) {
		fencetest.Measure(b, func(ctx context.Context) error { return rdb.Set(ctx, "bench", "value", 0).Err() })
	})
	b.Run("guarded", func(b *testing.B) {
		fencetest.Measure(b, func(ctx context.Context) error {
			_, err := redisfence.Exec(ctx, rdb, "bench:fence", tk, redisfence.Command("SET", redisfence.Key("bench"), "value"))
			return err
		})
	})
	b.Run("pair", func(b *testing.B) {
		fencetest.Pair(b, func(ctx context.Context) error { return rdb.Set(ctx, "bench", "value", 0).Err() },
			func(ctx context.Context) error {
				_, err := redisfence.Exec(ctx, rdb, "bench:fence", tk, redisfence.Command("SET", redisfence.Key("bench"), "value"))
				return err
			})
	})
}
