package memlock_test

import (
	"testing"

	"go.uber.org/goleak"

	"github.com/dlockio/dlock/clock"
	"github.com/dlockio/dlock/driver"
	"github.com/dlockio/dlock/drivertest"
	"github.com/dlockio/dlock/memlock"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func harness() drivertest.Harness {
	s := memlock.NewStore(clock.Real)
	return drivertest.Harness{
		Open:    func(testing.TB) driver.Backend { return s.Backend() },
		Expire:  func(_ testing.TB, key string) { s.Expire(key) },
		Fencing: true,
		FIFO:    true,
	}
}

func TestConformance(t *testing.T) { drivertest.Run(t, harness()) }

func BenchmarkCycle(b *testing.B)   { drivertest.BenchCycle(b, harness()) }
func BenchmarkHandoff(b *testing.B) { drivertest.BenchHandoff(b, harness()) }
func BenchmarkContended(b *testing.B) {
	for _, w := range []int{2, 16} {
		drivertest.BenchContended(b, harness(), w)
	}
}
