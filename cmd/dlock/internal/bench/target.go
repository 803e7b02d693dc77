package bench

import (
	"context"
	"errors"
	"fmt"
	"math"
	"net/url"
	"time"

	"github.com/dlockio/dlock"
	"github.com/dlockio/dlock/driver"
	"github.com/dlockio/dlock/internal/measure"
	"github.com/dlockio/dlock/internal/storeops"
	_ "github.com/dlockio/dlock/internal/storeops/etcdops" // the floors and counts of every store
	_ "github.com/dlockio/dlock/internal/storeops/mysqlops"
	_ "github.com/dlockio/dlock/internal/storeops/pgops"
	_ "github.com/dlockio/dlock/internal/storeops/redisops"
	_ "github.com/dlockio/dlock/internal/storeops/zkops"
)

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
	peer     *peerDef // set for a peer (see peers.go): no floor, driver or growth
	peerURL  *url.URL

	// A dlock backend's cycles are paired, cycle by cycle, with those of the peers
	// of its store (paired); a peer whose cycles of this round were so measured
	// (pairedRound) does not run them again alone.
	paired      []*targetEnv
	pairedRound bool
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
	if e.obs == nil {
		return measure.CyclePeers{} // a peer (peers.go) runs its own cycles alone
	}
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
	if e.pairedRound {
		e.pairedRound = false
		return nil // measured beside its dlock backend's cycles (pairPeers)
	}
	ctx, cancel := context.WithTimeout(ctx, d+time.Minute)
	defer cancel()
	var r measure.CycleRun
	peers := e.peers("cycle")
	joined := e.pairPeers(ctx, &peers)
	defer func() {
		for _, p := range joined {
			p.disconnect()
		}
	}()
	if err := measure.Cycles(ctx, e.cl[0], e.key("cycle"), peers, measure.Limit{Duration: d}, &r); err != nil {
		return err
	}
	for i, p := range joined {
		p.pairedCycles(ctx, peers.Others[i])
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

// pairPeers connects one client of each peer of a dlock backend's store and adds
// it to peers.Others, so that its cycles run in the same loop as dlock's; it
// returns the peers joined, in the order of peers.Others. A peer that cannot
// connect is marked failed, as its own turn would mark it.
func (e *targetEnv) pairPeers(ctx context.Context, peers *measure.CyclePeers) []*targetEnv {
	var joined []*targetEnv
	for _, p := range e.paired {
		if p.failed || !p.res.can(WorkCycle) {
			continue
		}
		p.do(ctx, func(ctx context.Context) error { return p.connectPeer(ctx, 1) })
		if p.failed || len(p.cl) == 0 {
			continue
		}
		joined = append(joined, p)
		peers.Others = append(peers.Others, &measure.Paired{Client: p.cl[0], Key: p.key("cycle")})
	}
	return joined
}

// pairedCycles records the cycles of peer e that its dlock backend's loop measured
// (pairPeers) as e's round, or e's failure.
func (e *targetEnv) pairedCycles(ctx context.Context, r *measure.Paired) {
	if r.Err != nil {
		e.do(ctx, func(context.Context) error { return r.Err })
		return
	}
	e.res.Cycle.Rounds = append(e.res.Cycle.Rounds, RoundCycle{P50: r.Samples.Percentile(0.5), N: r.Samples.Count(), Ratio: Float(math.NaN())})
	e.cycles.Dlock.Merge(&r.Samples)
	e.pairedRound = true
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
		HandoffP50: r.Handoff.Percentile(0.5), PerSecond: measure.PerSecond(r.Acquisitions, r.Elapsed),
	})
	return nil
}

func (e *targetEnv) growth(ctx context.Context) error {
	if e.peer != nil {
		return nil // no queue to inspect, no server counts: not a peer's workload
	}
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

// connect opens a peer's connections for its turn in a round (a dlock backend stays
// connected for the whole run).
func (e *targetEnv) connect(ctx context.Context) error {
	if e.peer == nil || len(e.cl) > 0 {
		return nil
	}
	return e.connectPeer(ctx, e.cfg.Workers)
}

// disconnect closes a peer's connections after its turn.
func (e *targetEnv) disconnect() {
	if e.peer != nil {
		e.close()
	}
}
