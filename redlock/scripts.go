package redlock

import (
	"embed"
	"strings"

	"github.com/redis/go-redis/v9"
)

// The scripts live in scripts/*.lua, each opening with a header that names its KEYS,
// ARGV and reply. lib.lua (fence, parts, holder, join) and wake.lua (wake) hold
// helpers joined in front of the scripts that use them.
//
//go:embed scripts/*.lua
var scriptFiles embed.FS

// script joins the named files of scripts/ into one script.
func script(names ...string) *redis.Script {
	var b strings.Builder
	for _, name := range names {
		src, err := scriptFiles.ReadFile("scripts/" + name + ".lua")
		if err != nil {
			panic("redlock: missing embedded script " + name) // a build error, in effect
		}
		b.Write(src)
		b.WriteByte('\n')
	}
	return redis.NewScript(b.String())
}

var (
	acquireScript      = script("lib", "acquire")
	commitScript       = script("lib", "commit")
	refreshScript      = script("lib", "refresh")
	releaseScript      = script("lib", "wake", "release")
	forceReleaseScript = script("lib", "wake", "force_release")
	withdrawScript     = script("lib", "wake", "withdraw")
	inspectScript      = script("lib", "inspect")
	setValueScript     = script("lib", "set_value")
)

// The replies and flags of the scripts, as their headers name them.
const (
	// acquire.lua's status, the first element of its reply.
	statusHeld    = 0
	statusFresh   = 1
	statusReentry = 2

	// acquire.lua's wait argument.
	waitNo       = "0" // not waiting
	waitRecord   = "1" // record the owner as a waiter if the key is held
	waitRecorded = "2" // the same; an earlier attempt may have recorded it

	// commit.lua's reply, besides a counter that rejects the token.
	commitAccepted = 0
	commitLost     = -1

	// refresh.lua's restore argument and replies.
	refreshOnly     = 0 // leave an absent key absent
	refreshRestore  = 1 // re-create an absent key for the owner
	refreshExtended = 1
	refreshAbsent   = -1

	// release.lua's wake argument.
	wakeNone    = "0" // neither hand the lock over nor wake a waiter
	wakeHandOff = "1" // hand the lock to the first writer, or wake the readers
	wakeOnly    = "2" // wake the first waiter (or readers), hand nothing over

	// release.lua's reply when no waiter was woken, and force_release.lua's.
	released = 1
	deleted  = 1

	// set_value.lua's reply when the owner holds the lock.
	valueSet = 1
)
