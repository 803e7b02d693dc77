package dlock_test

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/dlockio/dlock"
	"github.com/dlockio/dlock/clock"
	"github.com/dlockio/dlock/driver"
	"github.com/dlockio/dlock/memlock"
)

// recording is the reference backend that records each attempt's Reenter flag.
type recording struct {
	*memlock.Backend
	reenter []bool // guarded by being used from one lock call at a time
}

func (b *recording) Acquire(ctx context.Context, req driver.Request) (driver.Grant, error) {
	b.reenter = append(b.reenter, req.Reenter)
	return b.Backend.Acquire(ctx, req)
}

// Two clients with one owner id (two processes of one cron job): the second is
// refused while the first holds, cannot free the first's grant, and takes it over
// only with WithResume. Re-entry within one client stays as it was.
func TestSameOwnerOtherClient(t *testing.T) {
	st := memlock.NewStore(clock.Real)
	rb := &recording{Backend: st.Backend()}
	a, err := dlock.New(st.Backend(), dlock.WithOwner("cron-job-1"))
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	b, err := dlock.New(rb, dlock.WithOwner("cron-job-1"), dlock.WithRetry(time.Millisecond, 5*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	ctx := context.Background()
	l, err := a.Lock(ctx, "k")
	if err != nil {
		t.Fatal(err)
	}
	// Within the client, re-entry as before.
	l1, err := a.TryLock(ctx, "k")
	if err != nil || l1.Token() != l.Token() {
		t.Fatalf("re-entry within the client = %v, %v", l1, err)
	}
	if err := l1.Release(ctx); err != nil {
		t.Fatal(err)
	}
	before, _ := st.Backend().Inspect(ctx, "k")
	if _, err := b.TryLock(ctx, "k"); !errors.Is(err, dlock.ErrLocked) {
		t.Fatalf("TryLock of the same owner id from another client = %v, want ErrLocked", err)
	}
	wctx, cancel := context.WithTimeout(ctx, 50*time.Millisecond)
	_, err = b.Lock(wctx, "k")
	cancel()
	if !errors.Is(err, dlock.ErrLocked) || !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Lock of the same owner id from another client = %v, want ErrLocked and DeadlineExceeded", err)
	}
	for i, r := range rb.reenter {
		if r {
			t.Fatalf("attempt %d of a stable owner id said Reenter", i)
		}
	}
	after, err := st.Backend().Inspect(ctx, "k")
	if err != nil || after.Token != before.Token || after.Owner != "cron-job-1" {
		t.Fatalf("after the refused attempts Inspect = %+v, %v; before %+v", after, err, before)
	}
	if l.Err() != nil {
		t.Fatalf("the holder's lease ended: %v", l.Err())
	}

	// An explicit resume takes the grant over, with its token.
	r, err := b.TryLock(ctx, "k", dlock.WithResume())
	if err != nil {
		t.Fatalf("resume: %v", err)
	}
	if r.Token() != l.Token() || !rb.reenter[len(rb.reenter)-1] {
		t.Fatalf("resumed token %d (Reenter %v), want %d", r.Token(), rb.reenter[len(rb.reenter)-1], l.Token())
	}
	if err := r.Release(ctx); err != nil {
		t.Fatal(err)
	}
	if err := l.Release(ctx); !errors.Is(err, dlock.ErrLeaseLost) {
		t.Fatalf("release of the taken-over lease = %v, want ErrLeaseLost", err)
	}
}

// A generated owner id says Reenter (it is the call's alone); a stable one says it
// only for the attempt that asks again after this call's own late grant.
func TestReenterOnlyWhenSafe(t *testing.T) {
	clk := clock.NewFake(t0)
	fb := &lateFirst{Backend: memlock.NewStore(clk).Backend(), clk: clk}
	rb := &recordingLate{lateFirst: fb}
	c, err := dlock.New(rb, dlock.WithClock(clk), dlock.WithTTL(9*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	ctx := context.Background()
	l, err := c.TryLock(ctx, "k", dlock.WithOwner("stable"))
	if err != nil {
		t.Fatal(err)
	}
	if got := fmt.Sprint(rb.reenter); got != "[false true]" {
		t.Fatalf("Reenter of a stable owner's attempts = %s, want [false true] (the late grant, then its re-entry)", got)
	}
	if err := l.Release(ctx); err != nil {
		t.Fatal(err)
	}
	l, err = c.TryLock(ctx, "k")
	if err != nil {
		t.Fatal(err)
	}
	if got := fmt.Sprint(rb.reenter[2:]); got != "[true]" {
		t.Fatalf("Reenter of a generated owner's attempt = %s, want [true]", got)
	}
	if err := l.Release(ctx); err != nil {
		t.Fatal(err)
	}
}

type recordingLate struct {
	*lateFirst
	reenter []bool
}

func (b *recordingLate) Acquire(ctx context.Context, req driver.Request) (driver.Grant, error) {
	b.reenter = append(b.reenter, req.Reenter)
	return b.lateFirst.Acquire(ctx, req)
}

// alwaysLate is the reference backend whose every grant's reply comes after the
// validity has passed.
type alwaysLate struct {
	*memlock.Backend
	clk *clock.Fake
}

func (b *alwaysLate) Acquire(ctx context.Context, req driver.Request) (driver.Grant, error) {
	g, err := b.Backend.Acquire(ctx, req)
	b.clk.Advance(req.TTL)
	return g, err
}

// A validity shorter than a request is its own error, not "locked by another owner"
// (nobody else holds the key), and a generated owner's grant is given back.
func TestValidityTooShort(t *testing.T) {
	clk := clock.NewFake(t0)
	st := memlock.NewStore(clk)
	c, err := dlock.New(&alwaysLate{Backend: st.Backend(), clk: clk}, dlock.WithClock(clk), dlock.WithTTL(time.Second))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	ctx := context.Background()
	for _, lock := range []func(context.Context, string, ...dlock.Option) (*dlock.Lease, error){c.TryLock, c.Lock} {
		_, err := lock(ctx, "k")
		if !errors.Is(err, dlock.ErrValidityTooShort) || errors.Is(err, dlock.ErrLocked) {
			t.Fatalf("lock with every grant late = %v, want ErrValidityTooShort and not ErrLocked", err)
		}
	}
}

// hangingHeld is a backend on which an attempt at a held key hangs until ctx ends
// and then fails as a network call would (the error wraps ctx.Err(), or not), and a
// Watch fails the same way once ctx has ended.
type hangingHeld struct {
	*memlock.Backend
	wrapCtx    bool
	atDeadline bool // fail at the deadline, maybe before ctx is marked done (a dial's i/o timeout)
	watchN     atomic.Int64
}

func (b *hangingHeld) Acquire(ctx context.Context, req driver.Request) (driver.Grant, error) {
	if req.Key == "held" {
		if dl, ok := ctx.Deadline(); ok && b.atDeadline {
			time.Sleep(time.Until(dl))
			return driver.Grant{}, fmt.Errorf("backend: acquire %q: dial tcp: i/o timeout", req.Key)
		}
		<-ctx.Done()
		if b.wrapCtx {
			return driver.Grant{}, fmt.Errorf("backend: acquire %q: %w", req.Key, ctx.Err())
		}
		return driver.Grant{}, fmt.Errorf("backend: acquire %q: connection reset", req.Key)
	}
	return b.Backend.Acquire(ctx, req)
}

func (b *hangingHeld) Watch(ctx context.Context, key, owner string) (driver.Waiter, error) {
	if b.watchN.Add(1)%2 == 0 {
		<-ctx.Done()
		return nil, fmt.Errorf("backend: watch %q: %w", key, ctx.Err())
	}
	return b.Backend.Watch(ctx, key, owner)
}

// A waiting Lock whose ctx ends during a request to the backend (or while it
// registers its wait) returns an error matching ErrLocked and ctx.Err(), whatever
// the request returned; a TryLock's matches ctx.Err().
func TestWaitEndsDuringRequest(t *testing.T) {
	for mode := range 3 {
		wrapCtx := mode == 0
		b := &hangingHeld{Backend: memlock.NewStore(clock.Real).Backend(), wrapCtx: wrapCtx, atDeadline: mode == 2}
		c, err := dlock.New(b)
		if err != nil {
			t.Fatal(err)
		}
		const n = 50
		errs := make(chan error, n)
		for i := range n {
			go func() {
				ctx, cancel := context.WithTimeout(context.Background(), time.Duration(i%10)*time.Millisecond)
				defer cancel()
				_, err := c.Lock(ctx, "held")
				errs <- err
			}()
		}
		for range n {
			if err := <-errs; !errors.Is(err, dlock.ErrLocked) || !errors.Is(err, context.DeadlineExceeded) {
				t.Errorf("wrapCtx %v: Lock = %v, want ErrLocked and DeadlineExceeded", wrapCtx, err)
			}
		}
		ctx, cancel := context.WithTimeout(context.Background(), time.Millisecond)
		_, err = c.TryLock(ctx, "held")
		cancel()
		if !errors.Is(err, context.DeadlineExceeded) || errors.Is(err, dlock.ErrLocked) {
			t.Errorf("wrapCtx %v: TryLock = %v, want DeadlineExceeded, not ErrLocked", wrapCtx, err)
		}
		if err := c.Close(); err != nil {
			t.Fatal(err)
		}
	}
}
