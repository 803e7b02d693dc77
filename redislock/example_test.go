package redislock_test

import (
	"context"
	"log"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/dlockio/dlock"
	"github.com/dlockio/dlock/redislock"
)

// A lock on one Redis server, from a URL. replicas=1 makes every grant wait until
// one replica has it (WAIT), so that a failover to that replica keeps the lock.
func Example() {
	ctx := context.Background()
	c, err := dlock.Open(ctx, "redis://127.0.0.1:6379/0?ttl=10s&replicas=1")
	if err != nil {
		log.Fatal(err)
	}
	defer c.Close()
	err = c.Do(ctx, "nightly-report", func(ctx context.Context, l *dlock.Lease) error {
		log.Printf("holding with token %d", l.Token())
		return nil
	})
	if err != nil {
		log.Fatal(err)
	}
}

// New puts the locks on a go-redis client the program already has; the client
// stays the caller's to close.
func ExampleNew() {
	ctx := context.Background()
	rdb := redis.NewClient(&redis.Options{Addr: "127.0.0.1:6379"})
	defer rdb.Close()
	b, err := redislock.New(ctx, rdb, redislock.WithPrefix("billing"), redislock.WithReplicas(1, time.Second))
	if err != nil {
		log.Fatal(err)
	}
	c, err := dlock.New(b, dlock.WithTTL(10*time.Second))
	if err != nil {
		log.Fatal(err)
	}
	defer c.Close()
	l, err := c.Lock(ctx, "invoice-42")
	if err != nil {
		log.Fatal(err)
	}
	defer l.Release(ctx)
}
