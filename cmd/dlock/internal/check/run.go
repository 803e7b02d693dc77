package check

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"os/exec"
	"slices"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/dlockio/dlock/cmd/dlock/internal/check/history"
	"github.com/dlockio/dlock/internal/testserver"
)

// Config is one check run: one backend setup, one fault, one resource, fenced or
// not.
type Config struct {
	Setup string // a name from Setups
	Fault string // a name from Faults; "none" for a run without faults
	// Resource is what the workers write to from their critical sections: a
	// name from Resources; "" is ResourceStore, the checker's own store. A real
	// resource (postgres, redis, etcd) runs on a server of its own, which no
	// fault touches.
	Resource string
	// Fenced: the store rejects writes with an older token; on a real resource,
	// every write goes through the resource's guard (without it, the same write
	// without the token check).
	Fenced bool
	// Election: the workers campaign for each key as an election (Campaign,
	// Resign) and write as leaders, instead of taking it as a lock.
	Election bool
	// Limit > 1 makes each key a semaphore of Limit permits (dlock.WithLimit): P1
	// then counts more than Limit holders at once, and P3 does not apply (the
	// holders of a semaphore overlap by design; no token orders their writes).
	Limit int
	// RW makes each key a read-write lock: three acquisitions in four are shared
	// (readers, who do not write), the rest exclusive (writers). P1 then counts a
	// writer beside anyone and a reader beside a writer.
	RW       bool
	Workers  int           // worker processes (default 5)
	Keys     int           // keys they contend for (default 2)
	Duration time.Duration // how long the workload runs (default 10s); with a target, the most it runs
	// Acquisitions and Injections, when either is set, are a target: the workload
	// runs until its workers have made at least Acquisitions grants and at least
	// Injections injections of the fault have completed (healed), or until
	// Duration, whichever comes first. Injections is ignored for fault "none".
	Acquisitions int
	Injections   int
	TTL          time.Duration // lock TTL (default 1s; etcd and ZooKeeper round up to whole seconds)
	Hold         time.Duration // time a worker holds each lease (default TTL/10)
	Interval     time.Duration // time from a heal (for leader kills: and every worker's next write) to the next injection (default 3*TTL, jittered)
	Seed         int64         // random seed of the schedule and the workers (0: from the time)
	// Worker is the command that runs one worker process; the worker's flags are
	// appended (for the dlock command: its own path and "check-worker").
	Worker []string
	// Env is added to the worker processes' environment.
	Env []string
	// Log, if set, receives one line per fault and per worker problem.
	Log io.Writer
}

func (c *Config) defaults() {
	if c.Fault == "" {
		c.Fault = FaultNone
	}
	if c.Resource == "" {
		c.Resource = ResourceStore
	}
	if c.Workers == 0 {
		c.Workers = 5
	}
	if c.Keys == 0 {
		c.Keys = 2
	}
	if c.Duration == 0 {
		c.Duration = 10 * time.Second
	}
	if c.TTL == 0 {
		c.TTL = time.Second
	}
	if c.Hold == 0 {
		c.Hold = c.TTL / 10
	}
	if c.Interval == 0 {
		c.Interval = 3 * c.TTL
	}
	if c.Seed == 0 {
		c.Seed = time.Now().UnixNano()
	}
}

// Validate reports a configuration that cannot run, naming the problem.
func (c Config) Validate() error {
	s, ok := setups[c.Setup]
	if !ok {
		return fmt.Errorf("unknown setup %q (known: %s)", c.Setup, strings.Join(Setups(), ", "))
	}
	f, ok := faults[c.Fault]
	if !ok {
		return fmt.Errorf("unknown fault %q (known: %s)", c.Fault, strings.Join(Faults(), ", "))
	}
	if !f.appliesTo(s) {
		return fmt.Errorf("fault %q does not apply to setup %q (it applies to: %s)", c.Fault, c.Setup, strings.Join(f.setupsFor(), ", "))
	}
	if c.Resource != "" && resourceDocs[c.Resource] == "" {
		return fmt.Errorf("unknown resource %q (known: %s)", c.Resource, strings.Join(Resources(), ", "))
	}
	switch {
	case c.Workers < 1 || c.Workers > 64:
		return fmt.Errorf("workers %d: give 1 to 64", c.Workers)
	case c.Keys < 1 || c.Keys > 1000:
		return fmt.Errorf("keys %d: give 1 to 1000", c.Keys)
	case c.Limit < 0 || c.Limit > 64:
		return fmt.Errorf("limit %d: give 1 to 64 (0 for a lock)", c.Limit)
	case c.RW && (c.Limit > 1 || c.Election):
		return fmt.Errorf("read-write locks go with neither a limit nor an election")
	case c.Limit > 1 && c.Election:
		return fmt.Errorf("an election has one leader: limit %d and election do not go together", c.Limit)
	case c.Duration < time.Second || c.Duration > 24*time.Hour:
		return fmt.Errorf("duration %v: give 1s to 24h", c.Duration)
	case c.TTL < 100*time.Millisecond || c.TTL > time.Minute:
		return fmt.Errorf("ttl %v: give 100ms to 1m", c.TTL)
	case c.Hold < 0 || c.Hold >= c.TTL:
		return fmt.Errorf("hold %v: give 0 to less than the TTL", c.Hold)
	case c.Interval < c.TTL:
		return fmt.Errorf("interval %v: give at least the TTL", c.Interval)
	case c.Acquisitions < 0 || c.Injections < 0:
		return fmt.Errorf("acquisitions %d, injections %d: give 0 (no target) or more", c.Acquisitions, c.Injections)
	case len(c.Worker) == 0:
		return errors.New("no worker command")
	}
	return nil
}

// Run starts the setup's servers, the resource (the checker's store, or a real
// server) and the worker processes, injects the fault every Interval while the
// workload runs for Duration, stops everything and returns the history. On a real
// resource the history's Writes are read back from the resource's own log after
// the workers stopped (see resourceWrites). Servers and workers are killed if this
// process dies. Run is one script (about 95 lines) on purpose: each step's teardown
// is a defer right after it, in the order the steps start.
func Run(ctx context.Context, cfg Config) (*history.History, error) {
	cfg.defaults()
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	s, f := setups[cfg.Setup], faults[cfg.Fault]
	ttl := s.roundTTL(cfg.TTL)
	host, err := testserver.NewHost("dlock-check")
	if err != nil {
		return nil, err
	}
	defer host.Close()
	tg, err := testserver.Try(host, func(tb testserver.TB) *target { return s.start(tb, ttl) })
	if err != nil {
		return nil, fmt.Errorf("start %s: %w", cfg.Setup, err)
	}
	var store *Store
	var res *resource
	if cfg.Resource == ResourceStore {
		if store, err = StartStore(cfg.Fenced); err != nil {
			return nil, err
		}
		defer store.Close()
	} else if res, err = testserver.Try(host, func(tb testserver.TB) *resource { return startResource(tb, cfg.Resource) }); err != nil {
		return nil, fmt.Errorf("start resource %s: %w", cfg.Resource, err)
	}

	r := &run{cfg: cfg, ttl: ttl, tg: tg, rnd: rand.New(rand.NewPCG(uint64(cfg.Seed), 0x5eed)), lastWrite: map[string]history.Op{}}
	r.h.Meta = history.Meta{
		Backend: s.name + ": " + s.describe, URL: tg.redactedURL(), Fault: cfg.Fault, Fenced: cfg.Fenced, TTL: ttl,
		Hold: s.hold(ttl), Workers: cfg.Workers, Keys: cfg.Keys, Seed: cfg.Seed,
		Expected: Expected(cfg.Setup, cfg.Fault, cfg.Fenced), HeldRecorded: true, Resource: ResourceStore,
		Limit: cfg.Limit, RW: cfg.RW,
	}
	storeAddr := ""
	if store != nil {
		storeAddr = store.Addr()
	} else {
		r.h.Meta.Resource = cfg.Resource + ": " + res.desc
		r.resURL = res.url
	}
	defer tg.stopProxies()
	if s.proxied {
		if err := tg.startProxies(cfg.Workers); err != nil {
			return nil, err
		}
	}
	if tg.nodes != nil {
		if err := tg.startNodeProxies(cfg.Workers); err != nil {
			return nil, err
		}
	}
	for i := 1; i <= cfg.Workers; i++ {
		if err := r.startWorker(i, storeAddr); err != nil {
			r.stopWorkers()
			return nil, err
		}
	}
	r.h.Meta.Start = history.Now()
	wctx, cancel := context.WithTimeout(ctx, cfg.Duration)
	defer cancel()
	var faultErr error
	if cfg.Fault != FaultNone {
		faultErr = r.schedule(wctx, f)
		if r.targeted() && wctx.Err() == nil {
			// The target was met right after an injection healed: give the
			// workers time to show liveness after it.
			sleep(wctx, cfg.Interval/2)
		}
	} else {
		r.awaitTarget(wctx)
	}
	r.h.Meta.End = history.Now()
	r.stopWorkers()
	var logErr error
	if store != nil {
		r.h.Writes = store.Writes()
	} else {
		lctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 30*time.Second)
		log, err := res.log(lctx)
		cancel()
		if err != nil {
			logErr = err
		}
		r.mu.Lock()
		r.h.Writes = resourceWrites(log, r.h.Ops)
		r.mu.Unlock()
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	slices.SortFunc(r.h.Ops, func(a, b history.Op) int { return cmpInt64(a.Start, b.Start) })
	if err := ctx.Err(); err != nil {
		return &r.h, err
	}
	return &r.h, errors.Join(faultErr, r.workerErr, logErr)
}

func cmpInt64(a, b int64) int {
	switch {
	case a < b:
		return -1
	case a > b:
		return 1
	}
	return 0
}

// run is the state of one Run.
type run struct {
	cfg Config
	ttl time.Duration
	tg  *target
	rnd *rand.Rand // used by the scheduler goroutine only
	// resURL is the real resource's URL for the workers ("" for the store).
	resURL string

	mu          sync.Mutex
	h           history.History
	workers     []*proc
	workerErr   error
	lastWrite   map[string]history.Op // the latest write op recorded per key
	wrote       map[int]int64         // per worker: End of its latest write the store answered
	acquired    int                   // OK acquires recorded
	injected    int                   // injections that injected and healed without error
	faultEvents int                   // Fault events recorded
}

// targeted reports whether the run has a target (Config.Acquisitions or
// Config.Injections) rather than running for Duration.
func (r *run) targeted() bool { return r.cfg.Acquisitions > 0 || r.cfg.Injections > 0 }

// targetMet reports whether the run has a target and has met it.
func (r *run) targetMet() bool {
	if !r.targeted() {
		return false
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.acquired >= r.cfg.Acquisitions && (r.cfg.Fault == FaultNone || r.injected >= r.cfg.Injections)
}

// awaitTarget waits until ctx ends or the target is met.
func (r *run) awaitTarget(ctx context.Context) {
	if !r.targeted() {
		<-ctx.Done()
		return
	}
	t := time.NewTicker(100 * time.Millisecond)
	defer t.Stop()
	for !r.targetMet() {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// noteWrite keeps the latest write per key and, per worker, the end of its latest
// answered write. r.mu must be held.
func (r *run) noteWrite(op history.Op) {
	r.lastWrite[op.Key] = op
	if op.OK && op.End > r.wrote[op.Process] {
		if r.wrote == nil {
			r.wrote = map[int]int64{}
		}
		r.wrote[op.Process] = op.End
	}
}

// recovered reports whether every worker that is still running has had a write
// answered that ended at or after t.
func (r *run) recovered(t int64) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, p := range r.workers {
		select {
		case <-p.done:
			continue
		default:
		}
		if r.wrote[p.id] < t {
			return false
		}
	}
	return true
}

// awaitRecovery waits until every running worker had a write answered that ended
// at or after t, or until ctx ends or max passed. The scheduler calls it after a
// heal, so that the next injection hits a workload that recovered from the last
// one: a backend whose clients take longer than --interval to come back after a
// failover (ZooKeeper's sessions after a leader election) is then still measured
// fault by fault, not kept down by faults in a row.
func (r *run) awaitRecovery(ctx context.Context, t int64, max time.Duration) {
	deadline := time.Now().Add(max)
	for ctx.Err() == nil && time.Now().Before(deadline) && !r.recovered(t) {
		sleep(ctx, 20*time.Millisecond)
	}
}

// wroteSince reports whether a worker other than p recorded a write to key that
// began at or after t.
func (r *run) wroteSince(key string, p *proc, t int64) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	w, ok := r.lastWrite[key]
	return ok && w.Process != p.id && w.Start >= t
}

func (r *run) logf(format string, a ...any) {
	if r.cfg.Log != nil {
		fmt.Fprintf(r.cfg.Log, format+"\n", a...)
	}
}

func (r *run) event(kind, fault, target, detail string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.h.Events = append(r.h.Events, history.Event{Time: history.Now(), Kind: kind, Fault: fault, Target: target, Detail: detail})
	if kind == history.Fault {
		r.faultEvents++
	}
	if kind != history.Note || fault != "" {
		r.logf("%s %s %s %s", kind, fault, target, detail)
	}
}

// proc is one worker process.
type proc struct {
	id     int
	cmd    *exec.Cmd
	stdin  io.WriteCloser
	done   chan struct{}
	paused chan struct{} // receives when the worker stopped itself after a lease check

	mu      sync.Mutex
	holding bool       // holds a lease now (from its ops)
	cur     history.Op // the OK acquire of the lease held now, or last held
	renewed int64      // Start of the latest OK renewal of cur (0: none yet)
}

// lease returns the worker's current (or last) grant, whether it still holds it,
// and when its latest OK renewal began (0 if none).
func (p *proc) lease() (cur history.Op, holding bool, renewed int64) {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.cur, p.holding, p.renewed
}

func (p *proc) send(line string) {
	_, _ = io.WriteString(p.stdin, line+"\n")
}

func (p *proc) signal(sig syscall.Signal) { _ = p.cmd.Process.Signal(sig) }

func (p *proc) isHolding() bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.holding
}

func (r *run) startWorker(id int, storeAddr string) error {
	wc := WorkerConfig{
		ID: id, URL: r.tg.urlFor(id), Store: storeAddr, Keys: r.cfg.Keys, TTL: r.ttl,
		Hold: r.cfg.Hold, Writes: 2, LockTimeout: 4 * r.ttl, Seed: r.cfg.Seed,
		Resource: r.cfg.Resource, Fenced: r.cfg.Fenced, Election: r.cfg.Election, Limit: r.cfg.Limit, RW: r.cfg.RW,
	}
	args := append(slices.Clone(r.cfg.Worker[1:]), wc.Args()...)
	cmd := exec.Command(r.cfg.Worker[0], args...)
	cmd.Env = append(append(os.Environ(), r.cfg.Env...), URLEnv+"="+wc.URL, ResourceEnv+"="+r.resURL)
	cmd.SysProcAttr = workerAttr()
	stdin, err := cmd.StdinPipe()
	if err != nil {
		return err
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		return err
	}
	stderr := &tailBuffer{}
	cmd.Stderr = stderr
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("start worker %d: %w", id, err)
	}
	p := &proc{id: id, cmd: cmd, stdin: stdin, done: make(chan struct{}), paused: make(chan struct{}, 1)}
	r.workers = append(r.workers, p)
	go func() {
		r.read(p, stdout)
		err := cmd.Wait()
		if err != nil && !errors.Is(err, os.ErrProcessDone) {
			r.mu.Lock()
			if r.workerErr == nil && p.cmd.ProcessState != nil && !p.cmd.ProcessState.Success() && !killed(p.cmd.ProcessState) {
				r.workerErr = fmt.Errorf("worker %d: %v: %s", id, err, stderr.String())
			}
			r.mu.Unlock()
		}
		close(p.done)
	}()
	return nil
}

func killed(ps *os.ProcessState) bool {
	ws, ok := ps.Sys().(syscall.WaitStatus)
	return ok && ws.Signaled() && ws.Signal() == syscall.SIGKILL
}

// read collects a worker's ops and status lines.
func (r *run) read(p *proc, out io.Reader) {
	sc := bufio.NewScanner(out)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		line := sc.Bytes()
		switch {
		case len(line) > 0 && line[0] == '{':
			var op history.Op
			if err := json.Unmarshal(line, &op); err != nil {
				r.event(history.Note, "", fmt.Sprintf("worker %d", p.id), "unreadable line: "+err.Error())
				continue
			}
			p.mu.Lock()
			switch {
			case op.Kind == history.Acquire && op.OK:
				p.holding, p.cur, p.renewed = true, op, 0
			case op.Kind == history.Renew && op.OK && op.Lease == p.cur.Lease:
				p.renewed = op.Start
			case (op.Kind == history.Release || op.Kind == history.Lost) && op.Lease == p.cur.Lease:
				p.holding = false
			}
			p.mu.Unlock()
			r.mu.Lock()
			r.h.Ops = append(r.h.Ops, op)
			if op.Kind == history.Acquire && op.OK {
				r.acquired++
			}
			if op.Kind == history.Write {
				r.noteWrite(op)
			}
			r.mu.Unlock()
		case strings.HasPrefix(string(line), msgPaused):
			select {
			case p.paused <- struct{}{}:
			default:
			}
		case strings.HasPrefix(string(line), msgError):
			r.event(history.Note, "", fmt.Sprintf("worker %d", p.id), strings.TrimSpace(strings.TrimPrefix(string(line), msgError)))
		}
	}
}

// stopWorkers asks every worker to finish its lease and exit, and kills those that
// do not within a few TTLs.
func (r *run) stopWorkers() {
	for _, p := range r.workers {
		p.signal(sigCont) // a paused worker cannot hear "stop"
		p.send(ctlStop)
	}
	deadline := time.After(3*r.ttl + 5*time.Second)
	for _, p := range r.workers {
		select {
		case <-p.done:
		case <-deadline:
			p.signal(syscall.SIGKILL)
			<-p.done
		}
	}
}

// tailBuffer keeps the last few KiB of a worker's standard error.
type tailBuffer struct {
	mu sync.Mutex
	b  []byte
}

func (t *tailBuffer) Write(p []byte) (int, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.b = append(t.b, p...)
	if len(t.b) > 4096 {
		t.b = t.b[len(t.b)-4096:]
	}
	return len(p), nil
}

func (t *tailBuffer) String() string {
	t.mu.Lock()
	defer t.mu.Unlock()
	return strings.TrimSpace(string(t.b))
}
