package redislock

import (
	"context"
	"fmt"
	"time"

	"github.com/dlockio/dlock/driver"
)

var _ driver.Queuer = (*Backend)(nil)

// Queue implements driver.Queuer: one read-only script lists the key's queue,
// oldest place first, skipping the places whose waiter key expired (as the
// scripts that hand the key over skip them); a place already handed a grant has
// left the queue and is a holder. TTL is what is left of the place's patience.
func (b *Backend) Queue(ctx context.Context, key string) ([]driver.Info, error) {
	if b.closed.Load() {
		return nil, driver.ErrClosed
	}
	v, err := queueScript.Run(ctx, b.rdb, b.keys(key), b.prefix).Slice()
	if err != nil {
		return nil, wrap("queue", key, err)
	}
	if len(v)%4 != 0 {
		return nil, wrap("queue", key, fmt.Errorf("unexpected reply %v", v))
	}
	places := make([]driver.Info, 0, len(v)/4)
	for r := v; len(r) >= 4; r = r[4:] {
		owner, _ := r[0].(string)
		pttl, _ := r[1].(int64)
		shared, _ := r[2].(int64)
		p := driver.Info{Key: key, Owner: owner, TTL: time.Duration(max(pttl, 0)) * time.Millisecond, Waiters: -1, Shared: shared == 1}
		if val, ok := r[3].(string); ok && val != "" {
			p.Value = []byte(val)
		}
		places = append(places, p)
	}
	return places, nil
}
