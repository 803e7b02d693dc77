package memlock_test

import (
	"testing"

	"github.com/dlockio/dlock/driver"
	"github.com/dlockio/dlock/drivertest"
)

// keyByKey is memlock without the atomic multi-key step (driver.MultiAcquirer), so
// the core takes a set one key at a time, as on a backend that has none.
type keyByKey struct {
	driver.Backend
	driver.Notifier
	driver.Inspector
	driver.ForceReleaser
	driver.Valuer
	driver.HolderWatcher
	driver.Semaphorer
	driver.Sharer
}

// TestConformanceKeyByKey runs the suite, its multi-key sections above all, on the
// core's key-by-key path.
func TestConformanceKeyByKey(t *testing.T) {
	h := harness()
	open := h.Open
	h.Open = func(t testing.TB) driver.Backend {
		b := open(t).(interface {
			driver.Backend
			driver.Notifier
			driver.Inspector
			driver.ForceReleaser
			driver.Valuer
			driver.HolderWatcher
			driver.Semaphorer
			driver.Sharer
		})
		return keyByKey{b, b, b, b, b, b, b, b}
	}
	drivertest.Run(t, h)
}
