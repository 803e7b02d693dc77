// Package redisfence is dlock's fencing guard for Redis, on go-redis v9: one Lua
// script compares the resource's fence with the caller's token and, if the token
// passes, runs the caller's write commands, all in one atomic step and one round
// trip.
//
// # Guarantees
//
//   - The commands given to Exec run only if the fence key holds no token higher
//     than the caller's; then the fence key holds the caller's token. Redis runs a
//     script alone, so nothing can fall between the comparison and the writes.
//     Equal tokens pass.
//   - The comparison is exact for every uint64: tokens are stored as 20 decimal
//     digits and compared as two 10-digit halves, each exact in a Lua double.
//   - Every key the commands touch is declared to Redis (KEYS), so the script is
//     correct on Redis Cluster when all of them share a hash slot (use a hash tag,
//     "{order:42}:fence" and "{order:42}:data"); Cluster refuses the call otherwise.
//
// # Not promised
//
//   - Redis does not roll back: a command that fails at run time (a WRONGTYPE, for
//     example) ends the script, and the commands before it stay applied (and the
//     fence holds the token). Put commands that may fail first, or check types
//     before.
//   - The fence is only as durable as the Redis it lives in: a failover to a replica
//     that missed the last writes, or a restart without fsync, can lose the fence
//     together with the data it guards (then both go back consistently, but a stale
//     holder may write again once). Use WAIT or appendfsync always where that
//     matters.
//   - A key passed as a plain value instead of Key is not declared: the script still
//     runs it, but Cluster cannot route it and the keyspace rules are bypassed. Pass
//     every key as Key.
package redisfence

import (
	"context"
	_ "embed"
	"fmt"
	"regexp"
	"slices"
	"strconv"
	"strings"

	"github.com/redis/go-redis/v9"

	"github.com/dlockio/dlock/fence"
)

const guardName = "redisfence"

//go:embed fence.lua
var fenceLua string

var script = redis.NewScript(fenceLua)

// Key marks a command argument as a key name, declared to Redis in KEYS.
type Key string

// Cmd is one write command run by the script after the fence check.
type Cmd struct {
	name string
	args []any
}

// Command returns a command for Exec: its name and arguments, keys given as Key,
// other arguments as strings, []byte, integers, floats or booleans (as go-redis
// sends them).
func Command(name string, args ...any) Cmd { return Cmd{name: name, args: args} }

var nameRE = regexp.MustCompile(`^[A-Za-z][A-Za-z0-9_.|-]*$`)

// Exec runs cmds atomically if fenceKey holds no token higher than token, and
// returns their replies, one per command. Otherwise it writes nothing and returns a
// *fence.StaleError (matching fence.ErrStale) with the fence's token. Token 0 is
// refused with fence.ErrNoToken; a bad fence key or command with an error matching
// fence.ErrInvalid.
func Exec(ctx context.Context, rdb redis.Scripter, fenceKey string, token uint64, cmds ...Cmd) ([]any, error) {
	if err := fence.CheckToken(token); err != nil {
		return nil, err
	}
	if err := fence.CheckResource(guardName, fenceKey); err != nil {
		return nil, err
	}
	keys := []string{fenceKey}
	argv := []any{fence.Encode(token)}
	for _, c := range cmds {
		if !nameRE.MatchString(c.name) {
			return nil, fence.Invalid(guardName, "command name %q", c.name)
		}
		mask := make([]byte, len(c.args))
		vals := make([]any, len(c.args))
		for j, a := range c.args {
			k, isKey := a.(Key)
			if !isKey {
				mask[j], vals[j] = 'v', a
				continue
			}
			if string(k) == fenceKey {
				return nil, fence.Invalid(guardName, "%s writes the fence key %q itself", c.name, fenceKey)
			}
			if k == "" {
				return nil, fence.Invalid(guardName, "%s: empty key", c.name)
			}
			n := slices.Index(keys, string(k)) + 1 // KEYS counts from 1
			if n == 0 {
				keys = append(keys, string(k))
				n = len(keys)
			}
			mask[j], vals[j] = 'k', n
		}
		argv = append(argv, string(mask), c.name)
		argv = append(argv, vals...)
	}
	res, err := script.Run(ctx, rdb, keys, argv...).Slice()
	if err == nil {
		return res, nil
	}
	msg := err.Error()
	if cur, stale := strings.CutPrefix(msg, "DLOCKSTALE "); stale {
		n, perr := strconv.ParseUint(cur, 10, 64)
		if perr != nil {
			return nil, fmt.Errorf("dlock: fence: %s: unexpected stored token %q", guardName, cur)
		}
		return nil, &fence.StaleError{Resource: fenceKey, Token: token, Current: n}
	}
	if strings.Contains(msg, "dlock fence:") {
		return nil, fmt.Errorf("dlock: fence: %s: %w", guardName, err)
	}
	return nil, err
}
