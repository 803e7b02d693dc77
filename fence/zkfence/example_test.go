package zkfence_test

import (
	"context"
	"time"

	"github.com/go-zookeeper/zk"

	"github.com/dlockio/dlock"
	"github.com/dlockio/dlock/fence/zkfence"
)

func Example() {
	ctx := context.Background()
	conn, _, _ := zk.Connect([]string{"127.0.0.1:2181"}, 10*time.Second)
	g, _ := zkfence.New(conn, "/app/fences", nil)
	c, _ := dlock.Open(ctx, "zk://127.0.0.1:2181/locks")
	_ = c.Do(ctx, "config", func(ctx context.Context, l *dlock.Lease) error {
		_, err := g.Write(ctx, "config", uint64(l.Token()),
			&zk.SetDataRequest{Path: "/app/config", Data: []byte("v2"), Version: -1})
		return err // a stale token: fence.ErrStale, and the multi did nothing
	})
}
