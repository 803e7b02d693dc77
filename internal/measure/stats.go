package measure

import (
	"math"
	mrand "math/rand/v2"
	"slices"
	"time"
)

// Percentile returns the q-quantile (0 <= q <= 1) of ds by the nearest-rank method on
// the sorted values (the value at index floor(q*(n-1))). It sorts ds in place and
// returns 0 for an empty slice.
func Percentile(ds []time.Duration, q float64) time.Duration {
	if len(ds) == 0 {
		return 0
	}
	slices.Sort(ds)
	return SortedPercentile(ds, q)
}

// SortedPercentile returns the q-quantile (0..1) of sorted, which must be in order.
func SortedPercentile(sorted []time.Duration, q float64) time.Duration {
	if len(sorted) == 0 {
		return 0
	}
	q = min(max(q, 0), 1)
	return sorted[int(q*float64(len(sorted)-1))]
}

// Jain returns Jain's fairness index of xs, (Σx)² / (n·Σx²): 1 when every worker got
// the same share, 1/n when one worker got everything. It returns 0 for no workers or
// when every share is zero.
func Jain(xs []int64) float64 {
	var sum, sq float64
	for _, x := range xs {
		f := float64(x)
		sum += f
		sq += f * f
	}
	if len(xs) == 0 || sq == 0 {
		return 0
	}
	return sum * sum / (float64(len(xs)) * sq)
}

// MinMax returns the smallest and largest of xs (0, 0 when empty).
func MinMax(xs []int64) (lo, hi int64) {
	if len(xs) == 0 {
		return 0, 0
	}
	return slices.Min(xs), slices.Max(xs)
}

// Latency summarises a latency distribution.
type Latency struct {
	N    int64         `json:"n"`
	Mean time.Duration `json:"mean_ns"`
	P50  time.Duration `json:"p50_ns"`
	P90  time.Duration `json:"p90_ns"`
	P99  time.Duration `json:"p99_ns"`
	Max  time.Duration `json:"max_ns"`
}

// DefaultReservoir is how many latencies a Samples keeps by default.
const DefaultReservoir = 100_000

// Samples collects latencies: every one up to its capacity, then a uniform random
// sample of them (reservoir sampling), so that a long run on a fast backend stays
// small while its percentiles stay unbiased. Count, mean and maximum are exact. The
// zero value keeps DefaultReservoir values. It is not safe for concurrent use.
type Samples struct {
	// Cap is the reservoir size; 0 means DefaultReservoir.
	Cap int

	vals  []time.Duration
	n     int64
	sum   time.Duration
	max   time.Duration
	rng   *mrand.Rand
	dirty bool // vals not sorted
}

// Add records one latency.
func (s *Samples) Add(d time.Duration) {
	s.n++
	s.sum += d
	s.max = max(s.max, d)
	c := s.Cap
	if c <= 0 {
		c = DefaultReservoir
	}
	s.dirty = true
	if len(s.vals) < c {
		s.vals = append(s.vals, d)
		return
	}
	if s.rng == nil {
		s.rng = mrand.New(mrand.NewPCG(1, 2)) // deterministic: runs are comparable
	}
	if i := s.rng.Int64N(s.n); i < int64(c) {
		s.vals[i] = d
	}
}

// Merge adds the values kept by o (its exact count, sum and maximum too).
func (s *Samples) Merge(o *Samples) {
	if o == nil || o.n == 0 {
		return
	}
	n, sum, mx := s.n, s.sum, s.max
	for _, v := range o.vals {
		s.Add(v)
	}
	s.n, s.sum, s.max = n+o.n, sum+o.sum, max(mx, o.max)
}

// Count returns the number of latencies recorded.
func (s *Samples) Count() int64 { return s.n }

// Sum returns the total of the latencies recorded.
func (s *Samples) Sum() time.Duration { return s.sum }

// Values returns the kept latencies, sorted. The slice belongs to s.
func (s *Samples) Values() []time.Duration {
	if s.dirty {
		slices.Sort(s.vals)
		s.dirty = false
	}
	return s.vals
}

// Percentile returns the q-quantile of the kept latencies.
func (s *Samples) Percentile(q float64) time.Duration { return SortedPercentile(s.Values(), q) }

// Summary returns count, mean, p50, p90, p99 and maximum.
func (s *Samples) Summary() Latency {
	if s.n == 0 {
		return Latency{}
	}
	return Latency{
		N: s.n, Mean: s.sum / time.Duration(s.n),
		P50: s.Percentile(0.50), P90: s.Percentile(0.90), P99: s.Percentile(0.99),
		Max: s.max,
	}
}

// PerSecond returns n events per elapsed time, 0 when no time elapsed.
func PerSecond(n int64, elapsed time.Duration) float64 {
	if elapsed <= 0 {
		return 0
	}
	return float64(n) / elapsed.Seconds()
}

// Ratio returns a/b, or NaN when b is zero (rendered "n/a").
func Ratio(a, b float64) float64 {
	if b == 0 {
		return math.NaN()
	}
	return a / b
}
