package bench

import (
	"fmt"
	"slices"
	"strconv"
	"strings"

	"github.com/dlockio/dlock/driver"
)

// ParseCPUs reads a CPU list in the syntax of taskset -c: numbers and ranges
// separated by commas, such as "0", "0,2" or "0-3,6". The result is sorted and
// without duplicates.
func ParseCPUs(s string) ([]int, error) {
	bad := func() ([]int, error) {
		return nil, fmt.Errorf("%w: CPU list %q is not like 0 or 0,2 or 0-3", driver.ErrInvalid, s)
	}
	if strings.TrimSpace(s) == "" {
		return bad()
	}
	var cpus []int
	for part := range strings.SplitSeq(s, ",") {
		part = strings.TrimSpace(part)
		lo, hi, isRange := strings.Cut(part, "-")
		a, err := strconv.Atoi(lo)
		if err != nil || a < 0 {
			return bad()
		}
		b := a
		if isRange {
			if b, err = strconv.Atoi(hi); err != nil || b < a {
				return bad()
			}
		}
		if b >= 1024 {
			return bad()
		}
		for c := a; c <= b; c++ {
			cpus = append(cpus, c)
		}
	}
	slices.Sort(cpus)
	return slices.Compact(cpus), nil
}

// FormatCPUs writes a CPU list in taskset -c syntax, with ranges.
func FormatCPUs(cpus []int) string {
	cpus = slices.Compact(slices.Sorted(slices.Values(cpus)))
	var parts []string
	for i := 0; i < len(cpus); {
		j := i
		for j+1 < len(cpus) && cpus[j+1] == cpus[j]+1 {
			j++
		}
		if j == i {
			parts = append(parts, strconv.Itoa(cpus[i]))
		} else {
			parts = append(parts, strconv.Itoa(cpus[i])+"-"+strconv.Itoa(cpus[j]))
		}
		i = j + 1
	}
	return strings.Join(parts, ",")
}
