package history

import (
	"fmt"
	"math/big"
	"unsafe"

	"golang.org/x/sys/windows"
)

// Windows's CLOCK_MONOTONIC is the performance counter: one clock for every process
// on the machine, never set back, counting at a fixed frequency.
var (
	kernel32      = windows.NewLazySystemDLL("kernel32.dll")
	procQPC       = kernel32.NewProc("QueryPerformanceCounter")
	procQPF       = kernel32.NewProc("QueryPerformanceFrequency")
	counterPerSec = frequency()
)

func frequency() int64 {
	var f int64
	if err := qp(procQPF, &f); err != nil || f <= 0 {
		panic(fmt.Sprintf("history: QueryPerformanceFrequency: %v", err)) // cannot fail since Windows XP
	}
	return f
}

func qp(p *windows.LazyProc, v *int64) error {
	if err := p.Find(); err != nil {
		return err
	}
	if r, _, err := p.Call(uintptr(unsafe.Pointer(v))); r == 0 {
		return err
	}
	return nil
}

// Now returns the performance counter in nanoseconds, the same clock in every
// process of a run on this machine.
func Now() int64 {
	var c int64
	if err := qp(procQPC, &c); err != nil {
		panic(fmt.Sprintf("history: QueryPerformanceCounter: %v", err))
	}
	return toNanos(c, counterPerSec)
}

// toNanos is c counter ticks at f per second in nanoseconds, without overflow.
func toNanos(c, f int64) int64 {
	if f == 1e7 { // the usual frequency: 100 ns ticks
		return c * 100
	}
	n := new(big.Int).Mul(big.NewInt(c), big.NewInt(1e9))
	return n.Quo(n, big.NewInt(f)).Int64()
}
