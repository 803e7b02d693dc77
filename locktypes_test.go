package dlock_test

import (
	"context"
	"errors"
	"testing"

	"github.com/dlockio/dlock"
)

// A shared lock needs a Sharer; it does not go with a limit; one owner id cannot
// hold a key both ways through one Client.
func TestSharedRules(t *testing.T) {
	ctx := context.Background()
	p, _, _ := setupPlain(t)
	if _, err := p.Lock(ctx, "k", dlock.WithShared()); !errors.Is(err, dlock.ErrUnsupported) {
		t.Fatalf("shared on a backend without read-write locks: %v, want ErrUnsupported", err)
	}
	c, _, _ := setup(t)
	if _, err := c.Lock(ctx, "k", dlock.WithShared(), dlock.WithLimit(2)); !errors.Is(err, dlock.ErrInvalid) {
		t.Fatalf("WithShared with WithLimit(2): %v, want ErrInvalid", err)
	}
	r, err := c.Lock(ctx, "k", dlock.WithShared(), dlock.WithOwner("me"))
	if err != nil {
		t.Fatal(err)
	}
	again, err := c.Lock(ctx, "k", dlock.WithShared(), dlock.WithOwner("me"))
	if err != nil || again.Token() != r.Token() {
		t.Fatalf("re-entering a shared hold: %v, token %d", err, r.Token())
	}
	if _, err := c.TryLock(ctx, "k", dlock.WithOwner("me")); !errors.Is(err, dlock.ErrInvalid) {
		t.Fatalf("the same owner id taking its shared key exclusively: %v, want ErrInvalid", err)
	}
	_ = again.Release(ctx)
	_ = r.Release(ctx)
	w, err := c.TryLock(ctx, "k", dlock.WithOwner("me"))
	if err != nil {
		t.Fatalf("exclusively once released: %v", err)
	}
	_ = w.Release(ctx)
	p2, err := c.Lock(ctx, "s", dlock.WithLimit(2), dlock.WithOwner("me"))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.Lock(ctx, "s", dlock.WithLimit(3), dlock.WithOwner("me")); !errors.Is(err, dlock.ErrLimitMismatch) {
		t.Fatalf("re-entering a permit with another limit: %v, want ErrLimitMismatch", err)
	}
	_ = p2.Release(ctx)
}
