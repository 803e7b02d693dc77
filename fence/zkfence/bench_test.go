package zkfence_test

import (
	"context"
	"testing"

	"github.com/go-zookeeper/zk"

	"github.com/dlockio/dlock/fence/internal/fencetest"
	"github.com/dlockio/dlock/internal/testserver"
)

// BenchmarkWrite compares a SetData without a guard and in the guard's multi, on one
// server in one run.
func BenchmarkWrite(b *testing.B) {
	c := conn(b, testserver.StartZooKeeper(b))
	if _, err := c.Create("/bench", nil, 0, zk.WorldACL(zk.PermAll)); err != nil {
		b.Fatal(err)
	}
	g := guard(b, c, "/fences")
	const tk = 1 << 40
	b.Run("unguarded", func(b *testing.B) {
		fencetest.Measure(b, func(context.Context) error { _, err := c.Set("/bench", []byte("value"), -1); return err })
	})
	b.Run("guarded", func(b *testing.B) {
		fencetest.Measure(b, func(ctx context.Context) error {
			_, err := g.Write(ctx, "bench", tk, &zk.SetDataRequest{Path: "/bench", Data: []byte("value"), Version: -1})
			return err
		})
	})
	b.Run("pair", func(b *testing.B) {
		fencetest.Pair(b, func(context.Context) error { _, err := c.Set("/bench", []byte("value"), -1); return err },
			func(ctx context.Context) error {
				_, err := g.Write(ctx, "bench", tk, &zk.SetDataRequest{Path: "/bench", Data: []byte("value"), Version: -1})
				return err
			})
	})
}
