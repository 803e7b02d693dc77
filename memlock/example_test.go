package memlock_test

import (
	"context"
	"fmt"
	"time"

	"github.com/dlockio/dlock"
	"github.com/dlockio/dlock/clock"
	"github.com/dlockio/dlock/memlock"
)

// A Store is lock state inside one process: for tests of code that takes locks,
// and as the reference backend. Clients on one Store exclude each other; with a
// fake clock, expiry is under the test's control.
func ExampleNew() {
	ctx := context.Background()
	clk := clock.NewFake(time.Unix(0, 0))
	store := memlock.NewStore(clk)
	b, _ := memlock.New(ctx, store)
	c, _ := dlock.New(b)
	defer c.Close()

	l, _ := c.Lock(ctx, "k")
	fmt.Println("token", l.Token(), "waiters", store.Waiters("k"))
	l.Release(ctx)
	// Output: token 1 waiters 0
}
