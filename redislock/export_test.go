package redislock

import (
	"testing"
	"time"
)

// SetTokenRetention makes the scripts keep a token counter d past its last
// lease, until the test ends. The test must not run in parallel with others.
func SetTokenRetention(t testing.TB, d time.Duration) {
	loadScripts(d)
	t.Cleanup(func() { loadScripts(TokenRetention) })
}
