package bench

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
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
	"github.com/dlockio/dlock/internal/measure"
	"github.com/dlockio/dlock/internal/storeops"
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
	// WarmUp runs cycles on each backend before the first round, unrecorded
	// (a JIT-compiled server needs it). Zero means Duration/4, at most 1s; negative
	// means none.
	WarmUp time.Duration
	// Options are given to every client.
	Options []dlock.Option
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
		c.WarmUp = min(c.Duration/4, time.Second)
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
	var idb [4]byte
	_, _ = rand.Read(idb[:])
	runID := hex.EncodeToString(idb[:])

	steps := len(cfg.Targets)*2 + cfg.Rounds*len(cfg.Targets)*4
	step := 0
	report := func(round int, target, work string) {
		if cfg.Progress != nil {
			cfg.Progress(Progress{Step: step, Steps: steps, Round: round, Target: target, Workload: work})
		}
		step++
	}

	envs := make([]*targetEnv, len(cfg.Targets))
	defer func() {
		for _, e := range envs {
			if e != nil {
				e.close()
			}
		}
	}()
	for i, t := range cfg.Targets {
		br := &BackendResult{Name: t.Name, URL: redact(t.URL), Note: t.Note}
		if br.Name == "" {
			br.Name = schemeOf(t.URL)
		}
		res.Backends = append(res.Backends, br)
		report(0, br.Name, WorkOpen)
		e, err := openTarget(ctx, cfg, t, br, runID)
		if err != nil {
			if ctx.Err() != nil {
				return nil, context.Cause(ctx)
			}
			br.Error = err.Error()
			continue
		}
		envs[i] = e
	}
	for i, e := range envs {
		report(0, res.Backends[i].Name, WorkWarmUp)
		if e != nil && cfg.WarmUp > 0 {
			e.do(ctx, func(ctx context.Context) error { return e.warmUp(ctx, cfg.WarmUp) })
		}
	}
	per := cfg.Duration / time.Duration(cfg.Rounds)
	for round := 1; round <= cfg.Rounds; round++ {
		for i, e := range envs {
			name := res.Backends[i].Name
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
				if e != nil {
					e.do(ctx, w.f)
				}
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
	res.Elapsed = time.Since(start).Round(time.Millisecond)
	res.Machine.LoadEnd = loadAvg()
	report(cfg.Rounds, "", "")
	return res, nil
}

// targetEnv is one backend's connections and accumulated measurements.
type targetEnv struct {
	cfg    Config
	res    *BackendResult
	keys   string // key prefix of this run
	raw    []driver.Backend
	cl     []*dlock.Client
	obs    driver.Backend   // observer: inspection
	stores []storeops.Store // direct connections: [0] for floor cycles and server ops, one more per worker
	floor  measure.Floor
	ins    driver.Inspector
	ops    func(context.Context) (int64, error)
	opsOv  int64
	cnt    measure.Counts
	failed bool

	cycles   measure.CycleRun // all rounds
	handoffs measure.Samples  // hot key, all rounds
	manyAcq  int64            // dlock acquisitions, many keys
	manyT    time.Duration
	manyFAcq int64 // floor
	manyFT   time.Duration
	hotAcq   int64
	hotT     time.Duration
	chains   map[int]*measure.GrowthRun // summed over rounds
	cycOps   [2]int64                   // server ops, cycles (dlock cycle)
	cycCalls [2]int64
	flOps    [2]int64 // server ops, floor cycles
	overlaps int64
}

func openTarget(ctx context.Context, cfg Config, t Target, br *BackendResult, runID string) (*targetEnv, error) {
	u, uopts, err := parseTarget(t.URL)
	if err != nil {
		return nil, err
	}
	open, _ := driver.Lookup(u.Scheme)
	e := &targetEnv{cfg: cfg, res: br, keys: "dlock-bench." + runID + ".", chains: map[int]*measure.GrowthRun{}}
	octx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	e.obs, err = open(octx, u)
	if err != nil {
		return nil, err
	}
	opts := append(append([]dlock.Option{}, cfg.Options...), uopts...)
	for range cfg.Workers {
		b, err := open(octx, u)
		if err != nil {
			e.close()
			return nil, err
		}
		e.raw = append(e.raw, b)
		c, err := dlock.New(measure.Counting(b, &e.cnt), opts...)
		if err != nil {
			b.Close()
			e.raw = e.raw[:len(e.raw)-1]
			e.close()
			return nil, err
		}
		e.cl = append(e.cl, c)
	}
	e.ins, _ = e.obs.(driver.Inspector)
	br.Inspector = e.ins != nil
	_, br.Notifier = e.obs.(driver.Notifier)
	if err := e.openStores(octx, t.URL); err != nil {
		e.close()
		return nil, err
	}
	br.Floor = e.floor != nil
	if e.floor != nil {
		ov, err := measure.OpsOverhead(octx, e.stores[0].Ops)
		if err != nil {
			br.Notes = append(br.Notes, "server operations not counted: "+err.Error())
		} else {
			e.ops, e.opsOv = e.stores[0].Ops, ov
			br.OpsSource = e.stores[0].OpsSource()
		}
	}
	return e, nil
}

// openStores opens the direct connections to the target's store (internal/storeops)
// that the floor and the server-operation counts use: one for the observer and one
// per worker. A store with none (mem) has no floor.
func (e *targetEnv) openStores(ctx context.Context, rawURL string) error {
	for range 1 + e.cfg.Workers {
		st, err := storeops.Open(ctx, rawURL)
		if errors.Is(err, storeops.ErrUnsupported) {
			return nil
		}
		if err != nil {
			return fmt.Errorf("bench: direct connection for the floor: %w", err)
		}
		e.stores = append(e.stores, st)
	}
	e.floor = e.stores[0].FloorCycle
	return nil
}

func (e *targetEnv) close() {
	for _, c := range e.cl {
		_ = c.Close() // closes its backend
	}
	for _, b := range e.raw[len(e.cl):] {
		_ = b.Close()
	}
	if e.obs != nil {
		_ = e.obs.Close()
	}
	for _, st := range e.stores {
		_ = st.Close()
	}
	e.cl, e.raw, e.obs, e.stores = nil, nil, nil, nil
}

// do runs one workload unless the backend failed before, and records its failure.
func (e *targetEnv) do(ctx context.Context, f func(context.Context) error) {
	if e.failed || ctx.Err() != nil {
		return
	}
	if err := f(ctx); err != nil && ctx.Err() == nil {
		e.failed = true
		e.res.Error = err.Error()
		e.close()
	}
}

func (e *targetEnv) key(name string) string { return e.keys + name }

// peers are what the dlock cycles of workload name are paired with: the floor and
// the raw driver, each on a key of its own.
func (e *targetEnv) peers(name string) measure.CyclePeers {
	p := measure.CyclePeers{Driver: e.obs, DriverKey: e.key(name + "-driver")}
	if e.floor != nil {
		p.Floor, p.FloorKey = e.floor, e.key(name+"-floor")
	}
	return p
}

func (e *targetEnv) warmUp(ctx context.Context, d time.Duration) error {
	ctx, cancel := context.WithTimeout(ctx, d+time.Minute)
	defer cancel()
	var scratch measure.CycleRun
	if err := measure.Cycles(ctx, e.cl[0], e.key("warm-up"), e.peers("warm-up"), measure.Limit{Duration: d / 2}, &scratch); err != nil {
		return err
	}
	_, err := measure.Contend(ctx, e.cl, []string{e.key("warm-up")}, measure.Limit{Duration: d / 2})
	return err
}

func (e *targetEnv) cycle(ctx context.Context, d time.Duration) error {
	ctx, cancel := context.WithTimeout(ctx, d+time.Minute)
	defer cancel()
	var r measure.CycleRun
	if err := measure.Cycles(ctx, e.cl[0], e.key("cycle"), e.peers("cycle"), measure.Limit{Duration: d}, &r); err != nil {
		return err
	}
	round := RoundCycle{P50: r.Dlock.Percentile(0.5), N: r.Dlock.Count(), DriverP50: r.Driver.Percentile(0.5)}
	if r.Floor.Count() > 0 {
		round.FloorP50 = r.Floor.Percentile(0.5)
		round.Ratio = Float(measure.Ratio(float64(round.P50), float64(round.FloorP50)))
	} else {
		round.Ratio = Float(math.NaN())
	}
	e.res.Cycle.Rounds = append(e.res.Cycle.Rounds, round)
	e.cycles.Dlock.Merge(&r.Dlock)
	e.cycles.Driver.Merge(&r.Driver)
	e.cycles.Floor.Merge(&r.Floor)
	return nil
}

func (e *targetEnv) manyKeys(ctx context.Context, d time.Duration) error {
	ctx, cancel := context.WithTimeout(ctx, d+time.Minute)
	defer cancel()
	keys := make([]string, e.cfg.Keys)
	for i := range keys {
		keys[i] = e.key(fmt.Sprintf("many.%d", i))
	}
	dlockPart := func(d time.Duration) error {
		r, err := measure.Contend(ctx, e.cl, keys, measure.Limit{Duration: d})
		e.manyAcq += r.Acquisitions
		e.manyT += r.Elapsed
		e.overlaps += r.Overlaps
		return err
	}
	if e.floor == nil {
		return dlockPart(d)
	}
	floors := make([]measure.Floor, 0, len(e.stores)-1)
	for _, st := range e.stores[1:] {
		floors = append(floors, st.FloorCycle)
	}
	floorPart := func(d time.Duration) error {
		per := max(e.cfg.Keys/len(floors), 1)
		r, err := measure.FloorContend(ctx, floors, e.key("many-floor"), per, measure.Limit{Duration: d})
		e.manyFAcq += r.Acquisitions
		e.manyFT += r.Elapsed
		return err
	}
	// dlock, floor, floor, dlock: both halves see the same drift in machine load.
	for _, f := range []func(time.Duration) error{dlockPart, floorPart, floorPart, dlockPart} {
		if err := f(d / 4); err != nil {
			return err
		}
	}
	return nil
}

func (e *targetEnv) hotKey(ctx context.Context, d time.Duration) error {
	ctx, cancel := context.WithTimeout(ctx, d+time.Minute)
	defer cancel()
	r, err := measure.Contend(ctx, e.cl, []string{e.key("hot")}, measure.Limit{Duration: d})
	if err != nil {
		return err
	}
	e.hotAcq += r.Acquisitions
	e.hotT += r.Elapsed
	e.overlaps += r.Overlaps
	e.handoffs.Merge(&r.Handoff)
	lo, hi := measure.MinMax(r.Counts)
	e.res.HotKey.Rounds = append(e.res.HotKey.Rounds, RoundFairness{
		Counts: r.Counts, MinMax: Float(measure.Ratio(float64(lo), float64(hi))), Jain: measure.Jain(r.Counts),
		HandoffP50: r.Handoff.Percentile(0.5),
	})
	return nil
}

func (e *targetEnv) growth(ctx context.Context) error {
	// What an uncontended cycle costs, through dlock and on the floor.
	const n = 50
	{
		ctx, cancel := context.WithTimeout(ctx, time.Minute)
		defer cancel()
		var scratch measure.CycleRun
		ops0, calls0, err := e.readOps(ctx)
		if err != nil {
			return err
		}
		if err := measure.Cycles(ctx, e.cl[0], e.key("cost"), measure.CyclePeers{}, measure.Limit{N: n}, &scratch); err != nil {
			return err
		}
		ops1, calls1, err := e.readOps(ctx)
		if err != nil {
			return err
		}
		e.cycOps[0] += max(ops1-ops0-e.opsOv, 0)
		e.cycOps[1] += n
		e.cycCalls[0] += calls1 - calls0
		e.cycCalls[1] += n
		if e.floor != nil && e.ops != nil {
			if err := measure.FloorCycles(ctx, e.floor, e.key("cost-floor"), measure.Limit{N: n}, &scratch.Floor); err != nil {
				return err
			}
			ops2, _, err := e.readOps(ctx)
			if err != nil {
				return err
			}
			e.flOps[0] += max(ops2-ops1-e.opsOv, 0)
			e.flOps[1] += n
		}
	}
	pool := e.cl[1:]
	for _, w := range e.cfg.Waiters {
		g := e.chains[w]
		if g == nil {
			g = &measure.GrowthRun{Waiters: w, Queued: true}
			e.chains[w] = g
		}
		// Short chains are repeated, so that every length adds up to at least
		// MinChainHandoffs handoffs per round.
		for range (MinChainHandoffs + w - 1) / w {
			cctx, cancel := context.WithTimeout(ctx, ChainTimeout)
			o := measure.GrowthOptions{Inspector: e.ins, Ops: e.ops, OpsOverhead: e.opsOv, Calls: e.cnt.Calls, Locked: e.cnt.Locked}
			r, err := measure.Growth(cctx, e.cl[0], pool, e.key(fmt.Sprintf("waiters.%d", w)), w, o)
			cancel()
			if err != nil {
				return err
			}
			g.Handoffs += r.Handoffs
			g.Elapsed += r.Elapsed
			g.Ops += r.Ops
			g.Calls += r.Calls
			g.Queued = g.Queued && (r.Queued || e.ins == nil)
		}
	}
	return nil
}

func (e *targetEnv) readOps(ctx context.Context) (ops, calls int64, err error) {
	if e.ops != nil {
		if ops, err = e.ops(ctx); err != nil {
			return 0, 0, fmt.Errorf("bench: server ops: %w", err)
		}
	}
	return ops, e.cnt.Calls(), nil
}

// finish turns the accumulated measurements into the backend's results.
func (e *targetEnv) finish() {
	br := e.res
	br.Overlaps = e.overlaps
	br.samples.cycle, br.samples.floor, br.samples.handoff = &e.cycles.Dlock, &e.cycles.Floor, &e.handoffs
	c := &br.Cycle
	c.Dlock = e.cycles.Dlock.Summary()
	c.Driver = e.cycles.Driver.Summary()
	c.DriverRatio = Float(math.NaN())
	c.PerSecond = measure.PerSecond(e.cycles.Dlock.Count(), e.cycles.Dlock.Sum())
	c.Ratio, c.FloorPerSecond = Float(math.NaN()), Float(math.NaN())
	if e.cycles.Floor.Count() > 0 {
		f := e.cycles.Floor.Summary()
		c.Floor = &f
		c.FloorPerSecond = Float(measure.PerSecond(f.N, e.cycles.Floor.Sum()))
		c.Ratio = Float(measure.Ratio(float64(c.Dlock.P50), float64(f.P50)))
		c.DriverRatio = Float(measure.Ratio(float64(c.Driver.P50), float64(f.P50)))
	}
	m := &br.ManyKeys
	m.Workers, m.Keys = e.cfg.Workers, e.cfg.Keys
	m.Acquisitions, m.PerSecond = e.manyAcq, measure.PerSecond(e.manyAcq, e.manyT)
	m.FloorPerSecond, m.Ratio = Float(math.NaN()), Float(math.NaN())
	if e.manyFAcq > 0 {
		m.FloorPerSecond = Float(measure.PerSecond(e.manyFAcq, e.manyFT))
		m.Ratio = Float(measure.Ratio(m.PerSecond, float64(m.FloorPerSecond)))
	}
	h := &br.HotKey
	h.Workers = e.cfg.Workers
	h.Acquisitions, h.PerSecond = e.hotAcq, measure.PerSecond(e.hotAcq, e.hotT)
	h.Handoff = e.handoffs.Summary()
	h.HandoffFloorRatio = Float(math.NaN())
	if c.Floor != nil {
		h.HandoffFloorRatio = Float(measure.Ratio(float64(h.Handoff.P50), float64(c.Floor.P50)))
	}
	h.MinMax, h.Jain = Float(math.NaN()), Float(math.NaN())
	for i, r := range h.Rounds {
		if i == 0 || float64(r.MinMax) < float64(h.MinMax) || math.IsNaN(float64(h.MinMax)) {
			h.MinMax = r.MinMax
			h.Worst = i + 1
			h.MinPerWorker, h.MaxPerWorker = measure.MinMax(r.Counts)
		}
		if i == 0 || r.Jain < float64(h.Jain) {
			h.Jain = Float(r.Jain)
		}
	}
	br.CycleCost = Cost{ServerOps: Float(math.NaN()), Calls: Float(measure.Ratio(float64(e.cycCalls[0]), float64(e.cycCalls[1])))}
	br.FloorOps = Float(math.NaN())
	if e.ops != nil {
		br.CycleCost.ServerOps = Float(measure.Ratio(float64(e.cycOps[0]), float64(e.cycOps[1])))
		if e.flOps[1] > 0 {
			br.FloorOps = Float(measure.Ratio(float64(e.flOps[0]), float64(e.flOps[1])))
		}
	}
	for _, w := range e.cfg.Waiters {
		g := e.chains[w]
		if g == nil {
			continue
		}
		p := GrowthPoint{Waiters: w, Handoffs: g.Handoffs, PerSecond: measure.PerSecond(g.Handoffs, g.Elapsed),
			Cost:   Cost{ServerOps: Float(math.NaN()), Calls: Float(measure.Ratio(float64(g.Calls), float64(g.Handoffs)))},
			Queued: g.Queued}
		if e.ops != nil {
			p.Cost.ServerOps = Float(measure.Ratio(float64(g.Ops), float64(g.Handoffs)))
		}
		br.Growth = append(br.Growth, p)
	}
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
