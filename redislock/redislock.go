// Package redislock is the dlock backend for a single Redis instance (URL schemes
// redis://, rediss:// and unix://), on go-redis v9.
//
//	redis://[[user]:password@]host[:port][/db]?prefix=dlock&ttl=10s
//	rediss://host:6380/0?tls_ca=/etc/ca.pem&tls_cert=c.pem&tls_key=k.pem
//	unix:///run/redis.sock?db=0
//
// Parameters: prefix (key namespace, default "dlock"); replicas and replica_timeout
// (see WithReplicas; default timeout 50ms); strict (see WithStrict); tls_ca,
// tls_cert, tls_key, tls_server_name (rediss only); the go-redis URL options db,
// protocol, client_name, max_retries, min_retry_backoff, max_retry_backoff,
// dial_timeout, read_timeout, write_timeout, pool_fifo, pool_size, pool_timeout,
// min_idle_conns, max_idle_conns, max_active_conns, max_concurrent_dials,
// pipeline_pool_size, pipeline_read_buffer_size, pipeline_write_buffer_size,
// conn_max_idle_time, conn_max_lifetime, conn_max_lifetime_jitter and skip_verify
// (rediss only), each checked before go-redis sees it; and the core's ttl, renew,
// drift, owner. Unknown, repeated or malformed parameters are an error, as is db=
// beside a database in the path. A refused password is an error matching
// driver.ErrAuth.
//
// # Algorithm
//
// Acquire is one Lua script: if the key is free, SET it to the owner id with PX ttl
// and issue a fencing token; if the owner already holds it and the request says
// Reenter (driver.Request: a generated owner id asking again, or an explicit
// resume), extend it and return the same token; otherwise report the holder's
// remaining TTL, and, for a waiting Lock held by another owner, keep the caller's
// place in a FIFO queue. An owner id that holds the key is refused without Reenter
// and changes nothing (no PEXPIRE, no place), since another client or process may
// use the same id; the one exception is a grant a release handed to this client's
// own queued place (its channel is in the lock's handed mark), which the client's
// waiting attempt may claim. Release compares the
// owner and deletes the key, or, when waiters queued, hands it over on the server:
// it grants the key to the first live waiter (with the TTL that waiter asked for),
// issues its token, and publishes the grant on the channel of that waiter's client
// only. A handoff is thus one request, one message, however many wait, the releaser
// cannot barge back in ahead of the queue, and the waiter's Lock returns as soon as
// the message arrives, with its validity counted from when it last asked (see
// driver.Waiter). Each client subscribes to one channel of its own, once. Refresh
// compares the owner and sets PEXPIRE. Waiters also retry after a bounded fallback
// timer in case a message is lost (the retry finds the key already theirs), and a
// queued place that is not renewed by its waiter's attempts expires, so a crashed
// waiter cannot block the queue; one that crashes just after it last asked may be
// handed the key, which then stays blocked for one TTL, as with a crashed holder. A
// waiter that gives up passes on a grant handed to it.
//
// A plain (not yet waiting) attempt runs a variant of the acquire script with the TTL
// written into it, one script per TTL for the first 16 TTLs a Backend uses, since
// every argument of a script call costs the server work; Redis caches each script
// until SCRIPT FLUSH, and a flushed script is sent again on its next use.
//
// # Safety model
//
// Mutual exclusion holds while the one Redis server keeps its data. Tokens are
// max(last token + 1, server clock in milliseconds x 1000) at every grant, kept in a counter
// key without TTL (Backend.TokenKey), so they keep rising even after a restart that lost every key or a
// failover to a replica that had not received the last grants and tokens (a restart
// or a failover takes far longer than the clock term's millisecond), as long as the
// servers' clocks do not step back and fewer than a million grants per second are
// made (the scripts read the server clock with PEXPIRETIME: Redis 7.0 or later). What
// Redis does not promise: with asynchronous replication, a failover to a
// replica that had not yet received a grant lets a second client in; without
// appendonly+fsync, a crash loses grants the same way. In those cases timing cannot
// save you and fencing tokens (checked by the protected resource) must; they do, since
// the second client's token is the higher.
//
// A renewal that reaches the server after the client has declared the lease lost (a
// server paused with SIGSTOP, or a network that held the request, past the local
// validity deadline) is not refused by the script: the server cannot tell when the
// request was sent, and no condition on its own clock could say whether the client's
// deadline has passed without trusting the two clocks to agree. What the core does
// instead: it cancels a refresh at the validity deadline, and a reply that arrives
// after the deadline never brings the lease back (Done stays closed, Err stays
// ErrLeaseLost). Such a late renewal can only extend the grant of an owner that has
// stopped working under it, for at most one TTL: the key stays unavailable that much
// longer (as after a crash), and no one else is let in meanwhile, so exclusion is not
// at stake. (Redis expires a key by its own clock as it resumes, so a renewal that
// arrives after the server's expiry finds the key gone and is refused.)
//
// Two settings narrow those windows. WithReplicas (?replicas=N) follows every acquire
// and refresh with WAIT N (WAITAOF on Redis 7.2+ with the AOF on) in the same round
// trip, and fails closed: an acquire that too few replicas acknowledged is released
// again and reported as ErrNotReplicated. WithStrict (?strict=true) refuses, at Open,
// a server that does not fsync every write (appendonly yes, appendfsync always), since
// only such a server keeps its grants across its own crash; Persistence reports what
// the server does in any case.
package redislock

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"hash/maphash"
	"log/slog"
	"net/url"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/dlockio/dlock/driver"
)

func init() {
	for _, s := range []string{"redis", "rediss", "unix"} {
		driver.Register(s, func(ctx context.Context, u *url.URL) (driver.Backend, error) {
			return Open(ctx, u)
		})
	}
}

// DefaultPrefix is the default key namespace.
const DefaultPrefix = "dlock"

// Option configures a Backend.
type Option func(*Backend) error

// WithPrefix sets the key namespace (default "dlock"): non-empty, without spaces or
// control characters (the byte 0x1f separates a key name's parts; see the key layout
// in scripts.go). Clients that should contend for the same locks must use the same
// prefix; clients with different prefixes never share a key, whatever their lock
// names (prefix "a" with lock "b:lock:c" and prefix "a:lock:b" with lock "c" are
// two locks).
func WithPrefix(p string) Option {
	return func(b *Backend) error {
		if p == "" || strings.ContainsFunc(p, func(r rune) bool { return r == ' ' || r < 0x20 || r == 0x7f }) {
			return fmt.Errorf("%w: redis key prefix must be non-empty and without spaces or control characters, got %q", driver.ErrInvalid, p)
		}
		b.prefix = p
		return nil
	}
}

// Backend is the Redis backend. It implements driver.Backend, driver.Notifier,
// driver.Inspector and driver.ForceReleaser, and is safe for concurrent use.
type Backend struct {
	rdb    redis.UniversalClient
	own    bool // close rdb in Close
	prefix string
	ttlArg atomic.Pointer[boxedInt] // a script argument boxed once, not per call
	tries  tryScripts
	hot    hotKeys
	wakeCh string // this client's wake-up channel
	logger *slog.Logger

	replicas       int
	replicaTimeout time.Duration
	strict         bool

	mu         sync.Mutex
	closed     atomic.Bool // set under mu; read without it
	ps         *redis.PubSub
	waiters    map[waitKey]*waiter    // besides recent
	recent     atomic.Pointer[waiter] // the latest wait, unless it stopped
	subscribed atomic.Bool
	listen     sync.WaitGroup
	seq        atomic.Uint64 // numbers the waiting attempts of this client

	persistence Persistence
}

type waitKey struct{ key, owner string }

var (
	_ driver.Notifier      = (*Backend)(nil)
	_ driver.WatchAdvisor  = (*Backend)(nil)
	_ driver.Inspector     = (*Backend)(nil)
	_ driver.ForceReleaser = (*Backend)(nil)
)

// New returns a backend on an existing go-redis client, which the caller keeps
// owning (Close does not close it). Use a client with ContextTimeoutEnabled so that
// contexts bound every call.
func New(rdb redis.UniversalClient, opts ...Option) (*Backend, error) {
	if rdb == nil {
		return nil, fmt.Errorf("%w: nil redis client", driver.ErrInvalid)
	}
	var id [12]byte
	_, _ = rand.Read(id[:])
	b := &Backend{rdb: rdb, prefix: DefaultPrefix, waiters: make(map[waitKey]*waiter), logger: slog.New(slog.DiscardHandler)}
	for _, o := range opts {
		if err := o(b); err != nil {
			return nil, err
		}
	}
	b.wakeCh = wakeChannel(b.prefix, hex.EncodeToString(id[:]))
	b.hot.seed = maphash.MakeSeed()
	return b, nil
}

// hotKeys remembers, approximately and in fixed space, which keys this client found
// held lately: a slot per key hash with the time (see mono) it was last found held. A
// collision only makes a waiting attempt queue at once, without trying plainly first.
type hotKeys struct {
	seed  maphash.Seed
	slots [64]atomic.Int64
}

// hotFor is how long a key found held counts as contended.
const hotFor = 2 * time.Second

func (h *hotKeys) slot(key string) *atomic.Int64 {
	return &h.slots[maphash.String(h.seed, key)%uint64(len(h.slots))]
}

func (h *hotKeys) mark(key string) { h.slot(key).Store(mono()) }

func (h *hotKeys) seen(key string) bool {
	t := h.slot(key).Load()
	return t != 0 && mono()-t < int64(hotFor) // no clock read for a key never found held
}

type boxedInt struct {
	n int64
	v any
}

// ttlBox returns ms as a script argument, boxed once for the TTL most used.
func (b *Backend) ttlBox(ms int64) any {
	if p := b.ttlArg.Load(); p != nil && p.n == ms {
		return p.v
	}
	b.ttlArg.Store(&boxedInt{ms, ms})
	return ms
}

// maxTryScripts bounds the per-TTL scripts of a Backend (see tryScripts).
const maxTryScripts = 16

// tryScripts keeps the scripts of plain attempts with the TTL written in
// (tryScriptSource), one per TTL, for the first maxTryScripts TTLs a Backend uses:
// Redis keeps every script it was sent until SCRIPT FLUSH, so a program that draws
// TTLs from a wide range must not leave a script behind for each. Other TTLs go
// through acquireScript with the TTL as an argument.
type tryScripts struct {
	last atomic.Pointer[tryScript] // the one used last: no lock on the usual path
	mu   sync.Mutex
	byMs map[int64]*redis.Script
}

type tryScript struct {
	ms int64
	s  *redis.Script
}

// get returns the script for a TTL of ms milliseconds, or nil when the TTLs have
// their maximum of scripts already.
func (t *tryScripts) get(ms int64) *redis.Script {
	if p := t.last.Load(); p != nil && p.ms == ms {
		return p.s
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	s, ok := t.byMs[ms]
	if !ok {
		if len(t.byMs) >= maxTryScripts {
			return nil
		}
		if t.byMs == nil {
			t.byMs = make(map[int64]*redis.Script)
		}
		s = redis.NewScript(tryScriptSource(ms))
		t.byMs[ms] = s
	}
	t.last.Store(&tryScript{ms, s})
	return s
}

// Open returns a backend for a redis://, rediss:// or unix:// URL; see the package
// documentation for its parameters. Options given here apply after the URL's. It
// checks that the server answers and runs Verify before returning.
func Open(ctx context.Context, u *url.URL, opts ...Option) (*Backend, error) {
	if u.Scheme != "redis" && u.Scheme != "rediss" && u.Scheme != "unix" {
		return nil, fmt.Errorf("%w: redislock: scheme %q is not redis, rediss or unix", driver.ErrInvalid, u.Scheme)
	}
	p, err := driver.ParseParams(u)
	if err != nil {
		return nil, fmt.Errorf("redislock: %w", err)
	}
	prefix, err := p.String("prefix", DefaultPrefix)
	if err != nil {
		return nil, err
	}
	tlsFiles := map[string]string{}
	for _, name := range driver.TLSParams {
		if tlsFiles[name], err = p.String(name, ""); err != nil {
			return nil, err
		}
	}
	durability, err := parseDurability(p)
	if err != nil {
		return nil, err
	}
	opt, err := redisOptions(u, p)
	if err != nil {
		return nil, err
	}
	if err := p.Unknown(); err != nil {
		return nil, fmt.Errorf("redislock: %w", err)
	}
	if err := configureTLS(opt, u.Scheme, tlsFiles); err != nil {
		return nil, err
	}
	opt.ContextTimeoutEnabled = true
	rdb := redis.NewClient(opt)
	b, err := New(rdb, append([]Option{WithPrefix(prefix)}, append(durability, opts...)...)...)
	if err != nil {
		rdb.Close()
		return nil, err
	}
	b.own = true
	octx, cancel := driver.OpenContext(ctx)
	defer cancel()
	if err := rdb.Ping(octx).Err(); err != nil {
		rdb.Close()
		if authError(err) {
			err = fmt.Errorf("%w: %w", driver.ErrAuth, err)
		}
		return nil, fmt.Errorf("redislock: connect to %s: %w", driver.Redact(u), err)
	}
	if err := b.Verify(octx); err != nil {
		rdb.Close()
		return nil, err
	}
	return b, nil
}

func configureTLS(opt *redis.Options, scheme string, f map[string]string) error {
	want := f["tls_ca"] != "" || f["tls_cert"] != "" || f["tls_key"] != "" || f["tls_server_name"] != ""
	if !want {
		return nil
	}
	if scheme != "rediss" {
		return fmt.Errorf("%w: tls_* parameters need the rediss:// scheme", driver.ErrInvalid)
	}
	base, err := driver.TLSConfig(f)
	if err != nil {
		return err
	}
	if base.RootCAs != nil {
		opt.TLSConfig.RootCAs = base.RootCAs
	}
	opt.TLSConfig.Certificates = base.Certificates
	if base.ServerName != "" {
		opt.TLSConfig.ServerName = base.ServerName
	}
	return nil
}

// Client returns the go-redis client.
func (b *Backend) Client() redis.UniversalClient { return b.rdb }

// LockKey returns the Redis key that holds the lock named key: the prefix, ":lock",
// the byte 0x1f and the key (see the key layout in scripts.go: no two prefix and key
// pairs share a key).
func (b *Backend) LockKey(key string) string { return lockKey(b.prefix, key) }

// TokenKey returns the Redis key that holds the last fencing token issued for the
// lock named key: its lock key followed by the byte 0x1f and "token" (the scripts
// derive it from the lock key; no lock name or prefix may hold a control byte).
func (b *Backend) TokenKey(key string) string { return lockKey(b.prefix, key) + tokenSuffix }

// keys returns the keys a script on the lock named key is given: its lock key.
func (b *Backend) keys(key string) []string { return []string{b.LockKey(key)} }

func ms(d time.Duration) int64 { return max(int64((d+time.Millisecond-1)/time.Millisecond), 1) }

func wrap(op, key string, err error) error {
	return fmt.Errorf("redislock: %s %q: %w", op, key, err)
}

func (b *Backend) isClosed() bool { return b.closed.Load() }

// Acquire implements driver.Backend. A waiting attempt for a registered waiter that
// was handed the key returns that grant without a request (see driver.Waiter).
//
// A waiting attempt on a key this client has not found held lately is first made
// as a plain one, which costs the server a little less (no queue arguments) and the
// client no bookkeeping: the uncontended Lock costs what TryLock costs. Only if the
// key is held does the same call go on to queue, in a second request.
func (b *Backend) Acquire(ctx context.Context, req driver.Request) (driver.Grant, error) {
	if b.closed.Load() {
		return driver.Grant{}, driver.ErrClosed
	}
	ttl := ms(req.TTL)
	keys := b.keys(req.Key)
	var w *waiter
	if req.Wait {
		w = b.waiter(req.Key, req.Owner)
		// With WithReplicas a handed grant is not taken as it is: the waiter's
		// own attempt re-enters it and WAITs for the replicas.
		if w != nil && b.replicas == 0 {
			if g, ok := w.take(ttl); ok {
				return g, nil
			}
		}
		if w != nil && w.queued.Load() || b.hot.seen(req.Key) {
			return b.acquire(ctx, req, keys, ttl, true, w)
		}
	}
	g, err := b.acquire(ctx, req, keys, ttl, false, nil)
	if errors.Is(err, driver.ErrLocked) {
		b.hot.mark(req.Key)
		if req.Wait {
			return b.acquire(ctx, req, keys, ttl, true, w)
		}
	}
	return g, err
}

// acquire runs the acquire script once: a waiting attempt, which queues if the key
// is held, or a plain one. w, if not nil, is the wait's registered waiter.
func (b *Backend) acquire(ctx context.Context, req driver.Request, keys []string, ttl int64, queue bool, w *waiter) (driver.Grant, error) {
	var cmd *redis.Cmd
	var err error
	if queue {
		flag, seq := byte('-'), uint64(0)
		if w != nil {
			flag, seq = w.attempt()
		}
		arg := make([]byte, 0, 48+len(b.wakeCh))
		arg = append(arg, flag, ' ')
		arg = strconv.AppendInt(arg, ms(req.Patience), 10)
		arg = append(arg, ' ')
		arg = strconv.AppendUint(arg, seq, 10)
		arg = append(arg, ' ')
		arg = append(arg, b.wakeCh...)
		if req.Reenter {
			cmd, err = b.runScript(ctx, acquireScript, keys, req.Owner, b.ttlBox(ttl), arg)
		} else {
			cmd, err = b.runScript(ctx, acquireScript, keys, req.Owner, b.ttlBox(ttl), arg, noReenter)
		}
		if n, _ := cmd.Int64(); n < 0 && w != nil {
			w.queued.Store(true)
		}
	} else if s := b.tries.get(ttl); s != nil {
		if req.Reenter {
			cmd, err = b.runScript(ctx, s, keys, req.Owner)
		} else {
			cmd, err = b.runScript(ctx, s, keys, req.Owner, noReenter)
		}
	} else if req.Reenter {
		cmd, err = b.runScript(ctx, acquireScript, keys, req.Owner, b.ttlBox(ttl))
	} else {
		cmd, err = b.runScript(ctx, acquireScript, keys, req.Owner, b.ttlBox(ttl), "", noReenter)
	}
	n, cerr := cmd.Int64()
	if errors.Is(err, ErrNotReplicated) && cerr == nil && n > 0 {
		// Fail closed: give back a grant the replicas may not have.
		if rerr := releaseScript.Run(ctx, b.rdb, keys, req.Owner).Err(); rerr != nil {
			err = errors.Join(err, fmt.Errorf("release after failed replication: %w", rerr))
		}
		return driver.Grant{}, wrap("acquire", req.Key, err)
	}
	if cerr != nil {
		return driver.Grant{}, wrap("acquire", req.Key, cerr)
	}
	if n > 0 {
		return driver.Grant{Token: uint64(n)}, nil
	}
	if n == 0 {
		// Re-entry after the token counter was lost: the grant stands but cannot
		// be fenced against earlier ones; refuse to pretend.
		return driver.Grant{}, wrap("acquire", req.Key, errors.New("token counter missing for a held key"))
	}
	return driver.Grant{}, &driver.HeldError{RetryAfter: time.Duration(-n-1) * time.Millisecond}
}

// noReenter is the scripts' last argument for an attempt whose request does not say
// Reenter (see luaReenter).
const noReenter = "x"

// Refresh implements driver.Backend.
func (b *Backend) Refresh(ctx context.Context, key, owner string, ttl time.Duration) error {
	cmd, err := b.runScript(ctx, refreshScript, []string{b.LockKey(key)}, owner, ms(ttl))
	if n, cerr := cmd.Int64(); cerr == nil && n == 0 {
		return driver.ErrNotHeld
	}
	if err != nil {
		return wrap("refresh", key, err)
	}
	return nil
}

// Release implements driver.Backend.
func (b *Backend) Release(ctx context.Context, key, owner string) error {
	n, err := releaseScript.Run(ctx, b.rdb, []string{b.LockKey(key)}, owner).Int64()
	if err != nil {
		return wrap("release", key, err)
	}
	if n == 0 {
		return driver.ErrNotHeld
	}
	return nil
}

// ForceRelease implements driver.ForceReleaser.
func (b *Backend) ForceRelease(ctx context.Context, key string) error {
	n, err := forceReleaseScript.Run(ctx, b.rdb, []string{b.LockKey(key)}, b.prefix).Int64()
	if err != nil {
		return wrap("force release", key, err)
	}
	if n == 0 {
		return driver.ErrNotHeld
	}
	return nil
}

// Inspect implements driver.Inspector.
func (b *Backend) Inspect(ctx context.Context, key string) (driver.Info, error) {
	v, err := inspectScript.Run(ctx, b.rdb, b.keys(key), b.prefix).Slice()
	if errors.Is(err, redis.Nil) {
		return driver.Info{}, driver.ErrNotHeld
	}
	if err != nil {
		return driver.Info{}, wrap("inspect", key, err)
	}
	if len(v) != 4 {
		return driver.Info{}, wrap("inspect", key, fmt.Errorf("unexpected reply %v", v))
	}
	owner, _ := v[0].(string)
	pttl, _ := v[1].(int64)
	tokStr, _ := v[2].(string)
	tok, _ := strconv.ParseUint(tokStr, 10, 64)
	live, _ := v[3].(int64)
	return driver.Info{Key: key, Owner: owner, Token: tok, TTL: time.Duration(max(pttl, 0)) * time.Millisecond, Waiters: int(live)}, nil
}

// WatchFirst implements driver.WatchAdvisor: a wait registers before its first
// attempt only on a key this client found held in the last two seconds.
func (b *Backend) WatchFirst(key string) bool { return b.hot.seen(key) }

// Watch implements driver.Notifier. The first call subscribes this client to its
// wake-up channel; every later wait shares that one subscription. Registering a wait
// costs one atomic operation when it is the client's only one (the usual case, an
// uncontended Lock); others go to a map.
func (b *Backend) Watch(ctx context.Context, key, owner string) (driver.Waiter, error) {
	if b.closed.Load() {
		return nil, driver.ErrClosed
	}
	if !b.subscribed.Load() {
		if err := b.subscribe(ctx); err != nil {
			return nil, err
		}
	}
	w := &waiter{b: b, key: key, owner: owner}
	if b.recent.CompareAndSwap(nil, w) {
		return w, nil
	}
	b.mu.Lock()
	if old := b.recent.Swap(w); old != nil {
		b.waiters[waitKey{old.key, old.owner}] = old
	}
	b.mu.Unlock()
	return w, nil
}

// waiter returns the registered waiter of (key, owner), or nil.
func (b *Backend) waiter(key, owner string) *waiter {
	if r := b.recent.Load(); r != nil && r.key == key && r.owner == owner {
		return r
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	if r := b.recent.Load(); r != nil && r.key == key && r.owner == owner {
		return r // moved in meanwhile
	}
	return b.waiters[waitKey{key, owner}]
}

// subscribe subscribes this client to its wake-up channel and starts reading it.
func (b *Backend) subscribe(ctx context.Context) error {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.closed.Load() {
		return driver.ErrClosed
	}
	if b.ps != nil {
		return nil
	}
	ps := b.rdb.Subscribe(ctx, b.wakeCh)
	if _, err := ps.Receive(ctx); err != nil { // the subscription confirmation
		ps.Close()
		return fmt.Errorf("redislock: subscribe: %w", err)
	}
	b.ps = ps
	b.subscribed.Store(true)
	// Read messages on our own goroutine rather than through ps.Channel, which
	// adds a goroutine hop to every wake-up.
	b.listen.Go(func() {
		for {
			m, err := ps.ReceiveMessage(context.Background())
			if err != nil {
				if errors.Is(err, redis.ErrClosed) || b.isClosed() {
					return
				}
				// go-redis reconnects on the next call; wake-ups lost meanwhile
				// are covered by the waiters' fallback timer.
				time.Sleep(50 * time.Millisecond)
				continue
			}
			if b.dispatch(m.Payload) {
				// Let the waiter take its grant before this goroutine goes
				// back to reading (with one P, it would run first).
				runtime.Gosched()
			}
		}
	})
	return nil
}

// dispatch delivers a handoff message, "OWNER TOKEN SEQ TTL KEY", to its waiter, and
// reports whether it found the waiter.
func (b *Backend) dispatch(payload string) bool {
	owner, rest, _ := strings.Cut(payload, " ")
	tok, rest, _ := strings.Cut(rest, " ")
	seq, rest, _ := strings.Cut(rest, " ")
	ttl, key, ok := strings.Cut(rest, " ")
	if !ok {
		return false
	}
	h := handoff{}
	var err1, err2, err3 error
	h.token, err1 = strconv.ParseUint(tok, 10, 64)
	h.seq, err2 = strconv.ParseUint(seq, 10, 64)
	h.ttl, err3 = strconv.ParseInt(ttl, 10, 64)
	if err1 != nil || err2 != nil || err3 != nil {
		return false
	}
	w := b.waiter(key, owner)
	if w == nil {
		return false
	}
	w.deliver(h)
	return true
}

// waiter is one wait of (key, owner) on this client. It numbers its waiting
// attempts and notes when each was sent, so that a grant handed over at release,
// which names the attempt the server last saw, gets a safe Age.
type waiter struct {
	b          *Backend
	key, owner string

	mu     sync.Mutex
	c      chan struct{}           // made when first needed
	first  uint64                  // the number of this wait's first attempt; 0 before it
	seqs   [4]uint64               // the latest attempts' numbers, modulo 4,
	sent   [4]int64                // and when each was sent (see mono)
	tried  atomic.Bool             // a waiting attempt was sent: the server may hold a place or a grant for us
	queued atomic.Bool             // a waiting attempt's reply said it queued
	handed atomic.Pointer[handoff] // a grant handed to us, not yet returned by Acquire
}

// handoff is a grant a release made to a waiter.
type handoff struct {
	token, seq uint64
	ttl        int64 // ms
	sent       int64 // when attempt seq was sent (see mono): the grant's TTL started later
}

// epoch is the origin of mono.
var epoch = time.Now()

// mono reads the monotonic clock, in nanoseconds since epoch.
func mono() int64 { return int64(time.Since(epoch)) }

// chanLocked returns the wake-up channel, making it if needed.
func (w *waiter) chanLocked() chan struct{} {
	if w.c == nil {
		w.c = make(chan struct{}, 1)
	}
	return w.c
}

// take returns the grant handed to the waiter, if there is one for ttl.
func (w *waiter) take(ttl int64) (driver.Grant, bool) {
	h := w.handed.Swap(nil)
	if h == nil || h.ttl != ttl {
		return driver.Grant{}, false
	}
	return driver.Grant{Token: h.token, Age: time.Duration(max(mono()-h.sent, 1))}, true
}

// attempt numbers a new waiting attempt and notes when it is sent (now); it returns
// the queue flag and the number to send with it.
func (w *waiter) attempt() (flag byte, seq uint64) {
	w.mu.Lock()
	defer w.mu.Unlock()
	seq = w.b.seq.Add(1)
	if w.first == 0 {
		w.first = seq
	}
	i := seq % uint64(len(w.seqs))
	w.seqs[i], w.sent[i] = seq, mono()
	w.tried.Store(true)
	flag = '-'
	if w.queued.Load() {
		flag = 'q'
	}
	return flag, seq
}

// deliver takes a handoff message and wakes the waiter.
func (w *waiter) deliver(h handoff) {
	w.mu.Lock()
	if w.first == 0 || h.seq < w.first {
		// For an earlier wait of the same key and owner, whose Stop passes
		// the grant on.
		w.mu.Unlock()
		return
	}
	if i := h.seq % uint64(len(w.seqs)); w.seqs[i] == h.seq {
		h.sent = w.sent[i]
		w.handed.Store(&h)
	}
	// Otherwise the attempt is too old to be remembered: the wake-up alone makes
	// the next attempt ask the server, which finds the key is ours.
	c := w.chanLocked()
	w.mu.Unlock()
	select {
	case c <- struct{}{}:
	default:
	}
}

// C implements driver.Waiter.
func (w *waiter) C() <-chan struct{} {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.chanLocked()
}

// Stop implements driver.Waiter. A wait that did not acquire withdraws its place
// and passes on a grant handed to it, whether Acquire returned it or not, and one
// still on its way: the withdrawal runs after any handoff the server made to it.
func (w *waiter) Stop(ctx context.Context, acquired bool) error {
	b := w.b
	if !b.recent.CompareAndSwap(w, nil) {
		b.mu.Lock()
		if b.waiters[waitKey{w.key, w.owner}] == w {
			delete(b.waiters, waitKey{w.key, w.owner})
		}
		b.mu.Unlock()
	}
	if acquired || !w.tried.Load() {
		return nil
	}
	if err := withdrawScript.Run(ctx, b.rdb, []string{b.LockKey(w.key)}, w.owner, b.prefix, b.wakeCh).Err(); err != nil {
		return wrap("withdraw waiter", w.key, err)
	}
	return nil
}

// Close implements driver.Backend: it ends the wake-up subscription and, when the
// backend was made by Open, closes the connection pool.
func (b *Backend) Close() error {
	b.mu.Lock()
	if b.closed.Load() {
		b.mu.Unlock()
		return nil
	}
	b.closed.Store(true)
	ps := b.ps
	b.mu.Unlock()
	var errs []error
	if ps != nil {
		errs = append(errs, ps.Close())
	}
	b.listen.Wait()
	if b.own {
		errs = append(errs, b.rdb.Close())
	}
	return errors.Join(errs...)
}

var floorCAD = redis.NewScript(`if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end return 0`)

// FloorCycle implements driver.Floorer: the least correct lock, SET NX PX with a
// fresh random value (made as the core makes owner ids: every acquisition needs its
// own, or a stale release could delete a later grant), then a compare-and-delete
// script, on this backend's client, on the key's floor key (see the key layout).
func (b *Backend) FloorCycle(ctx context.Context, key string) error {
	k, v := floorKey(b.prefix, key), driver.RandomHex(16)
	ok, err := b.rdb.SetNX(ctx, k, v, 15*time.Second).Result()
	if err != nil {
		return err
	}
	if !ok {
		return fmt.Errorf("floor key %q held", k)
	}
	return floorCAD.Run(ctx, b.rdb, []string{k}, v).Err()
}

// ServerOps implements driver.OpsCounter: the sum of the calls in INFO
// commandstats, which counts the commands run inside scripts as well, less the INFO
// calls themselves.
func (b *Backend) ServerOps(ctx context.Context) (int64, error) {
	s, err := b.rdb.Info(ctx, "commandstats").Result()
	if err != nil {
		return 0, err
	}
	var total int64
	for line := range strings.SplitSeq(s, "\n") {
		name, rest, ok := strings.Cut(line, ":calls=")
		if !ok || name == "cmdstat_info" {
			continue
		}
		n, _ := strconv.ParseInt(rest[:max(strings.IndexByte(rest, ','), 0)], 10, 64)
		total += n
	}
	return total, nil
}
