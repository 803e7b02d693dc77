package check

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"math/rand/v2"
	"net/url"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/dlockio/dlock"
	"github.com/dlockio/dlock/clock"
	"github.com/dlockio/dlock/cmd/dlock/internal/check/history"
	"github.com/dlockio/dlock/driver"
)

// WorkerConfig configures one worker process of a check run. The runner passes it
// as command-line flags (see Flags); the worker prints one JSON history.Op per line
// on stdout, and control lines starting with "#".
type WorkerConfig struct {
	ID          int           // worker number, from 1
	URL         string        // backend URL (without the core's query parameters)
	Store       string        // host:port of the checker's store (resource "store")
	Resource    string        // what the critical section writes to: a name from Resources ("" is "store")
	ResourceURL string        // URL of a real resource (from ResourceEnv)
	Fenced      bool          // write to a real resource through its guard
	Keys        int           // keys k0 .. k<Keys-1>
	TTL         time.Duration // lock TTL
	Hold        time.Duration // time in the critical section, spread over the writes
	Writes      int           // writes to the store per lease
	LockTimeout time.Duration // give up a Lock after this long (a failed acquire)
	Seed        int64
	// Election: each key is an election; the worker campaigns (Campaign, with its
	// id as the value), writes as leader under its epoch, and resigns.
	Election bool
	Limit    int  // > 1: each key is a semaphore of Limit permits
	RW       bool // each key is a read-write lock: 3 in 4 acquisitions are readers
}

// URLEnv is the environment variable that gives a worker its backend URL, so that
// a password in the URL does not show in the process list.
const URLEnv = "DLOCK_CHECK_URL"

// Args returns the worker's command-line flags; the URL goes in URLEnv.
func (c WorkerConfig) Args() []string {
	return []string{
		"--id", fmt.Sprint(c.ID), "--store", c.Store, "--keys", fmt.Sprint(c.Keys),
		"--ttl", c.TTL.String(), "--hold", c.Hold.String(), "--writes", fmt.Sprint(c.Writes),
		"--lock-timeout", c.LockTimeout.String(), "--seed", fmt.Sprint(c.Seed),
		"--resource", c.resource(), "--fenced=" + fmt.Sprint(c.Fenced),
		"--election=" + fmt.Sprint(c.Election), "--limit", fmt.Sprint(c.Limit), "--rw=" + fmt.Sprint(c.RW),
	}
}

func (c WorkerConfig) resource() string {
	if c.Resource == "" {
		return ResourceStore
	}
	return c.Resource
}

// Validate reports a configuration the worker cannot run.
func (c WorkerConfig) Validate() error {
	switch {
	case c.ID < 1:
		return errors.New("worker id must be at least 1")
	case c.URL == "":
		return errors.New("worker needs a backend URL")
	case c.resource() == ResourceStore && c.Store == "":
		return errors.New("worker needs the store's address")
	case c.resource() != ResourceStore && resourceDocs[c.resource()] == "":
		return fmt.Errorf("unknown resource %q", c.Resource)
	case c.resource() != ResourceStore && c.ResourceURL == "":
		return errors.New("worker needs the resource's URL in $" + ResourceEnv)
	case c.Keys < 1:
		return errors.New("worker needs at least one key")
	case c.TTL <= 0 || c.Hold < 0 || c.LockTimeout <= 0:
		return errors.New("worker needs a positive TTL and lock timeout, and a hold time >= 0")
	case c.Writes < 1:
		return errors.New("worker needs at least one write per lease")
	}
	return nil
}

// Worker control lines (runner -> worker, on the worker's stdin).
const (
	ctlStop  = "stop"  // finish the current lease and exit
	ctlPause = "pause" // after the next lease check, say "#paused" and wait for "resume"
	// ctlResume lets a worker that said "#paused" go on to its write. The runner
	// stops the worker with SIGSTOP in between, so its renewals stop too.
	ctlResume = "resume"
	ctlJump   = "jump" // "jump <duration>": move the worker's dlock clock by duration
	// ctlLinger makes the current (or next) critical section go on writing every
	// TTL/4 for as long as the lease is valid, up to 4 TTLs: a long batch job.
	ctlLinger = "linger"
)

// Worker status lines (worker -> runner, on stdout, among the JSON ops).
const (
	msgPaused = "#paused" // checked its lease, waits for "resume" before its write
	msgError  = "#error"  // the worker failed
)

// RunWorker runs one worker until ctx ends or "stop" arrives on in: it takes random
// keys, writes to the store under the lock, and releases, recording every
// operation on out.
func RunWorker(ctx context.Context, cfg WorkerConfig, in io.Reader, out io.Writer) error {
	if err := cfg.Validate(); err != nil {
		return err
	}
	w := &worker{cfg: cfg, out: out, resume: make(chan struct{}, 1), rnd: rand.New(rand.NewPCG(uint64(cfg.Seed), uint64(cfg.ID)))}
	err := w.run(ctx, in)
	if err != nil {
		w.say("%s %s", msgError, strings.ReplaceAll(err.Error(), "\n", "; "))
	}
	return err
}

type worker struct {
	cfg WorkerConfig
	rnd *rand.Rand

	outMu sync.Mutex
	out   io.Writer

	stopping  atomic.Bool
	stopWait  context.CancelFunc // ends a Lock in progress when "stop" arrives
	pauseNext atomic.Bool
	resume    chan struct{}
	linger    atomic.Bool
	clk       jumpClock

	// the lease being acquired or held, for the recording backend
	lastAttempt atomic.Int64
	current     atomic.Pointer[leaseRef]
}

type leaseRef struct {
	key   string
	lease int
	token uint64
}

func (w *worker) say(format string, a ...any) {
	w.outMu.Lock()
	defer w.outMu.Unlock()
	fmt.Fprintf(w.out, format+"\n", a...)
}

func (w *worker) record(op history.Op) {
	op.Process = w.cfg.ID
	if op.Attempt == 0 {
		op.Attempt = op.Start
	}
	b, _ := json.Marshal(op) // an Op always encodes
	w.outMu.Lock()
	defer w.outMu.Unlock()
	_, _ = w.out.Write(append(b, '\n'))
}

func (w *worker) control(in io.Reader) {
	sc := bufio.NewScanner(in)
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		if len(f) == 0 {
			continue
		}
		switch f[0] {
		case ctlStop:
			w.stop()
		case ctlPause:
			w.pauseNext.Store(true)
		case ctlResume:
			select {
			case w.resume <- struct{}{}:
			default:
			}
		case ctlLinger:
			w.linger.Store(true)
		case ctlJump:
			if len(f) == 2 {
				if d, err := time.ParseDuration(f[1]); err == nil {
					w.clk.offset.Add(int64(d))
				}
			}
		}
	}
	w.stop() // the runner is gone
}

func (w *worker) stop() {
	w.stopping.Store(true)
	w.stopWait()
}

// openRetrying opens the backend, again for up to 30 s if it fails for another
// reason than a bad URL or refused credentials: a worker may start while the first
// fault has the server down (a backend whose Open reads or creates its tables, such
// as MariaDB's, fails then), and a service would try again too.
func openRetrying(ctx context.Context, open driver.Opener, u *url.URL) (driver.Backend, error) {
	deadline := time.Now().Add(30 * time.Second)
	for {
		b, err := open(ctx, u)
		if err == nil || errors.Is(err, driver.ErrInvalid) || errors.Is(err, driver.ErrAuth) || time.Now().After(deadline) {
			return b, err
		}
		select {
		case <-ctx.Done():
			return nil, err
		case <-time.After(100 * time.Millisecond):
		}
	}
}

func (w *worker) run(ctx context.Context, in io.Reader) error {
	u, err := url.Parse(w.cfg.URL)
	if err != nil {
		return fmt.Errorf("backend URL does not parse")
	}
	open, ok := driver.Lookup(u.Scheme)
	if !ok {
		return fmt.Errorf("unknown backend scheme %q", u.Scheme)
	}
	b, err := openRetrying(ctx, open, u)
	if err != nil {
		return err
	}
	c, err := dlock.New(recording(b, w), dlock.WithTTL(w.cfg.TTL), dlock.WithClock(&w.clk), dlock.WithRetry(5*time.Millisecond, max(w.cfg.TTL/4, 10*time.Millisecond)))
	if err != nil {
		b.Close()
		return err
	}
	defer c.Close()
	store, err := openWriter(ctx, w.cfg)
	if err != nil {
		return err
	}
	defer store.Close()
	waitCtx, stopWait := context.WithCancel(ctx)
	defer stopWait()
	w.stopWait = stopWait
	go w.control(in)

	var watchers sync.WaitGroup
	defer watchers.Wait()
	lease := 0
	for !w.stopping.Load() && ctx.Err() == nil {
		key := fmt.Sprintf("k%d", w.rnd.IntN(w.cfg.Keys))
		lctx, cancel := context.WithTimeout(waitCtx, w.cfg.LockTimeout)
		start := history.Now()
		l, ld, err := w.acquire(lctx, c, key)
		end := history.Now()
		cancel()
		if err != nil && w.stopping.Load() {
			break // told to stop while waiting: not a failed acquire
		}
		if err != nil {
			w.record(history.Op{Key: key, Kind: history.Acquire, Start: start, End: end, Err: err.Error(), Held: errors.Is(err, dlock.ErrLocked)})
			if !errors.Is(err, context.DeadlineExceeded) {
				time.Sleep(20 * time.Millisecond) // the backend failed: do not spin
			}
			continue
		}
		lease++
		tok := uint64(l.Token())
		w.current.Store(&leaseRef{key: key, lease: lease, token: tok})
		w.record(history.Op{Key: key, Kind: history.Acquire, Lease: lease, Start: start, Attempt: w.lastAttempt.Load(), End: end, OK: true, Token: tok, Shared: l.Shared()})
		n := lease
		watchers.Go(func() {
			<-l.Done()
			if errors.Is(context.Cause(l.Context()), dlock.ErrLeaseLost) {
				t := history.Now()
				w.record(history.Op{Key: key, Kind: history.Lost, Lease: n, Start: t, End: t, Token: tok, Err: context.Cause(l.Context()).Error()})
			}
		})
		if err := w.critical(waitCtx, store, l, key, lease, tok); err != nil {
			return err
		}
		rs := history.Now()
		if ld != nil {
			err = ld.Resign(ctx)
		} else {
			err = l.Release(ctx)
		}
		op := history.Op{Key: key, Kind: history.Release, Lease: lease, Start: rs, End: history.Now(), OK: err == nil, Token: tok}
		if err != nil {
			op.Err = err.Error()
		}
		w.record(op)
		w.current.Store(nil)
	}
	return nil
}

// acquire locks key, or, in an election workload, campaigns for it and returns
// the leadership too.
func (w *worker) acquire(ctx context.Context, c *dlock.Client, key string) (*dlock.Lease, *dlock.Leadership, error) {
	if !w.cfg.Election {
		var opts []dlock.Option
		if w.cfg.Limit > 1 {
			opts = append(opts, dlock.WithLimit(w.cfg.Limit))
		}
		if w.cfg.RW && w.rnd.IntN(4) > 0 {
			opts = append(opts, dlock.WithShared())
		}
		l, err := c.Lock(ctx, key, opts...)
		return l, nil, err
	}
	ld, err := c.Campaign(ctx, key, []byte(fmt.Sprintf("worker-%d", w.cfg.ID)))
	if err != nil {
		return nil, nil, err
	}
	return ld.Lease(), ld, nil
}

// critical is the critical section: Writes writes spread over Hold, each after a
// check that the lease is still valid, as a careful program does. A pause right
// after such a check (the "pause" control) is what fencing is for.
func (w *worker) critical(ctx context.Context, store resourceWriter, l *dlock.Lease, key string, lease int, tok uint64) error {
	if l.Shared() {
		// A reader of a read-write lock holds for Hold and writes nothing.
		select {
		case <-time.After(w.cfg.Hold):
		case <-ctx.Done():
		}
		return nil
	}
	step := w.cfg.Hold / time.Duration(w.cfg.Writes)
	lingerUntil := time.Time{}
	defer func() {
		if !lingerUntil.IsZero() {
			w.linger.Store(false) // lingering is for one lease
		}
	}()
	for i := 0; i < w.cfg.Writes || w.linger.Load() && (lingerUntil.IsZero() || time.Now().Before(lingerUntil)); i++ {
		if w.linger.Load() {
			if lingerUntil.IsZero() {
				lingerUntil = time.Now().Add(4 * w.cfg.TTL)
			}
			step = w.cfg.TTL / 4
		}
		if step > 0 {
			select {
			case <-time.After(step/2 + time.Duration(w.rnd.Int64N(int64(step)))):
			case <-ctx.Done():
				return nil
			}
		}
		if l.Err() != nil {
			return nil
		}
		if w.pauseNext.CompareAndSwap(true, false) {
			w.say("%s %d", msgPaused, lease)
			select { // the runner stops this process now, and resumes it later
			case <-w.resume:
			case <-ctx.Done():
				return nil
			}
		}
		start := history.Now()
		// A stop cancels ctx: the write in flight still finishes, as a real
		// program's would.
		wctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
		ok, refusal, err := store.write(wctx, loggedWrite{Process: w.cfg.ID, Lease: lease, Token: tok, Key: key, Sent: start})
		cancel()
		op := history.Op{Key: key, Kind: history.Write, Lease: lease, Start: start, End: history.Now(), OK: err == nil, Token: tok}
		switch {
		case err != nil && w.cfg.resource() == ResourceStore:
			return err
		case err != nil:
			// The resource did not answer: the write may or may not have
			// committed; its log says which.
			op.Err = err.Error()
		case !ok && w.cfg.resource() == ResourceStore:
			op.Err = "rejected by the store"
		case !ok:
			op.Err = rejectedMsg + ": " + refusal
		}
		w.record(op)
	}
	return nil
}

// jumpClock is the real clock moved by an offset that the "jump" control changes:
// a local clock that suddenly runs ahead or behind. Timers still run in real time.
type jumpClock struct{ offset atomic.Int64 }

func (c *jumpClock) Now() time.Time { return time.Now().Add(time.Duration(c.offset.Load())) }
func (c *jumpClock) NewTimer(d time.Duration) clock.Timer {
	return clock.Real.NewTimer(d)
}
func (c *jumpClock) AfterFunc(d time.Duration, f func()) clock.Timer {
	return clock.Real.AfterFunc(d, f)
}

// recording wraps a backend so that the worker learns when each acquire attempt
// began and records every renewal. It keeps b's Notifier, so the core waits for
// wake-ups exactly as with b.
func recording(b driver.Backend, w *worker) driver.Backend {
	r := &recorder{Backend: b, w: w}
	if n, ok := b.(driver.Notifier); ok {
		return &recordingNotifier{recorder: r, n: n}
	}
	return r
}

type recorder struct {
	driver.Backend
	w *worker
}

// The recorder passes on the optional capabilities the core uses, so a worker's
// client behaves as a program's would: a Bounder's session bound (etcd,
// ZooKeeper), a Valuer's values (the election workload), a Semaphorer's holder
// limit (the semaphore workload) and a Sharer's shared grants (the read-write
// workload). Where the backend
// lacks one, the answer is what its absence means to the core.
var (
	_ driver.Bounder    = (*recorder)(nil)
	_ driver.Valuer     = (*recorder)(nil)
	_ driver.Semaphorer = (*recorder)(nil)
	_ driver.Sharer     = (*recorder)(nil)
)

// Shares implements driver.Sharer.
func (r *recorder) Shares() bool {
	s, ok := r.Backend.(driver.Sharer)
	return ok && s.Shares()
}

// Holders implements driver.Semaphorer.
func (r *recorder) Holders(ctx context.Context, key string) (int, []driver.Info, error) {
	if s, ok := r.Backend.(driver.Semaphorer); ok {
		return s.Holders(ctx, key)
	}
	return 0, nil, driver.ErrUnsupported
}

// Bound implements driver.Bounder.
func (r *recorder) Bound(key, owner string) (time.Duration, bool) {
	if b, ok := r.Backend.(driver.Bounder); ok {
		return b.Bound(key, owner)
	}
	return driver.NoBound, true
}

// SetValue implements driver.Valuer.
func (r *recorder) SetValue(ctx context.Context, key, owner string, value []byte) error {
	if v, ok := r.Backend.(driver.Valuer); ok {
		return v.SetValue(ctx, key, owner, value)
	}
	return driver.ErrUnsupported
}

func (r *recorder) Acquire(ctx context.Context, req driver.Request) (driver.Grant, error) {
	if _, ok := r.Backend.(driver.Semaphorer); !ok && req.Limit > 1 {
		return driver.Grant{}, fmt.Errorf("%w: this backend has no semaphores", driver.ErrUnsupported)
	}
	start := history.Now()
	g, err := r.Backend.Acquire(ctx, req)
	if err == nil && g.Age > 0 {
		// A grant handed over by a release: the server granted it up to Age
		// before this call returned, and after the attempt that queued us.
		start = history.Now() - int64(g.Age)
	}
	r.w.lastAttempt.Store(start)
	return g, err
}

func (r *recorder) Refresh(ctx context.Context, key, owner string, ttl time.Duration) error {
	start := history.Now()
	err := r.Backend.Refresh(ctx, key, owner, ttl)
	op := history.Op{Key: key, Kind: history.Renew, Start: start, End: history.Now(), OK: err == nil}
	if cur := r.w.current.Load(); cur != nil && cur.key == key {
		op.Lease, op.Token = cur.lease, cur.token
	}
	if err != nil {
		op.Err = err.Error()
	}
	r.w.record(op)
	return err
}

type recordingNotifier struct {
	*recorder
	n driver.Notifier
}

func (r *recordingNotifier) WatchFirst(key string) bool {
	if a, ok := r.n.(driver.WatchAdvisor); ok {
		return a.WatchFirst(key)
	}
	return true
}

func (r *recordingNotifier) Watch(ctx context.Context, key, owner string) (driver.Waiter, error) {
	return r.n.Watch(ctx, key, owner)
}

// ParseWorkerArgs reads the flags that WorkerConfig.Args writes.
func ParseWorkerArgs(args []string) (WorkerConfig, error) {
	var c WorkerConfig
	fs := flag.NewFlagSet("check-worker", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	fs.IntVar(&c.ID, "id", 0, "worker number")
	fs.StringVar(&c.URL, "url", os.Getenv(URLEnv), "backend URL (default $"+URLEnv+")")
	fs.StringVar(&c.Store, "store", "", "store address")
	fs.StringVar(&c.Resource, "resource", ResourceStore, "resource")
	fs.BoolVar(&c.Fenced, "fenced", false, "write through the guard")
	c.ResourceURL = os.Getenv(ResourceEnv)
	fs.IntVar(&c.Keys, "keys", 1, "keys")
	fs.DurationVar(&c.TTL, "ttl", time.Second, "lock TTL")
	fs.DurationVar(&c.Hold, "hold", 0, "hold time")
	fs.IntVar(&c.Writes, "writes", 2, "writes per lease")
	fs.DurationVar(&c.LockTimeout, "lock-timeout", 4*time.Second, "lock timeout")
	fs.Int64Var(&c.Seed, "seed", 1, "seed")
	fs.BoolVar(&c.Election, "election", false, "campaign instead of lock")
	fs.IntVar(&c.Limit, "limit", 0, "holders per key (a semaphore when above 1)")
	fs.BoolVar(&c.RW, "rw", false, "read-write locks: 3 in 4 acquisitions shared")
	if err := fs.Parse(args); err != nil {
		return c, err
	}
	if fs.NArg() > 0 {
		return c, fmt.Errorf("unexpected arguments %q", fs.Args())
	}
	return c, c.Validate()
}
