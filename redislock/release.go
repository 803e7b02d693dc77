package redislock

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/dlockio/dlock/driver"
)

// Refresh implements driver.Backend.
func (b *Backend) Refresh(ctx context.Context, key, owner string, ttl time.Duration) error {
	cmd, err := b.runScript(ctx, refreshScript, b.keys(key), owner, ms(ttl))
	if n, cerr := cmd.Int64(); cerr == nil && n == 0 {
		return driver.ErrNotHeld
	}
	if err != nil {
		return wrap("refresh", key, err)
	}
	return nil
}

// Release implements driver.Backend.
func (b *Backend) Release(ctx context.Context, key, owner string) error {
	n, err := releaseScript.Run(ctx, b.rdb, b.keys(key), owner).Int64()
	if err != nil {
		return wrap("release", key, err)
	}
	if n == 0 {
		return driver.ErrNotHeld
	}
	return nil
}

// ForceRelease implements driver.ForceReleaser.
func (b *Backend) ForceRelease(ctx context.Context, key string) error {
	n, err := forceReleaseScript.Run(ctx, b.rdb, b.keys(key), b.prefix).Int64()
	if err != nil {
		return wrap("force release", key, err)
	}
	if n == 0 {
		return driver.ErrNotHeld
	}
	return nil
}

// Inspect implements driver.Inspector.
func (b *Backend) Inspect(ctx context.Context, key string) (driver.Info, error) {
	v, err := inspectScript.Run(ctx, b.rdb, b.keys(key), b.prefix).Slice()
	if errors.Is(err, redis.Nil) {
		return driver.Info{}, driver.ErrNotHeld
	}
	if err != nil {
		return driver.Info{}, wrap("inspect", key, err)
	}
	if len(v) != 5 && len(v) != 6 {
		return driver.Info{}, wrap("inspect", key, fmt.Errorf("unexpected reply %v", v))
	}
	owner, _ := v[0].(string)
	pttl, _ := v[1].(int64)
	tokStr, _ := v[2].(string)
	tok, _ := strconv.ParseUint(tokStr, 10, 64)
	live, _ := v[3].(int64)
	info := driver.Info{Key: key, Owner: owner, Token: tok, TTL: time.Duration(max(pttl, 0)) * time.Millisecond, Waiters: int(live)}
	if val, ok := v[4].(string); ok && val != "" {
		info.Value = []byte(val)
	}
	if len(v) == 6 {
		shared, _ := v[5].(int64)
		info.Shared = shared == 1
	}
	return info, nil
}

// SetValue implements driver.Valuer: one script compares the owner, replaces the
// value (with the lock key's expiry) and publishes on the holder channel. With
// WithReplicas it waits for the replicas as Refresh does.
func (b *Backend) SetValue(ctx context.Context, key, owner string, value []byte) error {
	args := []any{owner}
	if len(value) > 0 {
		args = append(args, value)
	}
	cmd, err := b.runScript(ctx, setValueScript, b.keys(key), args...)
	if n, cerr := cmd.Int64(); cerr == nil && n == 0 {
		return wrap("set value", key, driver.ErrNotHeld)
	}
	if err != nil {
		return wrap("set value", key, err)
	}
	return nil
}
