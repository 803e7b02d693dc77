// Package redisops registers the storeops stores of the redis, rediss, unix and
// redlock schemes: a go-redis client (one per node for Redlock), the floor (SET NX PX
// and a compare-and-delete script) and the INFO commandstats count.
package redisops

import (
	"context"
	"fmt"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/dlockio/dlock/driver"
	"github.com/dlockio/dlock/internal/storeops"
)

func init() {
	for _, s := range []string{"redis", "rediss", "unix"} {
		storeops.Register(s, openRedis)
	}
}

// redisStore is a go-redis client on the server a redis://, rediss:// or unix://
// URL names.
type redisStore struct {
	rdb *redis.Client
}

// openRedis connects to the server of u: its host (or socket), credentials,
// database (path or db=) and TLS parameters (driver.ReadTLS; on for rediss://,
// with skip_verify honoured); other parameters are ignored.
func openRedis(ctx context.Context, u *url.URL) (storeops.Store, error) {
	p, err := driver.ParseParams(u)
	if err != nil {
		return nil, fmt.Errorf("storeops: %w", err)
	}
	c := *u
	c.RawQuery = ""
	if db, _ := p.String("db", ""); db != "" {
		c.RawQuery = url.Values{"db": {db}}.Encode()
	}
	opt, err := redis.ParseURL(c.String())
	if err != nil {
		return nil, fmt.Errorf("storeops: %w", err)
	}
	cfg, err := driver.ReadTLS(p)
	if err != nil {
		return nil, fmt.Errorf("storeops: %w", err)
	}
	if cfg == nil && u.Scheme == "rediss" {
		cfg, _ = driver.TLSConfig(nil) // nothing to read: cannot fail
	}
	if cfg != nil {
		if cfg.ServerName == "" {
			cfg.ServerName = u.Hostname()
		}
		cfg.InsecureSkipVerify, _ = p.Bool("skip_verify", false)
		opt.TLSConfig = cfg
	}
	opt.ContextTimeoutEnabled = true
	s := &redisStore{rdb: redis.NewClient(opt)}
	if err := s.rdb.Ping(ctx).Err(); err != nil {
		s.rdb.Close()
		return nil, fmt.Errorf("storeops: connect to %s: %w", driver.Redact(u), err)
	}
	return s, nil
}

// floorCAD deletes KEYS[1] if it holds ARGV[1] (compare and delete); it returns the
// number of keys deleted.
var floorCAD = redis.NewScript(`if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end return 0`)

// floorTTL bounds a floor lock whose release never came.
const floorTTL = 15 * time.Second

// FloorCycle implements Store: the least correct Redis lock (redisFloor).
func (s *redisStore) FloorCycle(ctx context.Context, key string) error {
	return redisFloor(ctx, s.rdb, key)
}

// redisFloor is the least correct Redis lock, on rdb: SET key value NX PX with a
// fresh random value (every acquisition needs its own, or a stale release could
// delete a later grant), then the compare-and-delete script.
func redisFloor(ctx context.Context, rdb *redis.Client, key string) error {
	v := driver.RandomHex(16)
	ok, err := rdb.SetNX(ctx, key, v, floorTTL).Result()
	if err != nil {
		return err
	}
	if !ok {
		return fmt.Errorf("storeops: floor key %q held", key)
	}
	return floorCAD.Run(ctx, rdb, []string{key}, v).Err()
}

// Ops implements Store: redisCalls.
func (s *redisStore) Ops(ctx context.Context) (int64, error) { return redisCalls(ctx, s.rdb) }

// redisCalls returns the sum of the calls in one server's INFO commandstats, which
// counts the commands run inside scripts as well, less the INFO calls (the
// counter's own reads, and anyone else's).
func redisCalls(ctx context.Context, rdb *redis.Client) (int64, error) {
	text, err := rdb.Info(ctx, "commandstats").Result()
	if err != nil {
		return 0, err
	}
	var total int64
	for line := range strings.SplitSeq(text, "\n") {
		// cmdstat_get:calls=3,usec=12,...
		name, rest, ok := strings.Cut(line, ":calls=")
		if !ok || name == "cmdstat_info" {
			continue
		}
		calls, _, _ := strings.Cut(rest, ",")
		n, err := strconv.ParseInt(calls, 10, 64)
		if err != nil {
			return 0, fmt.Errorf("storeops: INFO commandstats line %q", line)
		}
		total += n
	}
	return total, nil
}

// OpsSource implements Store.
func (s *redisStore) OpsSource() string { return "Redis INFO commandstats calls, less INFO" }

// Close implements Store.
func (s *redisStore) Close() error { return s.rdb.Close() }
