package redislock

import (
	"embed"
	"fmt"
	"strings"

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

var (
	acquireScript      = loadScript("acquire.lua")
	acquireAllScript   = loadScript("acquire_all.lua")
	refreshScript      = loadScript("refresh.lua")
	releaseScript      = loadScript("release.lua")
	withdrawScript     = loadScript("withdraw.lua")
	forceReleaseScript = loadScript("force_release.lua")
	inspectScript      = loadScript("inspect.lua")
	setValueScript     = loadScript("set_value.lua")
)

func loadScript(name string) *redis.Script { return redis.NewScript(scriptSource(name)) }

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
