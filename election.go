package dlock

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/dlockio/dlock/driver"
)

// An election is a lock whose holder leads. Campaign waits for the lock of name and
// stores the candidate's value with the grant; the grant's fencing token is the
// leader's epoch, larger for every later leader of the name; the leadership ends,
// and its context is cancelled, the moment the lease may be lost, before the
// server can let another candidate lead. Leader and Observe read the holder of
// name, so `dlock run NAME` and a Lock of NAME take part in the same election.

// Leadership is a won election: this candidate holds the lock of the election's
// name. It is safe for concurrent use. Act as leader only under Context, and hand
// Token to every resource the leader writes, so that a deposed leader that has not
// yet noticed (paused, partitioned) is refused by the resource; without that
// check nothing stops two processes acting as leader for a moment.
type Leadership struct {
	c     *Client
	lease *Lease

	mu       sync.Mutex // serialises Proclaim and Resign
	value    []byte
	resigned bool      // Resign has nothing more to do
	retry    bool      // the server was not told at the first Resign
	until    time.Time // the lease's validity when the first Resign failed
}

// Campaign waits until this candidate leads the election name, or ctx ends (an
// error matching ErrLocked and ctx.Err(), as Lock's), and stores value (at most
// 4096 bytes, nil for none) with the leadership for followers to read with Leader
// and Observe. Options are Lock's (WithTTL, WithOwner, ...).
//
// Campaign never returns a leadership it does not have: it fails if the lease is
// already lost when it is granted (an error matching ErrLeaseLost), and on a
// backend whose waiting candidates live on a session (etcd, ZooKeeper) it fails at
// once, with an error that does not match ErrLocked, if that session is lost
// while it waits. A candidate that gives up (ctx ends) leaves nothing behind.
//
// A non-empty value needs a backend that stores values (a driver.Valuer: every
// backend of this module); elsewhere Campaign fails with an error matching
// ErrUnsupported.
func (c *Client) Campaign(ctx context.Context, name string, value []byte, opts ...Option) (*Leadership, error) {
	if err := driver.ValidateValue(value); err != nil {
		return nil, err
	}
	opts = append(opts[:len(opts):len(opts)], WithValue(value))
	l, err := c.Lock(ctx, name, opts...)
	if err != nil {
		return nil, err
	}
	if err := l.Err(); err != nil || !l.g.cfg.clock.Now().Before(l.Expiry()) {
		rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), maxReleaseInClose)
		defer cancel()
		_ = l.Release(rctx)
		return nil, fmt.Errorf("%w: campaign %q: the leadership ended as it was granted", ErrLeaseLost, name)
	}
	return &Leadership{c: c, lease: l, value: bytes.Clone(value)}, nil
}

// Name returns the election's name.
func (l *Leadership) Name() string { return l.lease.Key() }

// Owner returns the leader's owner id.
func (l *Leadership) Owner() string { return l.lease.Owner() }

// Token returns the leader's epoch: a fencing token larger than every earlier
// leader's of the name (0 on a backend that cannot fence).
func (l *Leadership) Token() Token { return l.lease.Token() }

// Value returns the value last stored by Campaign or Proclaim.
func (l *Leadership) Value() []byte {
	l.mu.Lock()
	defer l.mu.Unlock()
	return bytes.Clone(l.value)
}

// Context returns a context cancelled when the leadership may be lost (cause
// matching ErrLeaseLost) or is resigned (ErrReleased). Lead under it.
func (l *Leadership) Context() context.Context { return l.lease.Context() }

// Done is closed when the leadership ends.
func (l *Leadership) Done() <-chan struct{} { return l.lease.Done() }

// Err returns nil while this candidate leads, else why it stopped (an error
// matching ErrLeaseLost or ErrReleased).
func (l *Leadership) Err() error { return l.lease.Err() }

// Lease returns the lease that carries the leadership.
func (l *Leadership) Lease() *Lease { return l.lease }

// Proclaim replaces the leader's value without a new election. The server changes
// it only if this candidate still holds the lock there; if it does not, the
// leadership ends at once and the error matches ErrLeaseLost. After the leadership
// has ended, Proclaim returns why, changing nothing.
func (l *Leadership) Proclaim(ctx context.Context, value []byte) error {
	if err := driver.ValidateValue(value); err != nil {
		return err
	}
	v := l.c.valuer
	if v == nil {
		return unsupported("proclaim", l.Name())
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if err := l.lease.Err(); err != nil {
		return err
	}
	err := v.SetValue(ctx, l.Name(), l.Owner(), value)
	if errors.Is(err, ErrNotHeld) {
		cause := fmt.Errorf("%w: %q: the server no longer had the grant at proclaim", ErrLeaseLost, l.Name())
		l.lease.g.lose(cause)
		return cause
	}
	if err != nil {
		return err
	}
	l.value = bytes.Clone(value)
	return nil
}

// Resign ends the leadership and frees the name for the next candidate. It is
// idempotent: once it has returned nil, later calls return nil. If it returns an
// error, the leadership has still ended locally (its context is cancelled), and
// calling Resign again asks the server again to free the name, until the lease's
// last validity deadline, after which the server frees it by itself. The first
// call returns an error matching ErrLeaseLost if the leadership had been lost
// (what was done as leader may have overlapped another leader's).
func (l *Leadership) Resign(ctx context.Context) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.resigned {
		return nil
	}
	if l.retry {
		if !l.c.cfg.clock.Now().Before(l.until) {
			l.resigned = true // expired on the server meanwhile
			return nil
		}
		err := l.c.b.Release(ctx, l.Name(), l.Owner())
		if err == nil || errors.Is(err, ErrNotHeld) {
			l.resigned = true
			return nil
		}
		return err
	}
	until := l.lease.Expiry()
	err := l.lease.Release(ctx)
	switch {
	case err == nil || errors.Is(err, ErrReleased):
		l.resigned = true
		return nil
	case errors.Is(err, ErrLeaseLost):
		l.resigned = true
		return err
	case l.lease.done():
		// The request reached for the server and failed: the lease has ended
		// locally, the server may still hold the grant.
		l.retry, l.until = true, until
	}
	return err
}

// Leader describes the leader of an election, as Client.Leader and Client.Observe
// read it from the server. The zero Owner means that no one leads.
type Leader struct {
	// Name is the election's name.
	Name string
	// Owner is the leader's owner id; "" when no one leads.
	Owner string
	// Value is the leader's value (Campaign, Proclaim, WithValue); nil if none.
	Value []byte
	// Token is the leader's epoch (its fencing token); 0 when no one leads or the
	// backend cannot fence.
	Token Token
	// TTL is the time left, when read, before the server expires the leader's
	// grant unless it is renewed; 0 when unknown.
	TTL time.Duration
}

// Exists reports whether someone leads.
func (l Leader) Exists() bool { return l.Owner != "" }

// same reports whether l and m describe the same leadership and value.
func (l Leader) same(m Leader) bool {
	return l.Owner == m.Owner && l.Token == m.Token && bytes.Equal(l.Value, m.Value)
}

// Leader reads the current leader of the election name: its owner id, value,
// epoch and time left. It returns an error matching ErrNoLeader when no one leads.
// What it returns is a snapshot; only the token protects a resource.
func (c *Client) Leader(ctx context.Context, name string) (Leader, error) {
	info, err := c.Inspect(ctx, name)
	if errors.Is(err, ErrNotHeld) {
		return Leader{Name: name}, fmt.Errorf("dlock: election %q: %w", name, ErrNoLeader)
	}
	if err != nil {
		return Leader{Name: name}, err
	}
	return Leader{Name: name, Owner: info.Owner, Value: info.Value, Token: info.Token, TTL: info.TTL}, nil
}

// observeReadTimeout bounds one read of the holder, so a connection that went
// silent does not stall an observer for longer.
const observeReadTimeout = 10 * time.Second

// observeGuard is how many observe intervals pass, on a backend that watches
// holders, between reads made in case a notification was lost.
const observeGuard = 30

// Observe follows the leader of the election name. The channel receives the
// current state first (a Leader whose Exists is false when no one leads), then
// every change: a new leader, a new value, no leader. It is closed when ctx ends or
// the client is closed. A slow reader is not queued for: it receives the latest
// state when it reads, never a state older than one it has received (a leader
// whose token is below one already seen is skipped). Changes that come and go
// between two reads of the server may be missed; the tokens a reader sees rise.
//
// On a backend that watches holders (a driver.HolderWatcher) Observe reads the
// server on each notification and when the leader's TTL runs out; on another it
// reads every WithObserveInterval (default 1s) and when the TTL runs out. Read
// errors are retried at that interval and logged at Debug. It returns an error at
// once for a bad name, a closed client, or a backend that cannot read holders.
func (c *Client) Observe(ctx context.Context, name string, opts ...Option) (<-chan Leader, error) {
	if err := c.adminCheck(name); err != nil {
		return nil, err
	}
	if _, ok := c.b.(driver.Inspector); !ok {
		return nil, unsupported("observe", name)
	}
	cfg := c.cfg
	if len(opts) > 0 {
		cfg.perLock = true
		var err error
		if cfg, err = cfg.with(opts); err != nil {
			return nil, err
		}
	}
	var w driver.HolderWatch
	if c.watcher != nil {
		var err error
		if w, err = c.watcher.WatchHolder(ctx, name); err != nil {
			return nil, err
		}
	}
	out := make(chan Leader)
	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		if w != nil {
			w.Stop()
		}
		return nil, ErrClosed
	}
	c.wg.Add(1)
	c.mu.Unlock()
	o := &observer{c: c, cfg: &cfg, name: name, w: w, out: out}
	go o.run(ctx)
	return out, nil
}

// observer is one Observe call's goroutine state.
type observer struct {
	c    *Client
	cfg  *config
	name string
	w    driver.HolderWatch // nil: poll
	out  chan Leader

	last    Leader // the state last taken for delivery
	have    bool   // last is set
	top     Token  // the highest leader token taken
	pending bool   // last is not delivered yet
}

func (o *observer) run(ctx context.Context) {
	defer o.c.wg.Done()
	defer close(o.out)
	if o.w != nil {
		defer o.w.Stop()
	}
	// A read in flight ends when the client closes, so Close never waits on it.
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	go func() {
		select {
		case <-o.c.closing:
			cancel()
		case <-ctx.Done():
		}
	}()
	var wake <-chan struct{}
	if o.w != nil {
		wake = o.w.C()
	}
	for {
		next := o.read(ctx)
		t := o.cfg.clock.NewTimer(next)
		for waiting := true; waiting; {
			var send chan Leader
			if o.pending {
				send = o.out
			}
			select {
			case send <- o.last:
				o.pending = false
			case <-wake:
				waiting = false
			case <-t.C():
				waiting = false
			case <-ctx.Done():
				t.Stop()
				return
			case <-o.c.closing:
				t.Stop()
				return
			}
		}
		t.Stop()
	}
}

// read reads the leader once, takes it for delivery if it is news, and returns
// how long to wait for the next read if nothing notifies.
func (o *observer) read(ctx context.Context) time.Duration {
	every := o.cfg.observe
	if o.w != nil {
		every *= observeGuard
	}
	rctx, cancel := context.WithTimeout(ctx, observeReadTimeout)
	ld, err := o.c.Leader(rctx, o.name)
	cancel()
	if err != nil && !errors.Is(err, ErrNoLeader) {
		if ctx.Err() == nil {
			o.cfg.logger.Debug("dlock: observe", "name", o.name, "err", err)
		}
		return o.cfg.observe
	}
	o.take(ld)
	if ld.Exists() && ld.TTL > 0 {
		// When the TTL runs out, the leader has renewed, resigned or expired:
		// a server that does not signal expiry is read again then.
		every = min(every, ld.TTL+time.Millisecond)
	}
	return every
}

// take makes ld the state to deliver unless it is no change, or older than a
// state already taken.
func (o *observer) take(ld Leader) {
	if o.have && ld.same(o.last) {
		return
	}
	if ld.Exists() && ld.Token != 0 && o.have && (ld.Token < o.top || ld.Token == o.top && !o.last.Exists()) {
		return // stale: a later leader, or its end, was seen already
	}
	o.last, o.have, o.pending = ld, true, true
	if ld.Token > o.top {
		o.top = ld.Token
	}
}
