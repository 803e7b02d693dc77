package redlock_test

import (
	"context"
	"log"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/dlockio/dlock"
	"github.com/dlockio/dlock/redlock"
)

// Redlock over five independent Redis masters: a grant needs a majority. Hand the
// token to the resource: Redlock's safety rests on clocks, and fencing is what
// protects a resource when they misbehave.
func Example() {
	ctx := context.Background()
	c, err := dlock.Open(ctx, "redlock://10.0.0.1:6379,10.0.0.2:6379,10.0.0.3:6379,10.0.0.4:6379,10.0.0.5:6379/0?ttl=10s")
	if err != nil {
		log.Fatal(err)
	}
	defer c.Close()
	l, err := c.Lock(ctx, "rebalance")
	if err != nil {
		log.Fatal(err)
	}
	defer l.Release(ctx)
	log.Printf("token %d", l.Token())
}

// New takes go-redis clients the program already has, one per node; they stay the
// caller's to close.
func ExampleNew() {
	ctx := context.Background()
	var clients []*redis.Client
	for _, addr := range []string{"10.0.0.1:6379", "10.0.0.2:6379", "10.0.0.3:6379"} {
		rdb := redis.NewClient(&redis.Options{Addr: addr})
		defer rdb.Close()
		clients = append(clients, rdb)
	}
	b, err := redlock.New(ctx, clients, redlock.WithNodeTimeout(50*time.Millisecond))
	if err != nil {
		log.Fatal(err)
	}
	c, err := dlock.New(b)
	if err != nil {
		log.Fatal(err)
	}
	defer c.Close()
}
