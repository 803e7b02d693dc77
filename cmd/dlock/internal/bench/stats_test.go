package bench

import (
	"encoding/json"
	"math"
	"testing"
	"time"
)

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
