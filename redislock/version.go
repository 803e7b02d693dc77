package redislock

import (
	"fmt"

	"github.com/dlockio/dlock/driver"
)

// The oldest server the scripts run on: Redis 7.0, which added PEXPIRETIME (the
// scripts read the server clock with it); also GETDEL (6.2) and LPOS (6.0.6).
// Valkey reports redis_version 7.2.4 for compatibility, and every Valkey release
// has these commands. docs/redis.md lists every command the backend sends.
const minMajor, minMinor = 7, 0

// checkVersion returns an error matching driver.ErrUnsupported if version (INFO's
// redis_version) is older than the scripts need; nil if it is new enough or does
// not parse (a server that does not say is given the benefit of the doubt, and
// its first script fails if it is too old).
func checkVersion(version string) error {
	var major, minor int
	if _, err := fmt.Sscanf(version, "%d.%d", &major, &minor); err != nil {
		return nil
	}
	if major < minMajor || major == minMajor && minor < minMinor {
		return fmt.Errorf("redislock: %w: the server is Redis %s; dlock needs Redis %d.%d or later (or Valkey)",
			driver.ErrUnsupported, version, minMajor, minMinor)
	}
	return nil
}
