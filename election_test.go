package dlock_test

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/dlockio/dlock"
	"github.com/dlockio/dlock/clock"
	"github.com/dlockio/dlock/driver"
	"github.com/dlockio/dlock/memlock"
)

// plain is a memlock backend that shows only the required contract and an
// Inspector: no values, no holder watch, no notifier.
type plain struct {
	driver.Backend
	driver.Inspector
	releaseErr atomic.Pointer[error] // the next Release fails with it, once
	releases   atomic.Int64
}

func (p *plain) Release(ctx context.Context, key, owner string) error {
	p.releases.Add(1)
	if e := p.releaseErr.Swap(nil); e != nil {
		return *e
	}
	return p.Backend.Release(ctx, key, owner)
}

func setupPlain(t *testing.T, opts ...dlock.Option) (*dlock.Client, *plain, *clock.Fake) {
	t.Helper()
	clk := clock.NewFake(t0)
	b := memlock.NewStore(clk).Backend()
	p := &plain{Backend: b, Inspector: b}
	c, err := dlock.New(p, append([]dlock.Option{dlock.WithClock(clk)}, opts...)...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c, p, clk
}

// Values need a backend that stores them; an election without one works.
func TestCampaignWithoutValuer(t *testing.T) {
	c, _, _ := setupPlain(t)
	ctx := context.Background()
	if _, err := c.Campaign(ctx, "e", []byte("addr")); !errors.Is(err, dlock.ErrUnsupported) || !errors.Is(err, errors.ErrUnsupported) {
		t.Fatalf("Campaign with a value = %v, want ErrUnsupported", err)
	}
	if _, err := c.Lock(ctx, "e", dlock.WithValue([]byte("addr"))); !errors.Is(err, dlock.ErrUnsupported) {
		t.Fatalf("Lock WithValue = %v, want ErrUnsupported", err)
	}
	l, err := c.Campaign(ctx, "e", nil)
	if err != nil {
		t.Fatalf("Campaign without a value: %v", err)
	}
	if err := l.Proclaim(ctx, []byte("x")); !errors.Is(err, dlock.ErrUnsupported) {
		t.Fatalf("Proclaim = %v, want ErrUnsupported", err)
	}
	ld, err := c.Leader(ctx, "e")
	if err != nil || ld.Owner != l.Owner() || ld.Token != l.Token() || ld.Value != nil {
		t.Fatalf("Leader = %+v, %v", ld, err)
	}
	if err := l.Resign(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Campaign(ctx, "e", make([]byte, driver.MaxValueLen+1)); !errors.Is(err, dlock.ErrInvalid) {
		t.Fatalf("Campaign with a value too long = %v, want ErrInvalid", err)
	}
}

func recv(t *testing.T, ch <-chan dlock.Leader) dlock.Leader {
	t.Helper()
	select {
	case ld, ok := <-ch:
		if !ok {
			t.Fatal("Observe channel closed")
		}
		return ld
	case <-time.After(5 * time.Second):
		t.Fatal("nothing observed")
	}
	panic("unreachable")
}

// Without a holder watch, Observe reads every interval and when the leader's TTL
// runs out, so a crashed leader is seen gone when its grant expires.
func TestObservePollsAndFollowsTTL(t *testing.T) {
	c, p, clk := setupPlain(t)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	obs, err := c.Observe(ctx, "e", dlock.WithObserveInterval(time.Hour))
	if err != nil {
		t.Fatal(err)
	}
	if ld := recv(t, obs); ld.Exists() {
		t.Fatalf("first state %+v, want no leader", ld)
	}
	clk.BlockUntil(1) // the observer waits on its interval
	if _, err := p.Acquire(ctx, driver.Request{Key: "e", Owner: "crashed", TTL: 90 * time.Minute}); err != nil {
		t.Fatal(err)
	}
	clk.Advance(time.Hour) // the interval: read again
	ld := recv(t, obs)
	if ld.Owner != "crashed" || ld.Token != 1 || ld.TTL != 30*time.Minute {
		t.Fatalf("observed %+v", ld)
	}
	clk.BlockUntil(1) // now the leader's TTL, sooner than the interval
	clk.Advance(30*time.Minute + time.Millisecond)
	if ld := recv(t, obs); ld.Exists() {
		t.Fatalf("after the TTL: %+v, want no leader", ld)
	}
	cancel()
	for range obs {
	}
}

// Observe ends with its context or the client.
func TestObserveEndsWithClient(t *testing.T) {
	c, _, _ := setup(t)
	obs, err := c.Observe(context.Background(), "e")
	if err != nil {
		t.Fatal(err)
	}
	recv(t, obs)
	c.Close()
	for range obs {
	}
	if _, err := c.Observe(context.Background(), "e"); !errors.Is(err, dlock.ErrClosed) {
		t.Fatalf("Observe on a closed client = %v", err)
	}
	if _, err := c.Leader(context.Background(), ""); !errors.Is(err, dlock.ErrInvalid) {
		t.Fatalf("Leader of an empty name = %v", err)
	}
}

// A Resign whose request fails ends the leadership locally; Resign again asks the
// server again while the grant may still be there, and not after.
func TestResignRetries(t *testing.T) {
	for _, late := range []bool{false, true} {
		c, p, clk := setupPlain(t)
		ctx := context.Background()
		l, err := c.Campaign(ctx, "e", nil, dlock.WithTTL(3*time.Second))
		if err != nil {
			t.Fatal(err)
		}
		boom := errors.New("connection reset")
		p.releaseErr.Store(&boom)
		if err := l.Resign(ctx); !errors.Is(err, boom) {
			t.Fatalf("Resign = %v, want the failed request's error", err)
		}
		if !errors.Is(l.Err(), dlock.ErrReleased) {
			t.Fatalf("leadership after a failed Resign: Err = %v", l.Err())
		}
		if _, err := c.TryLock(ctx, "e"); !errors.Is(err, dlock.ErrLocked) {
			t.Fatalf("the name should still be held on the server: %v", err)
		}
		if late {
			clk.Advance(3 * time.Second) // past the validity: the server expired it
		}
		before := p.releases.Load()
		if err := l.Resign(ctx); err != nil {
			t.Fatalf("second Resign: %v", err)
		}
		if asked := p.releases.Load() - before; late && asked != 0 || !late && asked != 1 {
			t.Fatalf("late=%v: the second Resign sent %d releases", late, asked)
		}
		if err := l.Resign(ctx); err != nil || p.releases.Load()-before > 1 {
			t.Fatalf("third Resign: %v (releases %d)", err, p.releases.Load()-before)
		}
		l2, err := c.TryLock(ctx, "e")
		if err != nil {
			t.Fatalf("late=%v: TryLock after Resign: %v", late, err)
		}
		if l2.Token() <= l.Token() {
			t.Fatalf("next epoch %d not above %d", l2.Token(), l.Token())
		}
	}
}

// A leader that loses its grant learns it at Proclaim, at once.
func TestProclaimFindsLoss(t *testing.T) {
	c, fb, _ := setup(t)
	ctx := context.Background()
	l, err := c.Campaign(ctx, "e", []byte("a"))
	if err != nil {
		t.Fatal(err)
	}
	fb.Store().Expire("e")
	if err := l.Proclaim(ctx, []byte("b")); !errors.Is(err, dlock.ErrLeaseLost) {
		t.Fatalf("Proclaim after the grant went = %v, want ErrLeaseLost", err)
	}
	select {
	case <-l.Done():
	default:
		t.Fatal("leadership context not cancelled")
	}
	if err := l.Resign(ctx); !errors.Is(err, dlock.ErrLeaseLost) {
		t.Fatalf("Resign after loss = %v, want ErrLeaseLost", err)
	}
	if err := l.Resign(ctx); err != nil {
		t.Fatalf("Resign again = %v", err)
	}
}

// A holder limit needs a backend that can count holders; bad limits are invalid.
func TestLimitNeedsSemaphorer(t *testing.T) {
	c, _, _ := setupPlain(t)
	ctx := context.Background()
	if _, err := c.Lock(ctx, "s", dlock.WithLimit(2)); !errors.Is(err, dlock.ErrUnsupported) {
		t.Fatalf("Lock WithLimit(2) = %v, want ErrUnsupported", err)
	}
	if _, _, err := c.Holders(ctx, "s"); !errors.Is(err, dlock.ErrUnsupported) {
		t.Fatalf("Holders = %v, want ErrUnsupported", err)
	}
	l, err := c.Lock(ctx, "s", dlock.WithLimit(1)) // an ordinary lock
	if err != nil {
		t.Fatal(err)
	}
	_ = l.Release(ctx)
	for _, n := range []int{0, -1, dlock.MaxLimit + 1} {
		if _, err := c.Lock(ctx, "s", dlock.WithLimit(n)); !errors.Is(err, dlock.ErrInvalid) {
			t.Fatalf("WithLimit(%d) = %v, want ErrInvalid", n, err)
		}
	}
}
