package measure

import (
	"context"
	"errors"
	"math"
	"testing"
	"time"

	"github.com/dlockio/dlock"
	"github.com/dlockio/dlock/clock"
	"github.com/dlockio/dlock/driver"
	"github.com/dlockio/dlock/memlock"
)

func TestPercentile(t *testing.T) {
	if got := Percentile(nil, 0.5); got != 0 {
		t.Fatalf("Percentile(nil) = %v, want 0", got)
	}
	ds := []time.Duration{9, 1, 8, 2, 7, 3, 6, 4, 5, 10}
	for _, c := range []struct {
		q    float64
		want time.Duration
	}{{0, 1}, {0.5, 5}, {0.9, 9}, {0.99, 9}, {1, 10}, {-1, 1}, {2, 10}} {
		if got := Percentile(ds, c.q); got != c.want {
			t.Errorf("Percentile(q=%v) = %v, want %v", c.q, got, c.want)
		}
	}
	if ds[0] != 1 || ds[9] != 10 {
		t.Errorf("Percentile did not sort in place: %v", ds)
	}
	if got := Percentile([]time.Duration{42}, 0.99); got != 42 {
		t.Errorf("single value: %v", got)
	}
}

func TestJain(t *testing.T) {
	for _, c := range []struct {
		xs   []int64
		want float64
	}{
		{nil, 0},
		{[]int64{0, 0}, 0},
		{[]int64{5, 5, 5, 5}, 1},
		{[]int64{10, 0, 0, 0}, 0.25},       // one takes all: 1/n
		{[]int64{1, 2}, 9.0 / (2 * 5)},     // (1+2)^2 / (2*(1+4))
		{[]int64{3, 1, 1, 1}, 36.0 / 48.0}, // 6^2 / (4*12)
	} {
		if got := Jain(c.xs); math.Abs(got-c.want) > 1e-12 {
			t.Errorf("Jain(%v) = %v, want %v", c.xs, got, c.want)
		}
	}
	lo, hi := MinMax([]int64{4, 2, 9})
	if lo != 2 || hi != 9 {
		t.Errorf("MinMax = %d, %d", lo, hi)
	}
}

func TestSamples(t *testing.T) {
	var s Samples
	if s.Summary() != (Latency{}) {
		t.Fatal("empty summary not zero")
	}
	for i := 1; i <= 100; i++ {
		s.Add(time.Duration(i))
	}
	sum := s.Summary()
	want := Latency{N: 100, Mean: 50, P50: 50, P90: 90, P99: 99, Max: 100}
	if sum != want {
		t.Fatalf("Summary = %+v, want %+v", sum, want)
	}

	// Past its capacity a reservoir keeps a uniform sample: exact count, sum and
	// maximum, and percentiles close to the population's.
	r := Samples{Cap: 1000}
	const n = 100_000
	for i := range n {
		r.Add(time.Duration(i))
	}
	if r.Count() != n || len(r.Values()) != 1000 || r.Summary().Max != n-1 {
		t.Fatalf("reservoir: count %d, kept %d, max %v", r.Count(), len(r.Values()), r.Summary().Max)
	}
	if p := float64(r.Percentile(0.5)); math.Abs(p-n/2) > n/10 {
		t.Errorf("reservoir median %v far from %v", p, n/2)
	}

	var m Samples
	m.Merge(&s)
	m.Merge(&s)
	if m.Count() != 200 || m.Sum() != 2*s.Sum() || m.Percentile(0.5) != 50 {
		t.Errorf("merge: count %d sum %v p50 %v", m.Count(), m.Sum(), m.Percentile(0.5))
	}
}

func TestRates(t *testing.T) {
	if PerSecond(10, 0) != 0 || PerSecond(10, 2*time.Second) != 5 {
		t.Error("PerSecond")
	}
	if !math.IsNaN(Ratio(1, 0)) || Ratio(3, 2) != 1.5 {
		t.Error("Ratio")
	}
}

// TestCounting checks that the counting wrapper has exactly the optional
// capabilities of the backend it wraps.
func TestCounting(t *testing.T) {
	full := memlock.NewStore(clock.Real).Backend()
	var cnt Counts
	for name, c := range map[string]struct {
		b       driver.Backend
		n, i, f bool
	}{
		"all":      {full, true, true, true},
		"none":     {plain{full}, false, false, false},
		"notifier": {notifierOnly{plain{full}, full}, true, false, false},
		"inspect":  {inspectorOnly{plain{full}, full}, false, true, false},
	} {
		w := Counting(c.b, &cnt)
		_, n := w.(driver.Notifier)
		_, i := w.(driver.Inspector)
		_, f := w.(driver.ForceReleaser)
		if n != c.n || i != c.i || f != c.f {
			t.Errorf("%s: notifier %v inspector %v force %v", name, n, i, f)
		}
	}
	// Calls are counted, and so are "locked" answers.
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	a, err := dlock.New(Counting(full, &cnt))
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	c0 := cnt.Calls()
	l, err := a.Lock(ctx, "k")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := a.TryLock(ctx, "k"); !errors.Is(err, dlock.ErrLocked) {
		t.Fatal(err)
	}
	if err := l.Release(ctx); err != nil {
		t.Fatal(err)
	}
	// Lock: Watch, Acquire, Stop; TryLock: Acquire; Release.
	if got := cnt.Calls() - c0; got != 5 || cnt.Locked() != 1 {
		t.Errorf("calls %d (want 5), locked %d (want 1)", got, cnt.Locked())
	}
}

type plain struct{ b driver.Backend }

func (p plain) Acquire(ctx context.Context, r driver.Request) (driver.Grant, error) {
	return p.b.Acquire(ctx, r)
}
func (p plain) Refresh(ctx context.Context, k, o string, ttl time.Duration) error {
	return p.b.Refresh(ctx, k, o, ttl)
}
func (p plain) Release(ctx context.Context, k, o string) error { return p.b.Release(ctx, k, o) }
func (p plain) Close() error                                   { return p.b.Close() }

type notifierOnly struct {
	plain
	n driver.Notifier
}

func (n notifierOnly) Watch(ctx context.Context, k, o string) (driver.Waiter, error) {
	return n.n.Watch(ctx, k, o)
}

type inspectorOnly struct {
	plain
	i driver.Inspector
}

func (i inspectorOnly) Inspect(ctx context.Context, k string) (driver.Info, error) {
	return i.i.Inspect(ctx, k)
}

// recorder is a backend that appends its name to seq at every Acquire.
type recorder struct {
	driver.Backend
	name string
	seq  *[]string
}

func (r recorder) Acquire(ctx context.Context, req driver.Request) (driver.Grant, error) {
	*r.seq = append(*r.seq, r.name)
	return r.Backend.Acquire(ctx, req)
}

// TestCyclesPaired: Cycles times the cycles of the other clients it pairs dlock's
// with, one each per group, in an order shuffled for each group; a paired client
// that fails leaves the rotation with its error, and the others go on.
func TestCyclesPaired(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	store := memlock.NewStore(clock.Real)
	var seq []string
	client := func(name string) *dlock.Client {
		c, err := dlock.New(recorder{store.Backend(), name, &seq})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		return c
	}
	c, ok, broken := client("dlock"), client("paired"), client("broken")
	broken.Close() // every Lock fails, without reaching the backend
	floor := func(ctx context.Context, key string) error {
		seq = append(seq, "floor")
		return nil
	}
	peers := CyclePeers{Floor: floor, FloorKey: "f", Driver: recorder{store.Backend(), "driver", &seq}, DriverKey: "d",
		Others: []*Paired{{Client: ok, Key: "p"}, {Client: broken, Key: "q"}}}
	const n = 40
	var run CycleRun
	if err := Cycles(ctx, c, "k", peers, Limit{N: n}, &run); err != nil {
		t.Fatal(err)
	}
	if run.Dlock.Count() != n || run.Floor.Count() != n || run.Driver.Count() != n {
		t.Errorf("dlock %d, floor %d, driver %d cycles; want %d each", run.Dlock.Count(), run.Floor.Count(), run.Driver.Count(), n)
	}
	if p := peers.Others[0]; p.Err != nil || p.Samples.Count() != n {
		t.Errorf("paired client: %d cycles, error %v; want %d, none", p.Samples.Count(), p.Err, n)
	}
	if p := peers.Others[1]; !errors.Is(p.Err, dlock.ErrClosed) || p.Samples.Count() != 0 {
		t.Errorf("closed paired client: %d cycles, error %v; want 0, ErrClosed", p.Samples.Count(), p.Err)
	}
	// Shuffled: within the groups of four, the cycle right before the floor's is
	// not always the same one (a rotation would always put the same one there).
	if len(seq) != 4*n {
		t.Fatalf("%d cycles recorded, want %d: %v", len(seq), 4*n, seq)
	}
	ahead := map[string]int{}
	for g := 0; g < n; g++ {
		group := seq[4*g : 4*g+4]
		for i := 1; i < 4; i++ {
			if group[i] == "floor" {
				ahead[group[i-1]]++
			}
		}
	}
	if len(ahead) < 2 {
		t.Errorf("the cycle right before the floor's within a group: %v", ahead)
	}
}

// TestLimitFromStart: a loop's Duration runs from the moment every worker has
// started, not from the loop's creation. Before that, operations run uncounted
// however long the start takes (a loaded machine may schedule a worker late); once
// every worker is in, they are counted until Duration has passed, or N taken.
func TestLimitFromStart(t *testing.T) {
	fc := clock.NewFake(time.Unix(1000, 0))
	newSt := func() *starter {
		st := newStarter(2)
		st.now, st.base = fc.Now, fc.Now()
		return st
	}
	st := newSt()
	cnt := newCounter(Limit{Duration: 100 * time.Millisecond})
	st.enter()
	fc.Advance(time.Second) // the second worker starts late, well past Duration
	if run, counted := cnt.nextOp(st); !run || counted {
		t.Fatalf("before every worker started: run %v counted %v, want true false", run, counted)
	}
	st.enter()
	if run, counted := cnt.nextOp(st); !run || !counted {
		t.Fatalf("right after every worker started: run %v counted %v, want true true (the window runs from the start)", run, counted)
	}
	fc.Advance(99 * time.Millisecond)
	if run, counted := cnt.nextOp(st); !run || !counted {
		t.Fatalf("99ms into a 100ms window: run %v counted %v", run, counted)
	}
	fc.Advance(time.Millisecond)
	if run, _ := cnt.nextOp(st); run {
		t.Fatal("the window's Duration has passed, and the operation still runs")
	}
	if got := st.elapsed(); got != 100*time.Millisecond {
		t.Errorf("elapsed %v, want 100ms (from the start, not from creation)", got)
	}

	// N counts only the operations after the start.
	st = newSt()
	cnt = newCounter(Limit{N: 2})
	st.enter()
	for range 5 {
		if _, counted := cnt.nextOp(st); counted {
			t.Fatal("counted before every worker started")
		}
	}
	st.enter()
	for i := range 2 {
		if run, counted := cnt.nextOp(st); !run || !counted {
			t.Fatalf("operation %d of N=2: run %v counted %v", i, run, counted)
		}
	}
	if run, _ := cnt.nextOp(st); run {
		t.Fatal("a third operation runs with N=2")
	}
}
