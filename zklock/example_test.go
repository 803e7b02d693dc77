package zklock_test

import (
	"context"
	"log"
	"time"

	"github.com/dlockio/dlock"
	"github.com/dlockio/dlock/zklock"
)

// A lock on a ZooKeeper ensemble, from a URL listing its servers and the root path
// under which the locks live. The token is the grant node's creation zxid; waiters
// queue on sequential nodes and each watches only its predecessor.
func Example() {
	ctx := context.Background()
	c, err := dlock.Open(ctx, "zk://10.0.0.1:2181,10.0.0.2:2181,10.0.0.3:2181/apps/dlock?ttl=10s")
	if err != nil {
		log.Fatal(err)
	}
	defer c.Close()
	l, err := c.Lock(ctx, "compaction")
	if err != nil {
		log.Fatal(err)
	}
	defer l.Release(ctx)
	log.Printf("token %d", l.Token())
}

// Dial takes the servers directly; the backend makes and owns the ZooKeeper session
// (its expiry ends every lease at once), so there is no constructor taking a
// connection the program already has.
func ExampleDial() {
	ctx := context.Background()
	b, err := zklock.Dial(ctx, []string{"127.0.0.1:2181"}, zklock.WithRoot("/apps/dlock"), zklock.WithSessionTimeout(10*time.Second))
	if err != nil {
		log.Fatal(err)
	}
	c, err := dlock.New(b)
	if err != nil {
		log.Fatal(err)
	}
	defer c.Close()
}
