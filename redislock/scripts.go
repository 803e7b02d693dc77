package redislock

import (
	"embed"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"
)

// The Lua scripts, one file each under scripts/, each starting with a header that
// names its KEYS, ARGV and reply. A line "--#include NAME.lua" stands for that file
// (names.lua: the key name parts; token.lua: issuing a fencing token; grant.lua: the
// rest of a new grant after the SET of its lock key, for acquire.lua and
// acquire_all.lua; sem.lua: the semaphore helpers; handoff.lua: handing a freed
// lock to the next waiter), inserted where the line is, so that a script defines
// the helpers only on the paths that use them: a Lua function statement makes a
// closure each time a script runs it.
//
//go:embed scripts/*.lua
var scriptFiles embed.FS

// TokenRetention is how long a lock's token counter outlives the lease of its last
// grant (see Bounded state in the package documentation): RETAIN in
// scripts/names.lua.
const TokenRetention = 5 * time.Minute

// The scripts, loaded by loadScripts.
var (
	acquireScript      *redis.Script
	acquireAllScript   *redis.Script
	refreshScript      *redis.Script
	releaseScript      *redis.Script
	withdrawScript     *redis.Script
	forceReleaseScript *redis.Script
	inspectScript      *redis.Script
	setValueScript     *redis.Script
	queueScript        *redis.Script
	semAcquireScript   *redis.Script
	holdersScript      *redis.Script
)

func init() { loadScripts(TokenRetention) }

// loadScripts sets the script variables, with RETAIN (names.lua) set to retain.
// Only init, and tests that shorten the retention while no other test runs, call
// it: the variables are read without synchronisation.
func loadScripts(retain time.Duration) {
	load := func(name string) *redis.Script {
		src := scriptSource(name)
		if retain != TokenRetention {
			if !strings.Contains(src, retainLine(TokenRetention)) {
				panic("redislock: script " + name + " does not set RETAIN to TokenRetention")
			}
			src = strings.Replace(src, retainLine(TokenRetention), retainLine(retain), 1)
		}
		return redis.NewScript(src)
	}
	acquireScript = load("acquire.lua")
	acquireAllScript = load("acquire_all.lua")
	refreshScript = load("refresh.lua")
	releaseScript = load("release.lua")
	withdrawScript = load("withdraw.lua")
	forceReleaseScript = load("force_release.lua")
	inspectScript = load("inspect.lua")
	setValueScript = load("set_value.lua")
	queueScript = load("queue.lua")
	semAcquireScript = load("sem_acquire.lua")
	holdersScript = load("holders.lua")
}

// retainLine is the line of names.lua that sets RETAIN to d.
func retainLine(d time.Duration) string {
	return "local RETAIN = " + strconv.FormatInt(d.Milliseconds(), 10) + "\n"
}

// includeLine starts a line that scriptSource replaces by the file it names.
const includeLine = "--#include "

// scriptSource returns the source of the embedded script name with its includes
// expanded. It panics on a missing file: the scripts are part of the program.
func scriptSource(name string) string {
	b, err := scriptFiles.ReadFile("scripts/" + name)
	if err != nil {
		panic(fmt.Sprintf("redislock: script %s: %v", name, err))
	}
	var out strings.Builder
	for line := range strings.Lines(string(b)) {
		if inc, ok := strings.CutPrefix(line, includeLine); ok {
			out.WriteString(scriptSource(strings.TrimSpace(inc)))
			continue
		}
		out.WriteString(line)
	}
	return out.String()
}
