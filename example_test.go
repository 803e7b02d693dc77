package dlock_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/dlockio/dlock"
	"github.com/dlockio/dlock/clock"
	"github.com/dlockio/dlock/fence"
	"github.com/dlockio/dlock/memlock"
	_ "github.com/dlockio/dlock/memlock" // registers mem://; import github.com/dlockio/dlock/all for every backend
)

// A program opens a client from a URL, takes a lock, works while holding it and
// releases it. The in-process backend (mem://NAME) stands in for a real server here;
// with Redis the URL would be redis://host:6379/0?ttl=10s.
func Example() {
	ctx := context.Background()
	c, err := dlock.Open(ctx, "mem://example")
	if err != nil {
		fmt.Println(err)
		return
	}
	defer c.Close()

	l, err := c.Lock(ctx, "nightly-report")
	if err != nil {
		fmt.Println(err)
		return
	}
	fmt.Println("holding", l.Key(), "with token", l.Token())
	if err := l.Release(ctx); err != nil {
		fmt.Println(err)
	}
	// Output: holding nightly-report with token 1
}

// Open takes the backend and its settings from a URL; the lease TTL is a URL
// parameter on every backend, or an option.
func ExampleOpen() {
	ctx := context.Background()
	c, err := dlock.Open(ctx, "mem://open?ttl=30s", dlock.WithRenewInterval(5*time.Second))
	if err != nil {
		fmt.Println(err)
		return
	}
	defer c.Close()
	l, err := c.Lock(ctx, "k")
	if err != nil {
		fmt.Println(err)
		return
	}
	defer l.Release(ctx)
	fmt.Println("TTL:", l.TTL())

	_, err = dlock.Open(ctx, "mem://open?ttl=soon")
	fmt.Println(errors.Is(err, dlock.ErrInvalid))
	// Output:
	// TTL: 30s
	// true
}

// TryLock returns ErrLocked at once when another owner holds the key.
func ExampleClient_TryLock() {
	ctx := context.Background()
	a, _ := dlock.Open(ctx, "mem://trylock")
	defer a.Close()
	b, _ := dlock.Open(ctx, "mem://trylock")
	defer b.Close()

	l, err := a.TryLock(ctx, "invoice-42")
	if err != nil {
		fmt.Println(err)
		return
	}
	defer l.Release(ctx)
	_, err = b.TryLock(ctx, "invoice-42")
	fmt.Println("second client:", errors.Is(err, dlock.ErrLocked))
	// Output: second client: true
}

// Lock waits (woken by the backend, not by polling) until the key is free or ctx
// ends; giving up matches both ErrLocked and the context's error.
func ExampleClient_Lock_deadline() {
	ctx := context.Background()
	c, _ := dlock.Open(ctx, "mem://deadline")
	defer c.Close()
	holder, _ := dlock.Open(ctx, "mem://deadline")
	defer holder.Close()

	l, _ := holder.Lock(ctx, "migrations")
	defer l.Release(ctx)

	wctx, cancel := context.WithTimeout(ctx, 50*time.Millisecond)
	defer cancel()
	_, err := c.Lock(wctx, "migrations")
	fmt.Println(errors.Is(err, dlock.ErrLocked), errors.Is(err, context.DeadlineExceeded))
	// Output: true true
}

// Lock returns as soon as the holder releases: waiters are served in order.
func ExampleClient_Lock_wait() {
	ctx := context.Background()
	a, _ := dlock.Open(ctx, "mem://wait")
	defer a.Close()
	b, _ := dlock.Open(ctx, "mem://wait")
	defer b.Close()

	first, _ := a.Lock(ctx, "queue")
	got := make(chan *dlock.Lease)
	go func() {
		l, err := b.Lock(ctx, "queue") // waits for first
		if err != nil {
			fmt.Println(err)
		}
		got <- l
	}()
	time.Sleep(20 * time.Millisecond)
	first.Release(ctx)
	second := <-got
	fmt.Println("tokens:", first.Token(), second.Token())
	second.Release(ctx)
	// Output: tokens: 1 2
}

// Do locks, runs fn with a context that ends if the lease may be lost, and
// releases, whatever fn returns.
func ExampleClient_Do() {
	ctx := context.Background()
	c, _ := dlock.Open(ctx, "mem://do")
	defer c.Close()

	err := c.Do(ctx, "daily-billing", func(ctx context.Context, l *dlock.Lease) error {
		fmt.Println("billing under token", l.Token())
		return nil
	})
	fmt.Println("err:", err)
	// Output:
	// billing under token 1
	// err: <nil>
}

// When the lease may be lost (a refused renewal, or no successful renewal before
// the validity deadline), Done closes and Context is cancelled with ErrLeaseLost,
// before the server can give the key to anyone else. Here the in-process store
// forgets the grant, as a server that lost its data would.
func ExampleLease_Context() {
	ctx := context.Background()
	store := memlock.NewStore(clock.Real)
	c, _ := dlock.New(store.Backend(), dlock.WithTTL(300*time.Millisecond))
	defer c.Close()

	l, _ := c.Lock(ctx, "reindex")
	store.Expire("reindex") // the server drops the grant; the next renewal is refused
	<-l.Context().Done()
	fmt.Println(errors.Is(context.Cause(l.Context()), dlock.ErrLeaseLost))
	fmt.Println(errors.Is(l.Release(ctx), dlock.ErrLeaseLost))
	// Output:
	// true
	// true
}

// The token is larger for every later holder of a key. Hand it to the resource you
// protect and have it refuse a token lower than one it has seen: a holder paused
// past its lease (GC, swap, SIGSTOP) is then refused, which no timeout can do. The
// packages under fence do this check inside the write for real stores.
func ExampleLease_Token() {
	ctx := context.Background()
	c, _ := dlock.Open(ctx, "mem://token")
	defer c.Close()

	var (
		mu   sync.Mutex
		seen uint64 // the highest token the resource has accepted
	)
	write := func(token dlock.Token, what string) error {
		mu.Lock()
		defer mu.Unlock()
		if err := fence.Check("report", seen, uint64(token)); err != nil {
			return err
		}
		seen = uint64(token)
		fmt.Println("wrote", what)
		return nil
	}

	old, _ := c.Lock(ctx, "report")
	oldToken := old.Token()
	old.Release(ctx)
	l, _ := c.Lock(ctx, "report")
	defer l.Release(ctx)

	_ = write(l.Token(), "new")
	err := write(oldToken, "stale") // a paused former holder waking up
	fmt.Println(errors.Is(err, fence.ErrStale))
	// Output:
	// wrote new
	// true
}

// With WithOwner, a lock is re-entrant for that owner id within one Client: the
// inner Lock returns at once with the same token, and the key stays held until
// every Lock is released. From another Client or process the same owner id is
// refused while the key is held (WithResume takes a grant over explicitly).
func ExampleWithOwner() {
	ctx := context.Background()
	c, _ := dlock.Open(ctx, "mem://owner", dlock.WithOwner("worker-7"))
	defer c.Close()
	other, _ := dlock.Open(ctx, "mem://owner", dlock.WithOwner("worker-7"))
	defer other.Close()

	outer, _ := c.Lock(ctx, "tenant-1")
	inner, _ := c.Lock(ctx, "tenant-1")
	fmt.Println("same token:", outer.Token() == inner.Token(), "owner:", inner.Owner())

	_, err := other.TryLock(ctx, "tenant-1")
	fmt.Println("same owner id, other client:", errors.Is(err, dlock.ErrLocked))

	inner.Release(ctx)
	_, err = other.TryLock(ctx, "tenant-1")
	fmt.Println("after the inner release:", errors.Is(err, dlock.ErrLocked))
	outer.Release(ctx)
	l, err := other.TryLock(ctx, "tenant-1")
	fmt.Println("after the outer release:", err)
	l.Release(ctx)
	// Output:
	// same token: true owner: worker-7
	// same owner id, other client: true
	// after the inner release: true
	// after the outer release: <nil>
}

// Inspect tells who holds a key, with the grant's token, the TTL left on the
// server and the number of waiters (-1 when the backend does not know); a free key
// is ErrNotHeld. ForceRelease frees a key whoever holds it (for operators: the old
// holder may still run; fencing keeps the resource safe).
func ExampleClient_Inspect() {
	ctx := context.Background()
	c, _ := dlock.Open(ctx, "mem://inspect", dlock.WithOwner("backup-job"))
	defer c.Close()
	admin, _ := dlock.Open(ctx, "mem://inspect")
	defer admin.Close()

	l, _ := c.Lock(ctx, "backup")
	defer l.Release(ctx)
	info, err := admin.Inspect(ctx, "backup")
	fmt.Println(info.Owner, info.Token, info.Waiters, err)

	fmt.Println(admin.ForceRelease(ctx, "backup"))
	_, err = admin.Inspect(ctx, "backup")
	fmt.Println(errors.Is(err, dlock.ErrNotHeld))
	// Output:
	// backup-job 1 0 <nil>
	// <nil>
	// true
}

// Leader election: Campaign waits until the candidate leads and publishes its
// value; the token is the leader's epoch, larger for every later leader; followers
// read the leader with Leader, or follow it with Observe.
func ExampleClient_Campaign() {
	ctx := context.Background()
	c, err := dlock.Open(ctx, "mem://election")
	if err != nil {
		fmt.Println(err)
		return
	}
	defer c.Close()

	obs, err := c.Observe(ctx, "scheduler")
	if err != nil {
		fmt.Println(err)
		return
	}
	show := func() {
		ld := <-obs
		if !ld.Exists() {
			fmt.Println("no leader")
			return
		}
		fmt.Printf("leader %s, epoch %d\n", ld.Value, ld.Token)
	}
	show()

	lead, err := c.Campaign(ctx, "scheduler", []byte("10.0.0.1:8080"))
	if err != nil {
		fmt.Println(err)
		return
	}
	show()
	// Lead under lead.Context(): it is cancelled the moment leadership may be
	// lost. Hand lead.Token() to what the leader writes.
	if err := lead.Proclaim(ctx, []byte("10.0.0.1:9090")); err != nil {
		fmt.Println(err)
	}
	show()
	if err := lead.Resign(ctx); err != nil {
		fmt.Println(err)
	}
	show()

	next, err := c.Campaign(ctx, "scheduler", []byte("10.0.0.2:8080"))
	if err != nil {
		fmt.Println(err)
		return
	}
	defer next.Resign(ctx)
	show()
	// Output:
	// no leader
	// leader 10.0.0.1:8080, epoch 1
	// leader 10.0.0.1:9090, epoch 1
	// no leader
	// leader 10.0.0.2:8080, epoch 2
}

// A semaphore: WithLimit(n) lets up to n owners hold a key at once, each with its
// own lease and a token from the key's one rising sequence.
func ExampleWithLimit() {
	ctx := context.Background()
	c, err := dlock.Open(ctx, "mem://semaphore")
	if err != nil {
		fmt.Println(err)
		return
	}
	defer c.Close()

	a, _ := c.TryLock(ctx, "encoder", dlock.WithLimit(2))
	b, _ := c.TryLock(ctx, "encoder", dlock.WithLimit(2))
	_, err = c.TryLock(ctx, "encoder", dlock.WithLimit(2))
	fmt.Println("tokens", a.Token(), b.Token(), "third:", errors.Is(err, dlock.ErrLocked))
	_, err = c.TryLock(ctx, "encoder") // a mutex of a key held as a semaphore
	fmt.Println("other limit:", errors.Is(err, dlock.ErrLimitMismatch))

	limit, holders, _ := c.Holders(ctx, "encoder")
	fmt.Println("limit", limit, "holders", len(holders))
	_ = a.Release(ctx)
	c3, _ := c.TryLock(ctx, "encoder", dlock.WithLimit(2))
	fmt.Println("after a release, token", c3.Token())
	_ = b.Release(ctx)
	_ = c3.Release(ctx)
	// Output:
	// tokens 1 2 third: true
	// other limit: true
	// limit 2 holders 2
	// after a release, token 3
}
