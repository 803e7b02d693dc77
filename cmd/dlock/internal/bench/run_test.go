package bench

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"image/png"
	"math"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/dlockio/dlock/driver"
	"github.com/dlockio/dlock/internal/testserver"
	_ "github.com/dlockio/dlock/memlock"
	_ "github.com/dlockio/dlock/redislock"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// short is a run small enough for a test: its numbers mean nothing, its structure
// is what the tests check.
func short(targets ...Target) Config {
	return Config{Targets: targets, Duration: 60 * time.Millisecond, Rounds: 2, Workers: 3, Keys: 4,
		Waiters: []int{1, 5}, WarmUp: 10 * time.Millisecond}
}

func ctxT(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	t.Cleanup(cancel)
	return ctx
}

func checkResult(t *testing.T, res *Result, cfg Config) {
	t.Helper()
	if len(res.Backends) != len(cfg.Targets) {
		t.Fatalf("%d backends in the result, want %d", len(res.Backends), len(cfg.Targets))
	}
	for _, br := range res.Backends {
		if br.Error != "" {
			t.Fatalf("%s failed: %s", br.Name, br.Error)
		}
		if br.Cycle.Dlock.N == 0 || br.Cycle.Dlock.P50 <= 0 || br.Cycle.Dlock.P99 < br.Cycle.Dlock.P50 || br.Cycle.PerSecond <= 0 {
			t.Errorf("%s cycle: %+v", br.Name, br.Cycle)
		}
		if len(br.Cycle.Rounds) != cfg.Rounds || len(br.HotKey.Rounds) != cfg.Rounds {
			t.Errorf("%s: %d cycle rounds, %d hot-key rounds, want %d", br.Name, len(br.Cycle.Rounds), len(br.HotKey.Rounds), cfg.Rounds)
		}
		if br.ManyKeys.Workers != cfg.Workers || br.ManyKeys.Keys != cfg.Keys || br.ManyKeys.Acquisitions == 0 {
			t.Errorf("%s many keys: %+v", br.Name, br.ManyKeys)
		}
		h := br.HotKey
		if h.Acquisitions == 0 || h.Handoff.N == 0 || !h.Jain.Valid() || float64(h.Jain) > 1 || float64(h.Jain) < 1/float64(cfg.Workers) ||
			h.MinPerWorker > h.MaxPerWorker || !h.MinMax.Valid() {
			t.Errorf("%s hot key: %+v", br.Name, h)
		}
		for _, r := range h.Rounds {
			if len(r.Counts) != cfg.Workers {
				t.Errorf("%s hot key round counts %v", br.Name, r.Counts)
			}
		}
		if len(br.Growth) != len(cfg.Waiters) {
			t.Fatalf("%s growth: %+v", br.Name, br.Growth)
		}
		for i, g := range br.Growth {
			if g.Waiters != cfg.Waiters[i] || g.Handoffs < int64(cfg.Rounds*MinChainHandoffs) || g.PerSecond <= 0 || !g.Cost.Calls.Valid() {
				t.Errorf("%s growth point: %+v", br.Name, g)
			}
			if br.OpsSource != "" && !g.Cost.ServerOps.Valid() {
				t.Errorf("%s counts server ops but growth has none: %+v", br.Name, g)
			}
		}
		if !br.CycleCost.Calls.Valid() || br.Overlaps != 0 {
			t.Errorf("%s: cycle cost %+v, overlaps %d", br.Name, br.CycleCost, br.Overlaps)
		}
	}
	var md, js bytes.Buffer
	if err := res.WriteMarkdown(&md); err != nil {
		t.Fatal(err)
	}
	for _, br := range res.Backends {
		if !strings.Contains(md.String(), "| "+br.Name+" |") {
			t.Errorf("markdown has no row for %s:\n%s", br.Name, md.String())
		}
	}
	if err := res.WriteJSON(&js); err != nil {
		t.Fatal(err)
	}
	var back Result
	if err := json.Unmarshal(js.Bytes(), &back); err != nil {
		t.Fatalf("JSON does not read back: %v", err)
	}
	if len(back.Backends) != len(res.Backends) || back.Backends[0].Cycle.Dlock != res.Backends[0].Cycle.Dlock {
		t.Errorf("JSON round trip lost data")
	}
	dir := t.TempDir()
	files, err := res.WriteCharts(dir)
	if err != nil {
		t.Fatal(err)
	}
	if len(files) != 4 {
		t.Errorf("charts: %v", files)
	}
	for _, f := range files {
		checkPNG(t, f)
	}
}

func checkPNG(t *testing.T, path string) {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	img, err := png.Decode(f)
	if err != nil {
		t.Fatalf("%s: %v", path, err)
	}
	if b := img.Bounds(); b.Dx() < 400 || b.Dy() < 200 {
		t.Errorf("%s is %v", path, b)
	}
}

func TestRunMem(t *testing.T) {
	cfg := short(Target{Name: "mem", URL: "mem://bench-test"})
	var steps []Progress
	cfg.Progress = func(p Progress) { steps = append(steps, p) }
	res, err := Run(ctxT(t), cfg)
	if err != nil {
		t.Fatal(err)
	}
	checkResult(t, res, cfg)
	br := res.Backends[0]
	if br.Floor || br.Cycle.Floor != nil || br.Cycle.Ratio.Valid() || br.ManyKeys.FloorPerSecond.Valid() || br.OpsSource != "" {
		t.Errorf("mem has no floor and no server counter: %+v", br)
	}
	if !strings.Contains(mdString(t, res), "n/a") {
		t.Error("markdown does not say n/a for the missing floor")
	}
	last := steps[len(steps)-1]
	if len(steps) != last.Steps+1 || last.Step != last.Steps {
		t.Errorf("progress: %d calls, last %+v", len(steps), last)
	}
	// The in-process backend wakes only the next waiter: the driver calls per
	// handoff do not grow with the waiters (Release, Acquire, Stop, and each
	// waiter's own Release: at most 4).
	for _, g := range br.Growth {
		if float64(g.Cost.Calls) > 4.5 {
			t.Errorf("driver calls per handoff with %d waiters: %v", g.Waiters, g.Cost.Calls)
		}
	}
}

func mdString(t *testing.T, r *Result) string {
	var b bytes.Buffer
	if err := r.WriteMarkdown(&b); err != nil {
		t.Fatal(err)
	}
	return b.String()
}

func TestRunRedis(t *testing.T) {
	srv := testserver.StartRedis(t)
	cfg := short(Target{Name: "mem", URL: "mem://bench-test-2"}, Target{URL: srv.URL() + "?ttl=10s"})
	res, err := Run(ctxT(t), cfg)
	if err != nil {
		t.Fatal(err)
	}
	checkResult(t, res, cfg)
	br := res.Backends[1]
	if br.Name != "redis" {
		t.Errorf("default name %q, want the scheme", br.Name)
	}
	if !br.Floor || br.Cycle.Floor == nil || !br.Cycle.Ratio.Valid() || !br.ManyKeys.Ratio.Valid() || !br.HotKey.HandoffFloorRatio.Valid() {
		t.Errorf("redis has a floor: %+v", br.Cycle)
	}
	if br.OpsSource == "" || !br.FloorOps.Valid() || !br.CycleCost.ServerOps.Valid() || float64(br.FloorOps) < 2 {
		t.Errorf("redis counts server ops: source %q, floor %v, cycle %+v", br.OpsSource, br.FloorOps, br.CycleCost)
	}
	for _, r := range br.Cycle.Rounds {
		if !r.Ratio.Valid() || r.FloorP50 <= 0 {
			t.Errorf("cycle round %+v", r)
		}
	}
}

func TestRunFailingBackend(t *testing.T) {
	// A port nobody listens on: the backend fails to connect, the others run.
	port := testserver.FreePort(t)
	cfg := short(Target{Name: "mem", URL: "mem://bench-test-3"},
		Target{Name: "down", URL: "redis://127.0.0.1:" + strconv.Itoa(port) + "/0?dial_timeout=200ms&max_retries=0"})
	cfg.Workers = 2
	res, err := Run(ctxT(t), cfg)
	if err != nil {
		t.Fatal(err)
	}
	if res.Backends[0].Error != "" || res.Backends[1].Error == "" || !res.Failed() {
		t.Fatalf("errors: %q, %q", res.Backends[0].Error, res.Backends[1].Error)
	}
	md := mdString(t, res)
	if !strings.Contains(md, "**Failed:**") || strings.Contains(md, "| down |") {
		t.Errorf("markdown about the failed backend:\n%s", md)
	}
}

func TestConfigValidate(t *testing.T) {
	good := short(Target{URL: "mem://x"})
	if err := good.Validate(); err != nil {
		t.Fatal(err)
	}
	for name, mod := range map[string]func(*Config){
		"no duration":    func(c *Config) { c.Duration = -1 },
		"long duration":  func(c *Config) { c.Duration = MaxDuration + 1 },
		"no rounds":      func(c *Config) { c.Rounds = 0 },
		"one worker":     func(c *Config) { c.Workers = 1 },
		"no keys":        func(c *Config) { c.Keys = 0 },
		"zero waiters":   func(c *Config) { c.Waiters = []int{0} },
		"many waiters":   func(c *Config) { c.Waiters = []int{MaxWaiters + 1} },
		"tiny rounds":    func(c *Config) { c.Duration, c.Rounds = time.Millisecond, 10 },
		"bad scheme":     func(c *Config) { c.Targets = []Target{{URL: "nope://x"}} },
		"no scheme":      func(c *Config) { c.Targets = []Target{{URL: "localhost:6379"}} },
		"bad ttl":        func(c *Config) { c.Targets = []Target{{URL: "mem://x?ttl=-1s"}} },
		"owner":          func(c *Config) { c.Targets = []Target{{URL: "mem://x?owner=me"}} },
		"duplicate name": func(c *Config) { c.Targets = []Target{{URL: "mem://x"}, {URL: "mem://y"}} },
		"malformed ttl":  func(c *Config) { c.Targets = []Target{{URL: "mem://x?ttl=1s%"}} },
		"semicolon":      func(c *Config) { c.Targets = []Target{{URL: "mem://x?ttl=1s;owner=me"}} },
	} {
		c := good
		mod(&c)
		if err := c.Validate(); !errors.Is(err, driver.ErrInvalid) {
			t.Errorf("%s: Validate = %v, want ErrInvalid", name, err)
		}
	}
	if _, err := Run(context.Background(), Config{}); !errors.Is(err, driver.ErrInvalid) {
		t.Errorf("Run with no target: %v", err)
	}
}

func TestMarkdownNaN(t *testing.T) {
	nan := Float(math.NaN())
	r := &Result{Settings: Settings{Rounds: 1, Workers: 2, Keys: 1, Waiters: []int{1}}, Machine: Machine{LoadStart: nan, LoadEnd: nan},
		Backends: []*BackendResult{{Name: "x", URL: "mem://x", FloorOps: nan,
			Cycle:     CycleResult{Ratio: nan, FloorPerSecond: nan},
			ManyKeys:  ManyKeysResult{Ratio: nan, FloorPerSecond: nan},
			HotKey:    HotKeyResult{HandoffFloorRatio: nan, MinMax: nan, Jain: nan},
			CycleCost: Cost{ServerOps: nan, Calls: 4},
			Growth:    []GrowthPoint{{Waiters: 1, Cost: Cost{ServerOps: nan, Calls: 4}, Queued: false}}}}}
	md := mdString(t, r)
	for _, want := range []string{"| x | driver calls | n/a | 4.0 | 4.0 * |", "\\* the backend did not show every waiter queued", "no server counter"} {
		if !strings.Contains(md, want) {
			t.Errorf("markdown lacks %q:\n%s", want, md)
		}
	}
	if strings.Contains(md, "NaN") {
		t.Errorf("markdown shows NaN:\n%s", md)
	}
	// Without samples (a result read from JSON), only the waiter charts are drawn.
	files, err := r.WriteCharts(t.TempDir())
	if err != nil || len(files) != 2 {
		t.Fatalf("charts %v, %v", files, err)
	}
}
