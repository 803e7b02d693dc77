package etcdfence_test

import (
	"context"
	"testing"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/dlockio/dlock/fence/etcdfence"
	"github.com/dlockio/dlock/fence/internal/fencetest"
	"github.com/dlockio/dlock/internal/testserver"
)

// BenchmarkWrite compares a Put without a guard and in a fenced transaction (with
// and without the holder compare), on one embedded server in one run.
func BenchmarkWrite(b *testing.B) {
	cli := client(b, testserver.StartEtcd(b))
	const tk = 1 << 40
	ctx := context.Background()
	if _, err := cli.Put(ctx, "bench/member", "owner"); err != nil {
		b.Fatal(err)
	}
	m, err := cli.Get(ctx, "bench/member")
	if err != nil {
		b.Fatal(err)
	}
	rev := m.Kvs[0].CreateRevision
	b.Run("unguarded", func(b *testing.B) {
		fencetest.Measure(b, func(ctx context.Context) error { _, err := cli.Put(ctx, "bench/v", "value"); return err })
	})
	b.Run("guarded", func(b *testing.B) {
		fencetest.Measure(b, func(ctx context.Context) error {
			_, err := etcdfence.New(cli, "bench/fence", tk).Then(clientv3.OpPut("bench/v", "value")).Commit(ctx)
			return err
		})
	})
	b.Run("guarded+holder", func(b *testing.B) {
		fencetest.Measure(b, func(ctx context.Context) error {
			_, err := etcdfence.New(cli, "bench/fence", tk).Holder("bench/member", rev).Then(clientv3.OpPut("bench/v", "value")).Commit(ctx)
			return err
		})
	})
	b.Run("pair", func(b *testing.B) {
		fencetest.Pair(b, func(ctx context.Context) error { _, err := cli.Put(ctx, "bench/v", "value"); return err },
			func(ctx context.Context) error {
				_, err := etcdfence.New(cli, "bench/fence", tk).Then(clientv3.OpPut("bench/v", "value")).Commit(ctx)
				return err
			})
	})
}
