package bench

import (
	"context"
	"encoding/json"
	"fmt"
	"math"
	"net/url"
	"os"
	"runtime"
	"slices"
	"strings"
	"time"

	"github.com/dlockio/dlock"
	"github.com/dlockio/dlock/driver"
)

// Defaults of Config.
const (
	DefaultDuration = 2 * time.Second
	DefaultRounds   = 3
	DefaultWorkers  = 16
	DefaultKeys     = 64
)

// DefaultWaiters are the queue lengths of the cost-growth workload.
var DefaultWaiters = []int{1, 16, 256}

// Limits on Config, so that every run is bounded.
const (
	MaxDuration = 10 * time.Minute
	MaxRounds   = 100
	MaxWorkers  = 1024
	MaxKeys     = 1_000_000
	MaxWaiters  = 10_000
	// ChainTimeout bounds one cost-growth chain (queueing and handing the key down
	// to every waiter).
	ChainTimeout = 2 * time.Minute
	// MinChainHandoffs is the least number of handoffs measured per chain length
	// and round: chains shorter than that are repeated.
	MinChainHandoffs = 32
)

// Workload names, as shown by Progress.
const (
	WorkCycle    = "cycle"
	WorkManyKeys = "many keys"
	WorkHotKey   = "hot key"
	WorkGrowth   = "waiters"
	WorkWarmUp   = "warm-up"
	WorkOpen     = "connect"
)

// Target is one backend to measure.
type Target struct {
	// Name labels the backend in the results; empty means the URL's scheme.
	Name string
	// URL opens the backend, as for dlock.Open. The core parameters ttl, renew and
	// drift are honoured; owner is refused (every waiter needs its own owner id).
	URL string
	// Note says how the backend was set up (shown with the results).
	Note string
}

// Config describes a run.
type Config struct {
	Targets []Target
	// Duration is the measuring time of each timed workload (cycle, many keys,
	// hot key) on each backend, split evenly over the rounds.
	Duration time.Duration
	// Rounds interleaves the backends: round 1 runs every workload on every
	// backend, then round 2, and so on, so that every backend sees the same
	// changes in machine load, and the spread between rounds shows the noise.
	Rounds int
	// Workers is the number of clients (each its own connection) of the many-keys
	// and hot-key workloads; their clients also carry the waiters of the
	// cost-growth workload.
	Workers int
	// Keys is the number of keys of the many-keys workload.
	Keys int
	// Waiters are the queue lengths of the cost-growth workload.
	Waiters []int
	// WarmUp runs cycles and a hot key on each backend before the first round,
	// unrecorded (a JIT-compiled server needs it: after a warm-up of 1s, a
	// ZooKeeper started for the run served dlock, measured first, about a third
	// slower in round 1 than in rounds 2 and 3 in every run; after 4s, in a third
	// of the runs). Zero means Duration, at most 4s; negative means none.
	WarmUp time.Duration
	// Options are given to every client.
	Options []dlock.Option
	// Peers also measures, beside every backend on a store that has them, the
	// lock libraries users run on that store (see peers.go): on the same
	// servers, through the same loops, in the same rounds. Each dlock backend
	// then gets its ratio to the best peer of its store (BackendResult.VsPeers).
	Peers bool
	// Progress, optional, is called before every step and once at the end (with
	// Step == Steps).
	Progress func(Progress)
}

// Progress tells where a run is.
type Progress struct {
	Step, Steps int
	Round       int // 0 while connecting and warming up
	Target      string
	Workload    string
}

func (c *Config) fill() error {
	if len(c.Targets) == 0 {
		return fmt.Errorf("%w: bench: no backend to measure", driver.ErrInvalid)
	}
	if c.Duration == 0 {
		c.Duration = DefaultDuration
	}
	if c.Rounds == 0 {
		c.Rounds = DefaultRounds
	}
	if c.Workers == 0 {
		c.Workers = DefaultWorkers
	}
	if c.Keys == 0 {
		c.Keys = DefaultKeys
	}
	if c.Waiters == nil {
		c.Waiters = DefaultWaiters
	}
	if c.WarmUp == 0 {
		c.WarmUp = min(c.Duration, 4*time.Second)
	}
	return c.Validate()
}

// Validate reports a configuration outside the limits (errors match
// driver.ErrInvalid). Zero values are filled with the defaults before it is called.
func (c *Config) Validate() error {
	bad := func(f string, a ...any) error {
		return fmt.Errorf("%w: bench: "+f, append([]any{driver.ErrInvalid}, a...)...)
	}
	switch {
	case c.Duration <= 0 || c.Duration > MaxDuration:
		return bad("duration %v is not in (0, %v]", c.Duration, MaxDuration)
	case c.Rounds < 1 || c.Rounds > MaxRounds:
		return bad("rounds %d is not in [1, %d]", c.Rounds, MaxRounds)
	case c.Workers < 2 || c.Workers > MaxWorkers:
		return bad("workers %d is not in [2, %d] (the hot key needs two to contend)", c.Workers, MaxWorkers)
	case c.Keys < 1 || c.Keys > MaxKeys:
		return bad("keys %d is not in [1, %d]", c.Keys, MaxKeys)
	case c.Duration/time.Duration(c.Rounds) < time.Millisecond:
		return bad("duration %v over %d rounds leaves less than 1ms per workload", c.Duration, c.Rounds)
	}
	for _, w := range c.Waiters {
		if w < 1 || w > MaxWaiters {
			return bad("waiters %d is not in [1, %d]", w, MaxWaiters)
		}
	}
	names := map[string]bool{}
	for _, t := range c.Targets {
		if _, _, err := parseTarget(t.URL); err != nil {
			return err
		}
		name := t.Name
		if name == "" {
			name = schemeOf(t.URL)
		}
		if names[name] {
			return bad("two backends are named %q (name them: NAME=URL)", name)
		}
		names[name] = true
	}
	return nil
}

func schemeOf(raw string) string {
	s, _, _ := strings.Cut(raw, "://")
	return s
}

// parseTarget splits a backend URL into its opener, the URL the opener sees (without
// the core's parameters) and the core options those parameters set.
func parseTarget(raw string) (*url.URL, []dlock.Option, error) {
	u, err := driver.ParseURL(raw) // host lists too; errors never repeat the user info
	if err != nil {
		return nil, nil, fmt.Errorf("bench: %w", err)
	}
	if u.Scheme == "" {
		return nil, nil, fmt.Errorf("%w: bench: backend URL needs a scheme such as redis://", driver.ErrInvalid)
	}
	if _, ok := driver.Lookup(u.Scheme); !ok {
		return nil, nil, fmt.Errorf("%w: bench: unknown backend scheme %q; registered: %s", driver.ErrInvalid, u.Scheme, strings.Join(driver.Schemes(), ", "))
	}
	p, err := driver.ParseParams(u) // a malformed pair is an error, never dropped
	if err != nil {
		return nil, nil, fmt.Errorf("bench: %w", err)
	}
	var opts []dlock.Option
	if d, err := p.Duration("ttl", 0); err != nil {
		return nil, nil, err
	} else if d > 0 {
		opts = append(opts, dlock.WithTTL(d))
	}
	if d, err := p.Duration("renew", 0); err != nil {
		return nil, nil, err
	} else if d > 0 {
		opts = append(opts, dlock.WithRenewInterval(d))
	}
	if f, err := p.Float("drift", -1); err != nil {
		return nil, nil, err
	} else if f >= 0 {
		opts = append(opts, dlock.WithDrift(f, dlock.DefaultDriftFixed))
	}
	if p.Has("owner") {
		return nil, nil, fmt.Errorf("%w: bench: the owner URL parameter would make every waiter the same owner; remove it", driver.ErrInvalid)
	}
	return driver.Without(u, "ttl", "renew", "drift"), opts, nil
}

// Run measures every target, in interleaved rounds, and returns the results. A
// backend that fails (cannot connect, or errs during a workload) gets its Error set
// and is left out of the later rounds; Run itself fails only on a bad Config or when
// ctx ends. Every workload is bounded in time (Duration) or in count (the waiter
// chains, each also bounded by ChainTimeout).
func Run(ctx context.Context, cfg Config) (*Result, error) {
	if err := cfg.fill(); err != nil {
		return nil, err
	}
	res := &Result{
		Started: time.Now().UTC().Truncate(time.Second),
		Machine: machine(),
		Settings: Settings{
			Duration: cfg.Duration, Rounds: cfg.Rounds, Workers: cfg.Workers, Keys: cfg.Keys,
			Waiters: slices.Clone(cfg.Waiters),
		},
	}
	start := time.Now()
	runID := driver.RandomHex(4)

	n := len(cfg.Targets)
	if cfg.Peers {
		for _, t := range cfg.Targets {
			n += len(peersOf(t.URL))
		}
	}
	steps := n*2 + cfg.Rounds*n*4
	step := 0
	report := func(round int, target, work string) {
		if cfg.Progress != nil {
			cfg.Progress(Progress{Step: step, Steps: steps, Round: round, Target: target, Workload: work})
		}
		step++
	}

	envs, err := openTargets(ctx, cfg, res, runID, report)
	defer func() {
		for _, e := range envs {
			if e != nil {
				e.close()
			}
		}
	}()
	if err != nil {
		return nil, err
	}
	for i, e := range envs {
		report(0, res.Backends[i].Name, WorkWarmUp)
		if e != nil && cfg.WarmUp > 0 {
			e.do(ctx, e.connect)
			e.do(ctx, func(ctx context.Context) error { return e.warmUp(ctx, cfg.WarmUp) })
			e.disconnect()
		}
	}
	per := cfg.Duration / time.Duration(cfg.Rounds)
	for round := 1; round <= cfg.Rounds; round++ {
		for i, e := range envs {
			name := res.Backends[i].Name
			if e != nil {
				e.do(ctx, e.connect)
			}
			for _, w := range []struct {
				name string
				f    func(context.Context) error
			}{
				{WorkCycle, func(ctx context.Context) error { return e.cycle(ctx, per) }},
				{WorkManyKeys, func(ctx context.Context) error { return e.manyKeys(ctx, per) }},
				{WorkHotKey, func(ctx context.Context) error { return e.hotKey(ctx, per) }},
				{WorkGrowth, func(ctx context.Context) error { return e.growth(ctx) }},
			} {
				report(round, name, w.name)
				if e != nil && res.Backends[i].can(w.name) {
					e.do(ctx, w.f)
				}
			}
			if e != nil {
				e.disconnect()
			}
		}
		if err := ctx.Err(); err != nil {
			return nil, context.Cause(ctx)
		}
	}
	for _, e := range envs {
		if e != nil && !e.failed {
			e.finish()
		}
	}
	if cfg.Peers {
		res.comparePeers()
	}
	res.Elapsed = time.Since(start).Round(time.Millisecond)
	res.Machine.LoadEnd = loadAvg()
	report(cfg.Rounds, "", "")
	return res, nil
}

// openTargets connects to every target, adding a result to res for each; a target
// that fails to open has its error in its result and a nil env. Only ctx ending is an
// error; the envs opened so far are returned with it, for closing.
//
// With cfg.Peers, every target is followed by the peers of its store (envs and
// res.Backends stay parallel), so that they run right after it in every round.
func openTargets(ctx context.Context, cfg Config, res *Result, runID string, report func(round int, target, work string)) ([]*targetEnv, error) {
	var envs []*targetEnv
	for _, t := range cfg.Targets {
		br := &BackendResult{Name: t.Name, URL: redact(t.URL), Note: t.Note, Store: storeOf(t.URL)}
		if br.Name == "" {
			br.Name = schemeOf(t.URL)
		}
		res.Backends = append(res.Backends, br)
		report(0, br.Name, WorkOpen)
		e, err := openTarget(ctx, cfg, t, br, runID)
		if err != nil {
			if ctx.Err() != nil {
				return envs, context.Cause(ctx)
			}
			br.Error = err.Error()
		}
		envs = append(envs, e)
		if !cfg.Peers {
			continue
		}
		for _, p := range peersOf(t.URL) {
			pr := &BackendResult{Name: p.name, URL: br.URL, Note: p.note, Store: p.store, Peer: true, PeerOf: br.Name,
				Cannot: append([]string{WorkGrowth}, p.cannot...)}
			if len(cfg.Targets) > 1 && sameStoreTwice(cfg.Targets, p.store) {
				pr.Name = p.name + "@" + br.Name
			}
			res.Backends = append(res.Backends, pr)
			report(0, pr.Name, WorkOpen)
			pe, err := openPeer(ctx, cfg, p, t, pr, runID)
			if err != nil {
				if ctx.Err() != nil {
					return envs, context.Cause(ctx)
				}
				pr.Error = err.Error()
			}
			if e != nil && pe != nil {
				e.paired = append(e.paired, pe)
			}
			envs = append(envs, pe)
		}
	}
	return envs, nil
}

// sameStoreTwice reports whether two targets run on store s (their peers then
// carry the target's name).
func sameStoreTwice(ts []Target, s string) bool {
	n := 0
	for _, t := range ts {
		if storeOf(t.URL) == s {
			n++
		}
	}
	return n > 1
}

func redact(raw string) string {
	u, err := driver.ParseURL(raw)
	if err != nil {
		return "(unparsable URL)"
	}
	return driver.Redact(u)
}

func machine() Machine {
	m := Machine{OS: runtime.GOOS, Arch: runtime.GOARCH, CPUs: runtime.NumCPU(), Go: runtime.Version(), LoadStart: loadAvg()}
	if cpus, err := Affinity(); err == nil && len(cpus) < runtime.NumCPU() {
		m.Pinned = FormatCPUs(cpus)
	}
	return m
}

// loadAvg returns the 1-minute load average, or NaN where unknown.
func loadAvg() Float {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return Float(math.NaN())
	}
	var f float64
	if _, err := fmt.Sscan(string(b), &f); err != nil {
		return Float(math.NaN())
	}
	return Float(f)
}

// Float is a float64 that is NaN when not measured, written as null in JSON.
type Float float64

// MarshalJSON writes NaN and infinities as null.
func (f Float) MarshalJSON() ([]byte, error) {
	v := float64(f)
	if math.IsNaN(v) || math.IsInf(v, 0) {
		return []byte("null"), nil
	}
	return json.Marshal(v)
}

// UnmarshalJSON reads null as NaN.
func (f *Float) UnmarshalJSON(b []byte) error {
	if string(b) == "null" {
		*f = Float(math.NaN())
		return nil
	}
	var v float64
	if err := json.Unmarshal(b, &v); err != nil {
		return err
	}
	*f = Float(v)
	return nil
}

// Valid reports whether f was measured.
func (f Float) Valid() bool { return !math.IsNaN(float64(f)) && !math.IsInf(float64(f), 0) }
