package etcdlock_test

import (
	"context"
	"log"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/dlockio/dlock"
	"github.com/dlockio/dlock/etcdlock"
)

// A lock on an etcd cluster, from a URL listing its members and a key prefix.
// Waiters queue in order of their keys' revisions; the token is the grant's create
// revision.
func Example() {
	ctx := context.Background()
	c, err := dlock.Open(ctx, "etcd://10.0.0.1:2379,10.0.0.2:2379,10.0.0.3:2379/locks?ttl=10s")
	if err != nil {
		log.Fatal(err)
	}
	defer c.Close()
	l, err := c.Lock(ctx, "schema-migration")
	if err != nil {
		log.Fatal(err)
	}
	defer l.Release(ctx)
	<-l.Done() // closes if the lease may be lost (for example, the etcd session ended)
}

// New puts the locks on an etcd client the program already has; the client stays
// the caller's to close.
func ExampleNew() {
	ctx := context.Background()
	cli, err := clientv3.New(clientv3.Config{Endpoints: []string{"127.0.0.1:2379"}, DialTimeout: 5 * time.Second})
	if err != nil {
		log.Fatal(err)
	}
	defer cli.Close()
	b, err := etcdlock.New(ctx, cli, etcdlock.WithPrefix("locks"))
	if err != nil {
		log.Fatal(err)
	}
	c, err := dlock.New(b)
	if err != nil {
		log.Fatal(err)
	}
	defer c.Close()
}
