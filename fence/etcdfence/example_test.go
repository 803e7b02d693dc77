package etcdfence_test

import (
	"context"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/dlockio/dlock"
	"github.com/dlockio/dlock/etcdlock"
	"github.com/dlockio/dlock/fence/etcdfence"
)

func Example() {
	ctx := context.Background()
	cli, _ := clientv3.New(clientv3.Config{Endpoints: []string{"127.0.0.1:2379"}})
	b, _ := etcdlock.New(ctx, cli)
	c, _ := dlock.New(b)
	_ = c.Do(ctx, "config", func(ctx context.Context, l *dlock.Lease) error {
		token := uint64(l.Token())
		// Optional, once per lease: the lock's member key, so that the write also
		// fails as soon as the lease is lost, before any newer holder writes.
		member, err := etcdfence.Member(ctx, cli, b.LockPrefix(l.Key()), token)
		if err != nil {
			return err
		}
		_, err = etcdfence.New(cli, "app/config/fence", token).
			Holder(member, int64(token)).
			Then(clientv3.OpPut("app/config", "v2")).
			Commit(ctx)
		return err // fence.ErrStale, dlock.ErrNotHeld, or nil
	})
}
