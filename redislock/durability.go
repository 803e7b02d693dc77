package redislock

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"

	"github.com/redis/go-redis/v9"
)

// ErrNotReplicated means a write was not acknowledged by the required number of
// replicas within the replica timeout. An acquire that fails this way is released
// again before the error is returned (fail closed).
var ErrNotReplicated = errors.New("redislock: write not acknowledged by enough replicas")

// ErrNotDurable is returned by Verify in strict mode when the server would lose
// grants in a crash: it does not append every write to its AOF and fsync it
// (appendonly yes, appendfsync always).
var ErrNotDurable = errors.New("redislock: server does not persist every write (needs appendonly yes and appendfsync always)")

// ErrEvicts is returned by Verify for a server that may evict keys under memory
// pressure (maxmemory set, maxmemory-policy other than noeviction), unless
// WithAllowEviction: the lock keys carry a TTL, so even volatile-* policies may drop
// a held lock and let a second holder in, and a token counter evicted within the
// millisecond of its last grants may let a token repeat.
var ErrEvicts = errors.New("redislock: server may evict lock keys (needs maxmemory 0 or maxmemory-policy noeviction)")

// Persistence describes how the server keeps data across a restart, and whether
// it may drop keys before they expire.
type Persistence struct {
	// Known is false when the server refused to tell (CONFIG and INFO disabled).
	Known bool
	// AppendOnly is the appendonly setting: every write goes to the AOF.
	AppendOnly bool
	// AppendFsync is the appendfsync setting: "always", "everysec" or "no".
	AppendFsync string
	// Version is the server's redis_version.
	Version string
	// MaxMemory is the maxmemory setting in bytes (0: no limit), and
	// EvictionPolicy the maxmemory-policy ("" when INFO did not tell).
	MaxMemory      int64
	EvictionPolicy string
}

// Evicts reports whether the server may evict keys before they expire: a memory
// limit with a policy other than noeviction.
func (p Persistence) Evicts() bool {
	return p.MaxMemory > 0 && p.EvictionPolicy != "" && p.EvictionPolicy != "noeviction"
}

// Durable reports whether every acknowledged write survives a crash of the server
// process and of its machine: AOF on, fsync on every write.
func (p Persistence) Durable() bool {
	return p.Known && p.AppendOnly && p.AppendFsync == "always"
}

// String shows the settings, as "appendonly=true appendfsync=always".
func (p Persistence) String() string {
	if !p.Known {
		return "unknown (CONFIG and INFO refused)"
	}
	s := fmt.Sprintf("appendonly=%v appendfsync=%s", p.AppendOnly, p.AppendFsync)
	if p.EvictionPolicy != "" {
		s += fmt.Sprintf(" maxmemory=%d maxmemory-policy=%s", p.MaxMemory, p.EvictionPolicy)
	}
	return s
}

// Persistence returns what Verify found (zero until Verify ran).
func (b *Backend) Persistence() Persistence {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.persistence
}

// Verify reads the server's version, persistence and eviction settings, logs
// them, returns an error matching driver.ErrUnsupported for a server older than
// Redis 7.0, ErrEvicts for a server that may evict keys (unless WithAllowEviction),
// and in strict mode ErrNotDurable if the server could lose a grant in a crash.
// Open calls it; call it yourself after New.
func (b *Backend) Verify(ctx context.Context) error {
	p, err := b.readPersistence(ctx)
	if err != nil {
		return fmt.Errorf("redislock: read persistence settings: %w", err)
	}
	if err := checkVersion(p.Version); err != nil {
		return err
	}
	b.mu.Lock()
	b.persistence = p
	b.mu.Unlock()
	b.logger.Info("redislock: server persistence", "settings", p.String(), "durable", p.Durable(), "version", p.Version)
	if p.Evicts() {
		if !b.allowEviction {
			return fmt.Errorf("%w: server has maxmemory %d with maxmemory-policy %s; set maxmemory-policy noeviction, or accept the risk with allow_eviction=true (WithAllowEviction)",
				ErrEvicts, p.MaxMemory, p.EvictionPolicy)
		}
		b.logger.Warn("redislock: the server may evict lock keys under memory pressure; only fencing tokens protect against a second holder then", "settings", p.String())
	}
	if !p.Durable() {
		b.logger.Warn("redislock: a crash of this server can lose grants; only fencing tokens protect against a second holder then", "settings", p.String())
		if b.strict {
			return fmt.Errorf("%w: server has %s", ErrNotDurable, p)
		}
	}
	return nil
}

func readPersistence(ctx context.Context, rdb redis.UniversalClient) (Persistence, error) {
	info, err := rdb.Info(ctx, "server", "persistence", "memory").Result()
	if err != nil {
		if ctx.Err() != nil {
			return Persistence{}, err
		}
		info = ""
	}
	fields := map[string]string{}
	for line := range strings.SplitSeq(info, "\n") {
		if k, v, ok := strings.Cut(strings.TrimSpace(line), ":"); ok {
			fields[k] = v
		}
	}
	p := Persistence{Version: fields["redis_version"], EvictionPolicy: fields["maxmemory_policy"]}
	p.MaxMemory, _ = strconv.ParseInt(fields["maxmemory"], 10, 64)
	if cfg, err := rdb.ConfigGet(ctx, "append*").Result(); err == nil && cfg["appendonly"] != "" {
		p.Known = true
		p.AppendOnly = cfg["appendonly"] == "yes"
		p.AppendFsync = cfg["appendfsync"]
		return p, nil
	}
	if v, ok := fields["aof_enabled"]; ok {
		// CONFIG is disabled (managed services): INFO tells whether AOF is on, not
		// the fsync policy, which must then count as unknown.
		p.Known = true
		p.AppendOnly = v == "1"
		p.AppendFsync = "unknown"
	}
	return p, nil
}

// runScript runs a write script and, with WithReplicas, WAIT on the same
// connection in the same round trip (in a cluster: on the master of the keys'
// slot, again after a redirection). It returns the script's reply and whether the
// replicas acknowledged.
func (b *Backend) runScript(ctx context.Context, s *redis.Script, keys []string, args ...any) (*redis.Cmd, error) {
	if b.replicas == 0 {
		cmd := s.Run(ctx, b.rdb, keys, args...)
		return cmd, cmd.Err()
	}
	for attempt := 0; ; attempt++ {
		var cmd *redis.Cmd
		var wait *redis.Cmd
		node, err := b.scriptNode(ctx, keys[0])
		if err != nil {
			cmd = redis.NewCmd(ctx)
			cmd.SetErr(err)
			return cmd, err
		}
		_, err = node.Pipelined(ctx, func(p redis.Pipeliner) error {
			if attempt == 0 {
				cmd = s.EvalSha(ctx, p, keys, args...)
			} else {
				cmd = s.Eval(ctx, p, keys, args...)
			}
			if b.waitAOF() {
				wait = p.Do(ctx, "WAITAOF", 1, b.replicas, b.replicaTimeout.Milliseconds())
			} else {
				wait = p.Do(ctx, "WAIT", b.replicas, b.replicaTimeout.Milliseconds())
			}
			return nil
		})
		if err != nil && attempt == 0 && redis.HasErrorPrefix(cmd.Err(), "NOSCRIPT") {
			continue // the script cache was flushed: send the source once
		}
		if b.redirected(ctx, cmd.Err(), attempt) {
			continue // the slot moved: the script did not run
		}
		if cmd.Err() != nil {
			return cmd, cmd.Err()
		}
		if err := wait.Err(); err != nil {
			return cmd, fmt.Errorf("WAIT: %w", err)
		}
		if acked := ackedReplicas(wait); acked < int64(b.replicas) {
			return cmd, fmt.Errorf("%w: %d of %d within %v", ErrNotReplicated, acked, b.replicas, b.replicaTimeout)
		}
		return cmd, nil
	}
}

// waitAOF reports whether to use WAITAOF (Redis 7.2 and later, with the AOF on):
// then an acknowledgement means the write is fsynced on the master and on each
// acknowledging replica, which needs appendonly on the replicas too.
func (b *Backend) waitAOF() bool {
	p := b.Persistence()
	if !p.AppendOnly {
		return false
	}
	var major, minor int
	if _, err := fmt.Sscanf(p.Version, "%d.%d", &major, &minor); err != nil {
		return false
	}
	return major > 7 || major == 7 && minor >= 2
}

// ackedReplicas reads the reply of WAIT (an integer) or WAITAOF (local, replicas).
func ackedReplicas(c *redis.Cmd) int64 {
	if n, err := c.Int64(); err == nil {
		return n
	}
	if s, err := c.Int64Slice(); err == nil && len(s) == 2 {
		if s[0] < 1 {
			return 0 // not fsynced locally
		}
		return s[1]
	}
	return 0
}
