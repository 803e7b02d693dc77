package redislock

import (
	"context"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/dlockio/dlock/driver"
)

var _ driver.Lister = (*Backend)(nil)

// listScanCount is the COUNT hint of each SCAN call of List: how many keys of the
// database the server looks at per call.
const listScanCount = 1000

// listBatch is how many lock keys List reads per pipelined round trip.
const listBatch = 256

// List implements driver.Lister. SCAN walks the database's lock keys under
// the prefix (MATCH with the lock key of prefix, its glob characters escaped,
// followed by "*"), leaving out the token and value keys beside them; the
// holders of each key are then read by holders.lua, as Holders reads them, in
// pipelines of a few hundred keys. SCAN sees every key that exists throughout
// the walk; a key granted or released meanwhile may or may not be listed. The
// reads are not one snapshot: each key's holders are as of its own read.
func (b *Backend) List(ctx context.Context, prefix string) ([]driver.Info, error) {
	if b.closed.Load() {
		return nil, driver.ErrClosed
	}
	base := lockKey(b.prefix, "")
	match := globEscape(base+prefix) + "*"
	seen := map[string]struct{}{}
	var keys []string
	var cursor uint64
	for {
		ks, next, err := b.rdb.Scan(ctx, cursor, match, listScanCount).Result()
		if err != nil {
			return nil, wrap("list", prefix, err)
		}
		for _, k := range ks {
			key := k[len(base):]
			// A token or value key: the lock key and a 0x1f suffix (no lock
			// name holds a control byte).
			if strings.Contains(key, ownerSep) {
				continue
			}
			if _, ok := seen[key]; !ok { // SCAN may return a key twice
				seen[key] = struct{}{}
				keys = append(keys, key)
			}
		}
		if cursor = next; cursor == 0 {
			break
		}
	}
	slices.Sort(keys)
	var infos []driver.Info
	for batch := range slices.Chunk(keys, listBatch) {
		replies, err := b.holdersOf(ctx, batch)
		if err != nil {
			return nil, err
		}
		for i, v := range replies {
			_, hs, err := decodeHolders(batch[i], v)
			if err != nil {
				return nil, err
			}
			infos = append(infos, hs...)
		}
	}
	return infos, nil
}

// holdersOf runs holders.lua on each of keys in one pipeline and returns the
// replies in order. It sends the scripts by hash, and once more with their
// source if the server's script cache lacks it.
func (b *Backend) holdersOf(ctx context.Context, keys []string) ([][]any, error) {
	for attempt := 0; ; attempt++ {
		cmds := make([]*redis.Cmd, len(keys))
		_, err := b.rdb.Pipelined(ctx, func(p redis.Pipeliner) error {
			for i, k := range keys {
				if attempt == 0 {
					cmds[i] = holdersScript.EvalSha(ctx, p, b.keys(k), b.prefix)
				} else {
					cmds[i] = holdersScript.Eval(ctx, p, b.keys(k), b.prefix)
				}
			}
			return nil
		})
		if err != nil && attempt == 0 && redis.HasErrorPrefix(err, "NOSCRIPT") {
			continue // the script cache was flushed: send the source once
		}
		replies := make([][]any, len(keys))
		for i, c := range cmds {
			v, err := c.Slice()
			if err != nil {
				return nil, wrap("list", keys[i], err)
			}
			replies[i] = v
		}
		return replies, nil
	}
}

// decodeHolders decodes a reply of holders.lua for key: the limit and the live
// holders, oldest grant first (limit 0 and none when nobody holds key).
func decodeHolders(key string, v []any) (int, []driver.Info, error) {
	if len(v) < 2 || (len(v)-2)%5 != 0 {
		return 0, nil, wrap("holders", key, fmt.Errorf("unexpected reply %v", v))
	}
	limit, _ := v[0].(int64)
	waiters, _ := v[1].(int64)
	var hs []driver.Info
	for r := v[2:]; len(r) >= 5; r = r[5:] {
		owner, _ := r[0].(string)
		pttl, _ := r[1].(int64)
		tokStr, _ := r[2].(string)
		tok, _ := strconv.ParseUint(tokStr, 10, 64)
		info := driver.Info{Key: key, Owner: owner, Token: tok, TTL: time.Duration(max(pttl, 0)) * time.Millisecond, Waiters: int(waiters)}
		if val, ok := r[3].(string); ok && val != "" {
			info.Value = []byte(val)
		}
		shared, _ := r[4].(int64)
		info.Shared = shared == 1
		hs = append(hs, info)
	}
	if len(hs) == 0 {
		return 0, nil, nil
	}
	return int(limit), hs, nil
}

// globEscape escapes the characters of s that a Redis glob pattern (SCAN MATCH)
// treats specially, so that the pattern matches s literally.
func globEscape(s string) string {
	var out strings.Builder
	for _, c := range []byte(s) {
		switch c {
		case '\\', '*', '?', '[', ']':
			out.WriteByte('\\')
		}
		out.WriteByte(c)
	}
	return out.String()
}
