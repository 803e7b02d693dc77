//go:build !linux

package bench

import (
	"fmt"
	"runtime"

	"github.com/dlockio/dlock/driver"
)

// Pin restricts the process to the given CPUs; only Linux is supported.
func Pin(cpus []int) error {
	return fmt.Errorf("%w: pinning to CPUs needs Linux (sched_setaffinity)", driver.ErrUnsupported)
}

// Affinity returns every CPU: other systems are not asked.
func Affinity() ([]int, error) {
	cpus := make([]int, runtime.NumCPU())
	for i := range cpus {
		cpus[i] = i
	}
	return cpus, nil
}
