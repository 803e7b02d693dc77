package redislock

import (
	"context"
	"fmt"
	"strconv"
	"strings"

	"github.com/redis/go-redis/v9"

	"github.com/dlockio/dlock/driver"
)

// semAcquire is acquire for a semaphore (req.Limit > 1) or a shared grant:
// sem_acquire.lua, with the limit ("r" for shared) and the prefix always sent,
// and the queue argument when queue.
func (b *Backend) semAcquire(ctx context.Context, req driver.Request, keys []string, ttl int64, queue bool, w *waiter) (driver.Grant, error) {
	var limit any = req.Limit
	if req.Shared {
		limit = "r"
	}
	args := make([]any, 6, 7)
	args[0], args[1], args[2], args[3], args[4], args[5] = req.Owner, b.ttlBox(ttl), limit, b.prefix, "", ""
	if queue {
		args[4] = b.waitArg(req, w)
	}
	if !req.Reenter {
		args[5] = noReenter
	}
	if len(req.Value) > 0 {
		args = append(args, req.Value)
	}
	cmd, err := b.runScript(ctx, semAcquireScript, keys, args...)
	return b.acquired(ctx, req, keys, queue, w, cmd, err)
}

// limitReply reports the key's limit from an acquire script's reply "limit N".
func limitReply(cmd *redis.Cmd) (int, bool) {
	s, ok := cmd.Val().(string)
	if !ok {
		return 0, false
	}
	n, ok := strings.CutPrefix(s, "limit ")
	if !ok {
		return 0, false
	}
	have, err := strconv.Atoi(n)
	return have, err == nil
}

// limitMismatch is the error of an attempt whose limit is not the key's.
func limitMismatch(req driver.Request, have int) error {
	return fmt.Errorf("redislock: acquire %q: %w: the key has limit %d, the request %d", req.Key, driver.ErrLimitMismatch, have, max(req.Limit, 1))
}

// Holders implements driver.Semaphorer: one script reads every live holder,
// oldest grant first (a mutex's one holder with limit 1; a read-write lock's
// holders with limit 1, readers with Info.Shared).
func (b *Backend) Holders(ctx context.Context, key string) (int, []driver.Info, error) {
	v, err := holdersScript.Run(ctx, b.rdb, b.keys(key), b.prefix).Slice()
	if err != nil {
		return 0, nil, wrap("holders", key, err)
	}
	return decodeHolders(key, v)
}

// Shares implements driver.Sharer: read-write locks keep their holders in the
// semaphore's hash with limit 1 (see Read-write locks in the package
// documentation).
func (b *Backend) Shares() bool { return true }
