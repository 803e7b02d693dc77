package dlock_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/dlockio/dlock"
	"github.com/dlockio/dlock/clock"
	"github.com/dlockio/dlock/driver"
	"github.com/dlockio/dlock/memlock"
)

// countingMulti is memlock counting its AcquireAll and Acquire calls.
type countingMulti struct {
	*memlock.Backend
	all, one atomic.Int64
}

func (b *countingMulti) AcquireAll(ctx context.Context, reqs []driver.Request) ([]driver.Grant, error) {
	b.all.Add(1)
	return b.Backend.AcquireAll(ctx, reqs)
}

func (b *countingMulti) Acquire(ctx context.Context, req driver.Request) (driver.Grant, error) {
	b.one.Add(1)
	return b.Backend.Acquire(ctx, req)
}

// A free set of a generated owner is one AcquireAll; a held one falls back to
// key-by-key waiting; a stable owner id, a value, a limit or shared mode go key by
// key and re-enter what the owner holds.
func TestLockAllPaths(t *testing.T) {
	ctx := context.Background()
	store := memlock.NewStore(clock.Real)
	b := &countingMulti{Backend: store.Backend()}
	c, err := dlock.New(b)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	m, err := c.LockAll(ctx, []string{"b", "a", "c"})
	if err != nil || b.all.Load() != 1 || b.one.Load() != 0 {
		t.Fatalf("LockAll of a free set: %v; %d AcquireAll and %d Acquire calls, want 1 and 0", err, b.all.Load(), b.one.Load())
	}
	if err := m.Release(ctx); err != nil {
		t.Fatal(err)
	}
	for _, opt := range []dlock.Option{dlock.WithOwner("me"), dlock.WithValue([]byte("v")), dlock.WithLimit(2), dlock.WithShared()} {
		b.all.Store(0)
		b.one.Store(0)
		m, err := c.LockAll(ctx, []string{"b", "a"}, opt)
		if err != nil || b.all.Load() != 0 || b.one.Load() != 2 {
			t.Fatalf("LockAll with an option: %v; %d AcquireAll and %d Acquire calls, want 0 and 2", err, b.all.Load(), b.one.Load())
		}
		if err := m.Release(ctx); err != nil {
			t.Fatal(err)
		}
	}
	// A stable owner re-enters its own grant of one key of the set.
	l, err := c.Lock(ctx, "a", dlock.WithOwner("me"))
	if err != nil {
		t.Fatal(err)
	}
	m, err = c.TryLockAll(ctx, []string{"a", "b"}, dlock.WithOwner("me"))
	if err != nil || m.Token("a") != l.Token() {
		t.Fatalf("TryLockAll re-entering a: %v, token %d, want %d", err, m.Token("a"), l.Token())
	}
	if err := m.Release(ctx); err != nil {
		t.Fatal(err)
	}
	if err := l.Err(); err != nil {
		t.Fatalf("the first lease of a ended with the set's release: %v", err)
	}
	if err := l.Release(ctx); err != nil {
		t.Fatal(err)
	}
}

// slotted is countingMulti that can take a set in one step only if every key
// starts with the same byte, like a Redis Cluster with keys of one hash slot.
type slotted struct{ countingMulti }

func (b *slotted) AtomicSet(keys []string) bool {
	for _, k := range keys {
		if k[0] != keys[0][0] {
			return false
		}
	}
	return true
}

func (b *slotted) AcquireAll(ctx context.Context, reqs []driver.Request) ([]driver.Grant, error) {
	keys := make([]string, len(reqs))
	for i, r := range reqs {
		keys[i] = r.Key
	}
	if !b.AtomicSet(keys) {
		return nil, fmt.Errorf("keys in two slots: %w", driver.ErrUnsupported)
	}
	return b.countingMulti.AcquireAll(ctx, reqs)
}

// A driver.SetChecker decides which sets are taken in one step: the others are
// taken key by key, without an AcquireAll call.
func TestLockAllSetChecker(t *testing.T) {
	ctx := context.Background()
	store := memlock.NewStore(clock.Real)
	b := &slotted{countingMulti{Backend: store.Backend()}}
	c, err := dlock.New(b)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	for _, tc := range []struct {
		keys     []string
		all, one int64
	}{
		{[]string{"x1", "x2", "x3"}, 1, 0},
		{[]string{"x1", "y1"}, 0, 2},
	} {
		b.all.Store(0)
		b.one.Store(0)
		for _, try := range []bool{false, true} {
			lock := c.LockAll
			if try {
				lock = c.TryLockAll
			}
			m, err := lock(ctx, tc.keys)
			if err != nil || b.all.Load() != tc.all || b.one.Load() != tc.one {
				t.Fatalf("LockAll(%q) (try %v): %v; %d AcquireAll and %d Acquire calls, want %d and %d",
					tc.keys, try, err, b.all.Load(), b.one.Load(), tc.all, tc.one)
			}
			if err := m.Release(ctx); err != nil {
				t.Fatal(err)
			}
			b.all.Store(0)
			b.one.Store(0)
		}
	}
}

func TestLockAllInvalid(t *testing.T) {
	ctx := context.Background()
	c, err := dlock.New(memlock.NewStore(clock.Real).Backend())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	many := make([]string, dlock.MaxKeys+1)
	for i := range many {
		many[i] = fmt.Sprint("k", i)
	}
	dup := append([]string{}, many[:dlock.MaxKeys]...)
	dup = append(dup, "k0")
	for _, tc := range []struct {
		keys []string
		want string
	}{
		{nil, "no keys"},
		{[]string{"a", ""}, "empty key"},
		{[]string{"a", "b\n"}, "control character"},
		{many, "the limit is 64"},
	} {
		_, err := c.LockAll(ctx, tc.keys)
		if !errors.Is(err, dlock.ErrInvalid) || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("LockAll(%d keys) = %v, want ErrInvalid saying %q", len(tc.keys), err, tc.want)
		}
	}
	m, err := c.LockAll(ctx, dup) // 64 distinct keys, one twice
	if err != nil || len(m.Keys()) != dlock.MaxKeys {
		t.Fatalf("LockAll of %d keys with a duplicate: %v", len(dup), err)
	}
	if err := m.Release(ctx); err != nil {
		t.Fatal(err)
	}
}
