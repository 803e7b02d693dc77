package redislock_test

import (
	"errors"
	"strings"
	"testing"

	"github.com/dlockio/dlock/driver"
	"github.com/dlockio/dlock/redislock"
)

func TestCheckVersion(t *testing.T) {
	for v, ok := range map[string]bool{
		"7.0.0": true, "7.0.15": true, "7.2.4": true, "8.0.1": true, "10.1.0": true,
		"": true, "unknown": true, // not said: the first script tells
		"6.2.14": false, "6.0.6": false, "5.0.7": false,
	} {
		err := redislock.CheckVersion(v)
		if (err == nil) != ok {
			t.Errorf("CheckVersion(%q) = %v, want ok %v", v, err, ok)
		}
		if err != nil && (!errors.Is(err, driver.ErrUnsupported) || !strings.Contains(err.Error(), v) || strings.Contains(err.Error(), "\n")) {
			t.Errorf("CheckVersion(%q) = %q: want one line naming the version, matching ErrUnsupported", v, err)
		}
	}
}
