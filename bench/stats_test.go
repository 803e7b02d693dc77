package bench

import (
	"encoding/json"
	"math"
	"testing"
	"time"
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

func TestFloatJSON(t *testing.T) {
	b, err := json.Marshal(struct{ A, B Float }{Float(math.NaN()), 1.5})
	if err != nil || string(b) != `{"A":null,"B":1.5}` {
		t.Fatalf("marshal: %s %v", b, err)
	}
	var v struct{ A, B Float }
	if err := json.Unmarshal(b, &v); err != nil || v.A.Valid() || v.B != 1.5 {
		t.Fatalf("unmarshal: %+v %v", v, err)
	}
}

func TestCPUs(t *testing.T) {
	for _, c := range []struct {
		in   string
		want string
	}{{"0", "0"}, {"0,2", "0,2"}, {"3-5,0", "0,3-5"}, {"1,1,2", "1-2"}, {" 0 , 1 ", "0-1"}} {
		cpus, err := ParseCPUs(c.in)
		if err != nil {
			t.Errorf("ParseCPUs(%q): %v", c.in, err)
			continue
		}
		if got := FormatCPUs(cpus); got != c.want {
			t.Errorf("ParseCPUs(%q) = %v, formatted %q, want %q", c.in, cpus, got, c.want)
		}
	}
	for _, bad := range []string{"", "a", "-1", "3-1", "1,", "0-99999", "1-2-3"} {
		if _, err := ParseCPUs(bad); err == nil {
			t.Errorf("ParseCPUs(%q) accepted", bad)
		}
	}
}

func TestFormat(t *testing.T) {
	for d, want := range map[time.Duration]string{
		0: "n/a", 812: "812ns", 1250: "1.25µs", 31_400_000: "31.4ms", 2 * time.Second: "2.00s", 999: "999ns",
	} {
		if got := fmtDur(d); got != want {
			t.Errorf("fmtDur(%d) = %q, want %q", d, got, want)
		}
	}
	for f, want := range map[float64]string{
		3.512: "3.51", 42.25: "42.2", 412: "412", 1234: "1,230", 1_234_567: "1,230,000", math.NaN(): "n/a",
	} {
		if got := fmtRate(f); got != want {
			t.Errorf("fmtRate(%v) = %q, want %q", f, got, want)
		}
	}
	if fmtRatio(Float(math.NaN())) != "n/a" || fmtRatio(1.234) != "1.23×" {
		t.Error("fmtRatio")
	}
	if shortDur(time.Millisecond) != "1ms" || shortDur(10*time.Microsecond) != "10µs" || shortDur(100*time.Microsecond) != "100µs" {
		t.Errorf("shortDur: %q %q", shortDur(time.Millisecond), shortDur(10*time.Microsecond))
	}
}
