package redisfence_test

import (
	"context"

	"github.com/redis/go-redis/v9"

	"github.com/dlockio/dlock"
	"github.com/dlockio/dlock/fence/redisfence"
)

func Example() {
	ctx := context.Background()
	rdb := redis.NewClient(&redis.Options{Addr: "127.0.0.1:6379"})
	c, _ := dlock.Open(ctx, "redis://127.0.0.1:6379/0")
	_ = c.Do(ctx, "order:42", func(ctx context.Context, l *dlock.Lease) error {
		// All keys share the hash tag {order:42}, for Redis Cluster.
		_, err := redisfence.Exec(ctx, rdb, "{order:42}:fence", uint64(l.Token()),
			redisfence.Command("HSET", redisfence.Key("{order:42}"), "state", "paid"),
			redisfence.Command("RPUSH", redisfence.Key("{order:42}:log"), "paid"))
		return err // a stale token: fence.ErrStale, and no command ran
	})
}
