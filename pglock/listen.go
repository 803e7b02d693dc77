package pglock

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgconn/ctxwatch"

	"github.com/dlockio/dlock/driver"
)

// listener owns a client's dedicated LISTEN connection, on the client's own channel.
// One goroutine runs it: it connects when the first waiter or holder watch
// registers, issues LISTEN, then receives notifications (each names the one waiter,
// owner and key, for which a release reserved the lock) until no waiter or watch
// has been registered for linger, or the connection breaks (then it reconnects and
// wakes every waiter and watch, since wake-ups may have been lost meanwhile). The
// same connection serves the holder watches (watch.go).
type listener struct {
	cfg     *pgx.ConnConfig
	channel string
	linger  time.Duration
	tableID uint32 // the lock table's oid, for the watch channel and lock keys

	closeCtx    context.Context // cancelled by close; bounds connects
	closeCancel context.CancelFunc
	wg          sync.WaitGroup

	mu        sync.Mutex
	closed    bool
	started   bool
	kick      chan struct{} // wakes the idle goroutine; capacity 1
	changed   chan struct{} // closed (and replaced) when listening or failed changes
	waiters   map[driver.Holder]*waiter
	places    map[driver.Holder]string // the known places in queues (keys of their rows)
	count     int                      // registered waiters
	idleSince time.Time                // when count last became 0
	listening bool                     // LISTEN is in effect on a live connection
	attempts  int                      // connection attempts started
	failedAt  int                      // the attempt that failed last
	failErr   error
	interrupt context.CancelFunc // cancels the WaitForNotification in progress
	openWait  bool               // the wait in progress has no linger timeout

	watched        map[string]*watchedKey // holder watches by key (watch.go)
	watchListening bool                   // LISTEN on the watch channel is in effect
	watchDirty     bool                   // the connection must catch up with watched (syncWatches)

	// withdraw gives up owner's place in key's queue and passes on a reservation
	// made for it, or a grant handed to its place (Backend.withdraw).
	withdraw func(ctx context.Context, key, owner, handed string) error

	seq    atomic.Int64           // numbers waiting attempts (waiter.number)
	behind map[driver.Holder]bool // grants handed over with places queued behind them
}

// attemptTimeout bounds a waiting attempt that runs on after its caller gave up, and
// withdrawTimeout a withdrawal, or a reader's follow-up handoff, made in the
// background.
const (
	attemptTimeout  = 30 * time.Second
	withdrawTimeout = 10 * time.Second
	// withdrawRetry is the first pause before a failed withdrawal is tried again
	// (see withdrawLater).
	withdrawRetry = 25 * time.Millisecond
)

func newListener(cfg *pgx.ConnConfig, channel string, linger time.Duration) *listener {
	l := &listener{cfg: cfg, channel: channel, linger: linger,
		kick: make(chan struct{}, 1), changed: make(chan struct{}), waiters: make(map[driver.Holder]*waiter), places: make(map[driver.Holder]string),
		behind: make(map[driver.Holder]bool), watched: make(map[string]*watchedKey)}
	l.closeCtx, l.closeCancel = context.WithCancel(context.Background())
	return l
}

// broadcastLocked wakes every watch waiting for the listening state to change.
func (l *listener) broadcastLocked() {
	close(l.changed)
	l.changed = make(chan struct{})
}

// watch registers a waiter for key and owner and returns once LISTEN is in effect.
func (l *listener) watch(ctx context.Context, b *Backend, key, owner string) (*waiter, error) {
	w := &waiter{l: l, b: b, key: key, owner: owner, c: make(chan struct{}, 1)}
	l.mu.Lock()
	if l.closed {
		l.mu.Unlock()
		return nil, driver.ErrClosed
	}
	if old := l.waiters[driver.Holder{Key: key, Owner: owner}]; old != nil {
		l.removeLocked(old) // the core never runs two waits of one owner and key at once
	}
	l.waiters[driver.Holder{Key: key, Owner: owner}] = w
	l.count++
	if !l.started {
		l.started = true
		l.wg.Add(1)
		go l.run()
	}
	select {
	case l.kick <- struct{}{}:
	default:
	}
	since := l.attempts
	for !l.listening {
		var err error
		switch {
		case l.closed:
			err = driver.ErrClosed
		case l.failedAt > since:
			err = fmt.Errorf("pglock: listen for wake-ups: %w", l.failErr)
		}
		if err != nil {
			l.removeLocked(w)
			l.mu.Unlock()
			return nil, err
		}
		ch := l.changed
		l.mu.Unlock()
		select {
		case <-ch:
		case <-ctx.Done():
			l.mu.Lock()
			l.removeLocked(w)
			l.mu.Unlock()
			return nil, fmt.Errorf("pglock: listen for wake-ups: %w", ctx.Err())
		}
		l.mu.Lock()
	}
	l.mu.Unlock()
	return w, nil
}

// removeLocked unregisters w and reports whether it was registered.
func (l *listener) removeLocked(w *waiter) bool {
	k := driver.Holder{Key: w.key, Owner: w.owner}
	if l.waiters[k] != w {
		return false
	}
	delete(l.waiters, k)
	l.count--
	if !l.busyLocked() {
		l.idleSince = time.Now()
		if l.openWait && l.interrupt != nil {
			l.interrupt() // let the receive loop start the linger timeout
		}
	}
	return true
}

// busyLocked reports whether a waiter or a holder watch needs the connection.
func (l *listener) busyLocked() bool { return l.count > 0 || len(l.watched) > 0 }

// dropConnLocked records that the connection is gone, with its LISTENs and locks.
func (l *listener) dropConnLocked() {
	l.listening, l.watchListening = false, false
	for _, wk := range l.watched {
		wk.locked = false
	}
	l.watchDirty = len(l.watched) > 0
}

func (l *listener) wakeAllLocked() {
	for _, w := range l.waiters {
		w.wake()
	}
}

// dispatch is the connection's notification handler; it runs on the listener's
// goroutine while it reads from the connection. The payload is "owner key" on the
// client's channel, followed for a direct handoff (see hand_off.sql) by chr(1) and
// "token number TTL place-number more"; the key on the watch channel.
func (l *listener) dispatch(_ *pgconn.PgConn, n *pgconn.Notification) {
	if n.Channel != l.channel {
		if n.Channel == watchChannel(l.tableID) {
			l.mu.Lock()
			l.wakeKeyLocked(n.Payload)
			l.mu.Unlock()
		}
		return
	}
	owner, key, ok := strings.Cut(n.Payload, " ")
	if !ok {
		return
	}
	key, tail, direct := strings.Cut(key, "\x01")
	var h *handoff
	if direct {
		h = parseHandoff(key, tail)
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if w := l.waiters[driver.Holder{Key: key, Owner: owner}]; w != nil {
		if h != nil {
			w.handedLocked(h)
		}
		w.wake()
		return
	}
	handed := ""
	if h != nil {
		handed = h.place
	}
	// No wait of this client is registered for it: a waiter that gave up, whose
	// withdrawal failed or crossed this release. Pass the free lock on now rather
	// than when the place lapses. (A waiter registers before its first waiting
	// attempt, so a live one is never passed over; if it has taken the lock
	// meanwhile, the lock is no longer reserved and the withdrawal changes nothing.)
	l.withdrawLater(key, owner, handed, 0)
}

// handoff is a grant a release made directly to a place of this client's.
type handoff struct {
	token uint64
	seq   int64  // the number of the attempt that wrote the place
	ttl   int64  // µs
	place string // the place (its row's key)
	more  bool   // places were queued behind it
	sent  int64  // when attempt seq was sent, at the latest (see mono); 0 if unknown
}

// parseHandoff parses the tail of a direct handoff's notification for key, or
// returns nil.
func parseHandoff(key, tail string) *handoff {
	f := strings.Fields(tail)
	if len(f) != 5 {
		return nil
	}
	tok, err1 := strconv.ParseUint(f[0], 10, 64)
	seq, err2 := strconv.ParseInt(f[1], 10, 64)
	ttl, err3 := strconv.ParseInt(f[2], 10, 64)
	if err1 != nil || err2 != nil || err3 != nil || tok == 0 || seq <= 0 || ttl <= 0 {
		return nil
	}
	return &handoff{token: tok, seq: seq, ttl: ttl, place: key + "\x02" + f[3], more: f[4] == "1"}
}

// queuedBehind reports, once, whether owner's grant of key was handed over with
// places queued behind it (its release then goes straight to the handoff).
func (l *listener) queuedBehind(key, owner string) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	k := driver.Holder{Key: key, Owner: owner}
	yes := l.behind[k]
	if yes {
		delete(l.behind, k)
	}
	return yes
}

// epoch is the origin of mono.
var epoch = time.Now()

// mono reads the monotonic clock, in nanoseconds since epoch.
func mono() int64 { return int64(time.Since(epoch)) }

// lookup returns the registered wait of owner for key, or nil.
func (l *listener) lookup(key, owner string) *waiter {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.waiters[driver.Holder{Key: key, Owner: owner}]
}

// background runs f on a goroutine of the listener's, with a context that ends
// after withdrawTimeout or when the listener closes. Called with l.mu held.
func (l *listener) background(f func(ctx context.Context)) {
	if l.closed || l.withdraw == nil {
		return
	}
	l.wg.Add(1)
	go func() {
		defer l.wg.Done()
		ctx, cancel := context.WithTimeout(l.closeCtx, withdrawTimeout)
		defer cancel()
		f(ctx)
	}()
}

// withdrawLater withdraws owner's place in key's queue in the background, after
// pause, and again with growing pauses (up to a second) while that fails: a place
// whose client still listens stays live however old it is, and one left behind by
// a wait that is over (its withdrawal lost to a server restart, say) would be
// first in line for good, so that nobody could take the key once its holder's
// lease lapsed without a release. It stops when the withdrawal succeeds, when the
// listener closes, or when the owner waits for the key again through this client
// (that wait's own Stop withdraws). Called with l.mu held.
func (l *listener) withdrawLater(key, owner, handed string, pause time.Duration) {
	l.background(func(context.Context) {
		for {
			if pause > 0 {
				t := time.NewTimer(pause)
				select {
				case <-l.closeCtx.Done():
					t.Stop()
					return
				case <-t.C:
				}
			}
			l.mu.Lock()
			again := l.waiters[driver.Holder{Key: key, Owner: owner}] != nil
			l.mu.Unlock()
			if again {
				return
			}
			tctx, cancel := context.WithTimeout(l.closeCtx, withdrawTimeout)
			err := l.withdraw(tctx, key, owner, handed)
			cancel()
			if err == nil || errors.Is(err, driver.ErrClosed) || l.closeCtx.Err() != nil {
				return
			}
			pause = min(max(2*pause, withdrawRetry), time.Second)
		}
	})
}

func (l *listener) close() {
	l.mu.Lock()
	l.closed = true
	l.broadcastLocked()
	if l.interrupt != nil {
		l.interrupt()
	}
	l.mu.Unlock()
	l.closeCancel()
	l.wg.Wait()
}

func (l *listener) connect() (*pgconn.PgConn, error) {
	cfg := l.cfg.Config.Copy()
	cfg.OnNotification = l.dispatch
	// Interrupting a wait must not disturb the connection: use a deadline, never a
	// cancel request that could hit the next statement.
	cfg.BuildContextWatcherHandler = func(c *pgconn.PgConn) ctxwatch.Handler {
		return &pgconn.DeadlineContextWatcherHandler{Conn: c.Conn()}
	}
	timeout := cfg.ConnectTimeout
	if timeout <= 0 {
		timeout = 30 * time.Second
	}
	ctx, cancel := context.WithTimeout(l.closeCtx, timeout)
	defer cancel()
	conn, err := pgconn.ConnectConfig(ctx, cfg)
	if err != nil {
		return nil, err
	}
	// The advisory lock tells handoffs that this client is alive, so its waiters'
	// places are live without renewal (see placeLive in sql/fragments.sql).
	alive := "SELECT pg_advisory_lock(" + strconv.FormatInt(lockID(l.channel), 10) + ")"
	if _, err := conn.Exec(ctx, alive).ReadAll(); err != nil {
		closeConn(conn)
		return nil, err
	}
	if _, err := conn.Exec(ctx, "LISTEN "+pgx.Identifier{l.channel}.Sanitize()).ReadAll(); err != nil {
		closeConn(conn)
		return nil, err
	}
	return conn, nil
}

func closeConn(c *pgconn.PgConn) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	_ = c.Close(ctx)
}

// run is the listener's goroutine.
func (l *listener) run() {
	defer l.wg.Done()
	backoff := 50 * time.Millisecond
	lost := false // the previous connection broke while it had waiters
	for {
		// Wait for demand.
		l.mu.Lock()
		for !l.busyLocked() && !l.closed {
			l.mu.Unlock()
			select {
			case <-l.kick:
			case <-l.closeCtx.Done():
			}
			l.mu.Lock()
		}
		if l.closed {
			l.mu.Unlock()
			return
		}
		l.attempts++
		attempt := l.attempts
		l.mu.Unlock()

		conn, err := l.connect()
		if err == nil {
			l.mu.Lock()
			l.listening = true
			l.broadcastLocked()
			if lost {
				l.wakeAllLocked()
			}
			l.mu.Unlock()
			lost, err = l.receive(conn)
			closeConn(conn)
		}
		if err == nil {
			backoff = 50 * time.Millisecond
			continue
		}
		// The connection, or bringing it in line with the watches, failed.
		l.mu.Lock()
		l.failedAt, l.failErr = attempt, err
		l.broadcastLocked()
		l.mu.Unlock()
		select {
		case <-time.After(backoff):
		case <-l.closeCtx.Done():
		}
		backoff = min(2*backoff, 2*time.Second)
	}
}

// receive reads notifications, and brings the connection in line with the holder
// watches when they change, until the connection breaks (it returns true), the
// listener closes, or no one has waited or watched for linger (false). It returns
// the error of a failed syncWatches (the connection is then to be closed).
func (l *listener) receive(conn *pgconn.PgConn) (bool, error) {
	for {
		l.mu.Lock()
		if l.closed {
			l.dropConnLocked()
			l.mu.Unlock()
			return false, nil
		}
		if l.watchDirty {
			l.mu.Unlock()
			if err := l.syncWatches(conn); err != nil {
				l.mu.Lock()
				l.dropConnLocked()
				l.broadcastLocked()
				l.mu.Unlock()
				return true, err
			}
			continue
		}
		var ctx context.Context
		var cancel context.CancelFunc
		l.openWait = l.busyLocked()
		if l.openWait {
			ctx, cancel = context.WithCancel(context.Background())
		} else {
			left := l.linger - time.Since(l.idleSince)
			if left <= 0 {
				l.dropConnLocked()
				l.mu.Unlock()
				return false, nil
			}
			ctx, cancel = context.WithTimeout(context.Background(), left)
		}
		l.interrupt = cancel
		l.mu.Unlock()

		err := conn.WaitForNotification(ctx)
		cancel()

		l.mu.Lock()
		l.interrupt = nil
		broken := err != nil && (conn.IsClosed() || ctx.Err() == nil)
		if broken {
			l.dropConnLocked()
			l.broadcastLocked()
			l.mu.Unlock()
			return true, nil
		}
		l.mu.Unlock()
	}
}

// place returns owner's place in key's queue (the key of its row), or "".
func (l *listener) place(key, owner string) string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.places[driver.Holder{Key: key, Owner: owner}]
}

// setPlace records owner's place in key's queue; "" forgets it.
func (l *listener) setPlace(key, owner, place string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if place == "" {
		delete(l.places, driver.Holder{Key: key, Owner: owner})
	} else {
		l.places[driver.Holder{Key: key, Owner: owner}] = place
	}
}

// guards reports whether owner's place in key's queue stays live without renewal:
// owner's wait is registered, and the listening connection holds the client's
// advisory lock.
func (l *listener) guards(key, owner string) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.listening && l.waiters[driver.Holder{Key: key, Owner: owner}] != nil
}

// lockID is the client's advisory lock key: the first 64 bits of its channel's
// random part, as placeLive in sql/fragments.sql computes it.
func lockID(channel string) int64 {
	u, _ := strconv.ParseUint(channel[len("dlock_"):len("dlock_")+16], 16, 64)
	return int64(u)
}

// waiter is one registered wait.
type waiter struct {
	l          *listener
	b          *Backend
	key, owner string
	c          chan struct{}
	// Guarded by l.mu:
	sent      bool          // an attempt that may take a place was sent
	inflight  chan struct{} // closed when the attempt in flight ends; nil if none
	stopped   bool          // Stop was called
	abandoned bool          // Stop gave up on the attempt in flight: it withdraws itself
	first     int64         // the number of this wait's first attempt; 0 before it
	firstSent int64         // and when it was sent (see mono)
	seqs      [4]int64      // the latest attempts' numbers, by number modulo 4,
	sents     [4]int64      // and when each was sent (see mono)
	handed    *handoff      // a grant handed to this wait, not yet returned by attempt
	handedTo  string        // the place of a grant handed to this wait (Stop passes it on)
}

// number numbers a new attempt of w, sent now. Called with l.mu held.
func (w *waiter) numberLocked() int64 {
	seq := w.l.seq.Add(1)
	if w.first == 0 {
		w.first, w.firstSent = seq, mono()
	}
	i := seq % int64(len(w.seqs))
	w.seqs[i], w.sents[i] = seq, mono()
	return seq
}

// sentLocked returns when attempt seq of w was sent at the latest: its own time if
// it is one of the latest, else the time of the latest earlier attempt known (the
// attempts are numbered in the order they are sent); 0 if seq is not this wait's.
func (w *waiter) sentLocked(seq int64) int64 {
	if w.first == 0 || seq < w.first {
		return 0
	}
	best, at := int64(0), int64(0)
	for i, s := range w.seqs {
		if s != 0 && s <= seq && s > best {
			best, at = s, w.sents[i]
		}
	}
	if best == 0 {
		return w.firstSent
	}
	return at
}

// handedLocked records a grant a release handed to w's place.
func (w *waiter) handedLocked(h *handoff) {
	if h.sent = w.sentLocked(h.seq); h.sent == 0 {
		return // not this wait's place: its next attempt asks the server
	}
	w.handed, w.handedTo = h, h.place
}

func (w *waiter) C() <-chan struct{} { return w.c }

func (w *waiter) wake() {
	select {
	case w.c <- struct{}{}:
	default:
	}
}

// attempt makes one waiting attempt for w. Its statements run on a context of their
// own (bounded by attemptTimeout and the backend's life), not the caller's: when the
// caller gives up while they are in flight, attempt returns at once, but the
// statement runs to its end and its outcome is learned, so that Stop withdraws the
// place it may have created. (Cancelled, pgx would drop the connection, and the
// server could still commit the place after the withdrawal had run: a ghost place,
// which the next release would reserve the lock for until the place lapsed.)
func (w *waiter) attempt(ctx context.Context, req driver.Request) (driver.Grant, error) {
	l := w.l
	l.mu.Lock()
	for w.inflight != nil { // the core makes one attempt at a time; be safe anyway
		prev := w.inflight
		l.mu.Unlock()
		select {
		case <-prev:
		case <-ctx.Done():
			return driver.Grant{}, wrap("acquire", req.Key, ctx.Err())
		}
		l.mu.Lock()
	}
	if l.closed {
		l.mu.Unlock()
		return driver.Grant{}, driver.ErrClosed
	}
	if h := w.handed; h != nil {
		// The key was handed to our place: return that grant, without a statement.
		w.handed = nil
		if h.ttl == micros(req.TTL) && req.Limit <= 1 && !req.Shared {
			k := driver.Holder{Key: w.key, Owner: w.owner}
			delete(l.places, k) // gone: the next attempt of this owner takes no mark
			if h.more {
				if len(l.behind) > 4096 {
					clear(l.behind) // grants that expired unreleased: only a hint
				}
				l.behind[k] = true
			}
			l.mu.Unlock()
			return driver.Grant{Token: h.token, Age: time.Duration(max(mono()-h.sent, 1))}, nil
		}
	}
	done := make(chan struct{})
	w.inflight, w.sent = done, true // a place may exist from the moment it is sent
	seq := w.numberLocked()
	l.wg.Add(1)
	l.mu.Unlock()
	var g driver.Grant
	var err error
	go func() {
		defer l.wg.Done()
		actx, cancel := context.WithTimeout(l.closeCtx, attemptTimeout)
		g, err = w.b.acquire(actx, req, seq)
		cancel()
		l.mu.Lock()
		w.inflight = nil
		if err == nil {
			w.sent = false // granted: the statement dropped the place
		}
		if w.abandoned && err != nil {
			handed := w.handedTo
			l.withdrawLater(w.key, w.owner, handed, 0)
		}
		l.mu.Unlock()
		close(done)
	}()
	select {
	case <-done:
		return g, err
	case <-ctx.Done():
		return driver.Grant{}, wrap("acquire", req.Key, ctx.Err())
	}
}

// Stop unregisters the wait. A waiter that gives up withdraws the place any of its
// attempts may have taken in the queue, passing on a reservation the lock may have
// made for it; it waits for an attempt still in flight to end first, so that a place
// that attempt creates is withdrawn too (if ctx ends before, the attempt withdraws
// it when it ends).
func (w *waiter) Stop(ctx context.Context, acquired bool) error {
	l := w.l
	l.mu.Lock()
	removed := l.removeLocked(w)
	w.stopped = true
	inflight := w.inflight
	l.mu.Unlock()
	if !removed || acquired {
		return nil
	}
	if inflight != nil {
		select {
		case <-inflight:
		case <-ctx.Done():
			l.mu.Lock()
			pending := w.inflight != nil
			w.abandoned = pending
			l.mu.Unlock()
			if pending {
				return wrap("withdraw waiter", w.key, fmt.Errorf("an attempt is still in flight (it withdraws its place when it ends): %w", ctx.Err()))
			}
		}
	}
	l.mu.Lock()
	handed := w.handedTo
	queued := w.sent || handed != "" || l.places[driver.Holder{Key: w.key, Owner: w.owner}] != ""
	l.mu.Unlock()
	if !queued {
		return nil
	}
	err := w.b.withdraw(ctx, w.key, w.owner, handed)
	if err != nil && !errors.Is(err, driver.ErrClosed) {
		l.mu.Lock()
		l.withdrawLater(w.key, w.owner, handed, withdrawRetry)
		l.mu.Unlock()
	}
	return err
}
