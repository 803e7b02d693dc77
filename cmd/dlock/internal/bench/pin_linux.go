package bench

import (
	"fmt"
	"os"
	"runtime"
	"strconv"

	"golang.org/x/sys/unix"

	"github.com/dlockio/dlock/driver"
)

// Pin restricts the whole process to the given CPUs, as taskset -a -c would: every
// thread it has now, and so every thread and child process it starts later, which
// inherit the affinity of their creator. It also sets GOMAXPROCS to the number of
// CPUs, unless the GOMAXPROCS environment variable sets it. It fails if a CPU is not
// available to the process.
//
// Why pin: on a small virtual machine a loopback round trip is two wake-ups, and
// when client and server sit on different CPUs each wake-up may cross CPUs (an
// inter-processor interrupt, sometimes a halted virtual CPU to wake). That costs
// more than the work itself and varies from run to run. With the client and the
// servers on one CPU, each wake-up is a context switch on that CPU: slower in
// absolute terms on a machine that has idle CPUs, but far steadier, and the ratios
// between backends and to their floors are what the benchmark reports.
func Pin(cpus []int) error {
	if len(cpus) == 0 {
		return fmt.Errorf("%w: empty CPU list", driver.ErrInvalid)
	}
	allowed, err := Affinity()
	if err != nil {
		return err
	}
	ok := map[int]bool{}
	for _, c := range allowed {
		ok[c] = true
	}
	var set unix.CPUSet
	for _, c := range cpus {
		if !ok[c] {
			return fmt.Errorf("%w: CPU %d is not available (this process may use CPUs %s)", driver.ErrInvalid, c, FormatCPUs(allowed))
		}
		set.Set(c)
	}
	// The Go scheduler keeps one running thread per CPU it may use.
	if os.Getenv("GOMAXPROCS") == "" {
		runtime.GOMAXPROCS(len(cpus))
	}
	// Threads may be created while we go through them; they inherit the
	// affinity of their creator, so a second pass finds none left.
	for range 3 {
		changed := false
		tasks, err := os.ReadDir("/proc/self/task")
		if err != nil {
			return fmt.Errorf("pin: %w", err)
		}
		for _, t := range tasks {
			tid, err := strconv.Atoi(t.Name())
			if err != nil {
				continue
			}
			var cur unix.CPUSet
			if err := unix.SchedGetaffinity(tid, &cur); err == nil && cur == set {
				continue
			}
			if err := unix.SchedSetaffinity(tid, &set); err != nil && err != unix.ESRCH {
				return fmt.Errorf("pin thread %d: %w", tid, err)
			}
			changed = true
		}
		if !changed {
			return nil
		}
	}
	return nil
}

// Affinity returns the CPUs the calling thread may run on.
func Affinity() ([]int, error) {
	var set unix.CPUSet
	if err := unix.SchedGetaffinity(0, &set); err != nil {
		return nil, fmt.Errorf("sched_getaffinity: %w", err)
	}
	var cpus []int
	for c := range 1024 {
		if set.IsSet(c) {
			cpus = append(cpus, c)
		}
	}
	return cpus, nil
}
