package bench

import (
	"encoding/json"
	"io"
	"math"
	"time"

	"github.com/dlockio/dlock/internal/measure"
)

// Result is the outcome of Run. Latencies are in nanoseconds in JSON; values that
// were not measured (a backend without a floor or without server counters) are NaN
// in Go and null in JSON.
type Result struct {
	Started  time.Time        `json:"started"`
	Elapsed  time.Duration    `json:"elapsed_ns"`
	Machine  Machine          `json:"machine"`
	Settings Settings         `json:"settings"`
	Backends []*BackendResult `json:"backends"`
}

// Machine describes where the run happened.
type Machine struct {
	OS   string `json:"os"`
	Arch string `json:"arch"`
	CPUs int    `json:"cpus"`
	Go   string `json:"go"`
	// Pinned lists the CPUs the process was restricted to (taskset syntax), empty
	// when it could use every CPU.
	Pinned string `json:"pinned,omitempty"`
	// LoadStart and LoadEnd are the 1-minute load averages at the start and end.
	LoadStart Float `json:"load_start"`
	LoadEnd   Float `json:"load_end"`
}

// Settings are the run's parameters.
type Settings struct {
	Duration time.Duration `json:"duration_ns"`
	Rounds   int           `json:"rounds"`
	Workers  int           `json:"workers"`
	Keys     int           `json:"keys"`
	Waiters  []int         `json:"waiters"`
}

// BackendResult holds one backend's measurements over every round.
type BackendResult struct {
	Name string `json:"name"`
	URL  string `json:"url"` // password redacted
	Note string `json:"note,omitempty"`
	// Error is set when the backend failed; its other results are then empty.
	Error string   `json:"error,omitempty"`
	Notes []string `json:"notes,omitempty"`

	// Peer is set for a peer (a lock library dlock is measured beside, see
	// Config.Peers), run on the servers of the backend named PeerOf.
	Peer   bool   `json:"peer,omitempty"`
	PeerOf string `json:"peer_of,omitempty"`
	// Store is the store the backend runs on (redis, redlock, etcd, zk,
	// postgres), empty for one without peers (mem).
	Store string `json:"store,omitempty"`
	// Cannot lists the workloads a peer cannot run; their cells say so.
	Cannot []string `json:"cannot,omitempty"`
	// VsPeers compares a dlock backend with the best peer of its store, when
	// peers ran.
	VsPeers *PeerRatios `json:"vs_peers,omitempty"`

	// Capabilities of the backend's driver.
	Floor     bool `json:"floor"`
	Notifier  bool `json:"notifier"`
	Inspector bool `json:"inspector"`
	// OpsSource says what the server operations count; empty when the backend
	// cannot count them (driver calls are counted in any case).
	OpsSource string `json:"ops_source,omitempty"`

	Cycle    CycleResult    `json:"cycle"`
	ManyKeys ManyKeysResult `json:"many_keys"`
	HotKey   HotKeyResult   `json:"hot_key"`
	// CycleCost is what one uncontended Lock+Release costs; FloorOps the server
	// operations of one floor cycle.
	CycleCost Cost          `json:"cycle_cost"`
	FloorOps  Float         `json:"floor_ops"`
	Growth    []GrowthPoint `json:"growth"`
	// Overlaps counts acquisitions that found another worker holding the same
	// key (a mutual exclusion failure); it should be 0.
	Overlaps int64 `json:"overlaps"`

	samples struct{ cycle, floor, handoff *measure.Samples } // for the charts
}

// PeerRatios compare a dlock backend with the best peer of its store in the same
// run (NaN, and no name, when no peer of the store ran the workload).
type PeerRatios struct {
	// CycleP50 is dlock's uncontended p50 over the lowest peer p50: below 1 is
	// faster.
	CycleP50  Float  `json:"cycle_p50"`
	CycleBest string `json:"cycle_best,omitempty"`
	// ManyKeys and HotKey are dlock's acquisitions/s over the highest peer's:
	// above 1 is faster.
	ManyKeys     Float  `json:"many_keys"`
	ManyKeysBest string `json:"many_keys_best,omitempty"`
	HotKey       Float  `json:"hot_key"`
	HotKeyBest   string `json:"hot_key_best,omitempty"`
	// CycleP50Rounds and HotKeyRounds are the same ratios round by round, against
	// the same best peer (the rounds interleave every backend, so each pair ran
	// under the same machine load).
	CycleP50Rounds []Float `json:"cycle_p50_rounds,omitempty"`
	HotKeyRounds   []Float `json:"hot_key_rounds,omitempty"`
}

// CycleResult is the uncontended Lock+Release cycle and its floor.
type CycleResult struct {
	Dlock     measure.Latency `json:"dlock"`
	PerSecond float64         `json:"per_second"`
	// Driver is the backend driver's Acquire+Release called directly: the cycle
	// without the dlock core.
	Driver         measure.Latency  `json:"driver"`
	Floor          *measure.Latency `json:"floor,omitempty"`
	FloorPerSecond Float            `json:"floor_per_second"`
	// Ratio is the dlock p50 over the floor p50, over all rounds; DriverRatio
	// the driver's p50 over the floor p50.
	Ratio       Float        `json:"ratio"`
	DriverRatio Float        `json:"driver_ratio"`
	Rounds      []RoundCycle `json:"rounds"`
}

// RoundCycle is one round's cycle medians.
type RoundCycle struct {
	N         int64         `json:"n"`
	P50       time.Duration `json:"p50_ns"`
	DriverP50 time.Duration `json:"driver_p50_ns"`
	FloorP50  time.Duration `json:"floor_p50_ns"`
	Ratio     Float         `json:"ratio"`
}

// ManyKeysResult is W workers over K keys.
type ManyKeysResult struct {
	Workers        int     `json:"workers"`
	Keys           int     `json:"keys"`
	Acquisitions   int64   `json:"acquisitions"`
	PerSecond      float64 `json:"per_second"`
	FloorPerSecond Float   `json:"floor_per_second"`
	Ratio          Float   `json:"ratio"`
}

// HotKeyResult is W workers on one key.
type HotKeyResult struct {
	Workers      int     `json:"workers"`
	Acquisitions int64   `json:"acquisitions"`
	PerSecond    float64 `json:"per_second"`
	// Handoff runs from a Release call to the next holder's Lock returning.
	Handoff measure.Latency `json:"handoff"`
	// HandoffFloorRatio is the handoff p50 over the floor cycle p50.
	HandoffFloorRatio Float `json:"handoff_floor_ratio"`
	// Fairness of the worst round: acquisitions of the least and most served
	// worker, their ratio, and Jain's index (the lowest of the rounds).
	MinPerWorker int64           `json:"min_per_worker"`
	MaxPerWorker int64           `json:"max_per_worker"`
	MinMax       Float           `json:"min_max"`
	Jain         Float           `json:"jain"`
	Worst        int             `json:"worst_round"`
	Rounds       []RoundFairness `json:"rounds"`
}

// RoundFairness is one round of the hot key.
type RoundFairness struct {
	Counts     []int64       `json:"counts"`
	MinMax     Float         `json:"min_max"`
	Jain       float64       `json:"jain"`
	HandoffP50 time.Duration `json:"handoff_p50_ns"`
	PerSecond  float64       `json:"per_second"`
}

// Cost is what something costs in server operations (NaN when the backend cannot
// count them) and in driver calls.
type Cost struct {
	ServerOps Float `json:"server_ops"`
	Calls     Float `json:"driver_calls"`
}

// GrowthPoint is the cost of a handoff with a given number of waiters queued.
type GrowthPoint struct {
	Waiters  int   `json:"waiters"`
	Handoffs int64 `json:"handoffs"`
	// PerSecond is handoffs per second down the chain of waiters.
	PerSecond float64 `json:"per_second"`
	// Cost is per handoff.
	Cost Cost `json:"cost"`
	// Queued is false if the backend's Inspector did not show every waiter queued
	// before the first release in some round.
	Queued bool `json:"queued"`
}

// can reports whether the backend runs workload w (every dlock backend does).
func (br *BackendResult) can(w string) bool {
	for _, c := range br.Cannot {
		if c == w {
			return false
		}
	}
	return true
}

// comparePeers sets VsPeers on every dlock backend whose store had peers.
func (r *Result) comparePeers() {
	for _, br := range r.Backends {
		if br.Peer || br.Error != "" || br.Store == "" {
			continue
		}
		v := PeerRatios{CycleP50: Float(math.NaN()), ManyKeys: Float(math.NaN()), HotKey: Float(math.NaN())}
		any := false
		var cyc time.Duration
		var many, hot float64
		var cycPeer, hotPeer *BackendResult
		for _, p := range r.Backends {
			if !p.Peer || p.Error != "" || p.Store != br.Store {
				continue
			}
			any = true
			if p.can(WorkCycle) && p.Cycle.Dlock.P50 > 0 && (cyc == 0 || p.Cycle.Dlock.P50 < cyc) {
				cyc, v.CycleBest, cycPeer = p.Cycle.Dlock.P50, p.Name, p
			}
			if p.can(WorkManyKeys) && p.ManyKeys.PerSecond > many {
				many, v.ManyKeysBest = p.ManyKeys.PerSecond, p.Name
			}
			if p.can(WorkHotKey) && p.HotKey.PerSecond > hot {
				hot, v.HotKeyBest, hotPeer = p.HotKey.PerSecond, p.Name, p
			}
		}
		if !any {
			continue
		}
		if cyc > 0 {
			v.CycleP50 = Float(measure.Ratio(float64(br.Cycle.Dlock.P50), float64(cyc)))
		}
		if many > 0 {
			v.ManyKeys = Float(measure.Ratio(br.ManyKeys.PerSecond, many))
		}
		if hot > 0 {
			v.HotKey = Float(measure.Ratio(br.HotKey.PerSecond, hot))
		}
		if cycPeer != nil && len(cycPeer.Cycle.Rounds) == len(br.Cycle.Rounds) {
			for i, rc := range br.Cycle.Rounds {
				v.CycleP50Rounds = append(v.CycleP50Rounds, Float(measure.Ratio(float64(rc.P50), float64(cycPeer.Cycle.Rounds[i].P50))))
			}
		}
		if hotPeer != nil && len(hotPeer.HotKey.Rounds) == len(br.HotKey.Rounds) {
			for i, rf := range br.HotKey.Rounds {
				v.HotKeyRounds = append(v.HotKeyRounds, Float(measure.Ratio(rf.PerSecond, hotPeer.HotKey.Rounds[i].PerSecond)))
			}
		}
		br.VsPeers = &v
	}
}

// WriteJSON writes r as indented JSON.
func (r *Result) WriteJSON(w io.Writer) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(r)
}

// Failed reports whether any backend failed.
func (r *Result) Failed() bool {
	for _, b := range r.Backends {
		if b.Error != "" {
			return true
		}
	}
	return false
}
