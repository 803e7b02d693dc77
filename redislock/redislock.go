// Package redislock is the dlock backend for a single Redis instance (URL schemes
// redis://, rediss:// and unix://), a Sentinel-managed master (redis+sentinel://,
// rediss+sentinel://) and Redis Cluster (redis+cluster://, rediss+cluster://), on
// go-redis v9.
//
//	redis://[[user]:password@]host[:port][/db]?prefix=dlock&ttl=10s
//	rediss://host:6380/0?tls_ca=/etc/ca.pem&tls_cert=c.pem&tls_key=k.pem
//	unix:///run/redis.sock?db=0
//	redis+sentinel://[[user]:password@]s1:26379,s2,s3/MASTERNAME?db=0&replicas=1
//	redis+cluster://[[user]:password@]host1:7000,host2:7001,host3:7002/?replicas=1
//
// Parameters: prefix (key namespace, default "dlock"); replicas and replica_timeout
// (see WithReplicas; default timeout 50ms); strict (see WithStrict);
// allow_eviction (see WithAllowEviction); tls, tls_ca,
// tls_cert, tls_key, tls_server_name (driver.ReadTLS: any of them turns TLS on;
// rediss:// has it on, and tls=false is an error there; not on unix://) and
// skip_verify (with TLS on: no certificate check); the go-redis URL options db,
// protocol, client_name, max_retries, min_retry_backoff, max_retry_backoff,
// dial_timeout, read_timeout, write_timeout, pool_fifo, pool_size, pool_timeout,
// min_idle_conns, max_idle_conns, max_active_conns, max_concurrent_dials,
// pipeline_pool_size, pipeline_read_buffer_size, pipeline_write_buffer_size,
// conn_max_idle_time, conn_max_lifetime and conn_max_lifetime_jitter, each checked
// before go-redis sees it; and the core's ttl, renew, drift, owner. Unknown,
// repeated or malformed parameters are an error, as is db= beside a database in the
// path. A refused password is an error matching
// driver.ErrAuth.
//
// # Sentinel
//
// A redis+sentinel:// URL lists the sentinels (port 26379 when none is given) and
// names the master as its path; rediss+sentinel:// speaks TLS to the sentinels and
// to the data nodes (each connection's certificate is checked against the host it
// dials, unless tls_server_name is given). The URL's userinfo is for the data
// nodes; sentinel_username and sentinel_password authenticate to the sentinels.
// The parameters are those of redis:// (the database as db=N only, since the path
// is the master name). Open builds a go-redis FailoverClient, which asks the
// sentinels for the master and follows a failover. The safety model is that of one
// server replicating asynchronously: a failover to a replica that had not received
// a grant lets a second holder in, and only fencing tokens (which keep rising, see
// below) protect the resource then. With replicas=N every acquire and refresh is
// acknowledged by N replicas (see WithReplicas) before it counts, so a failover to
// one of those replicas keeps the grant (TestSentinelFailoverKeepsLockWithReplicas);
// Sentinel does not promise to promote such a replica, so that narrows the window
// rather than closing it.
//
// # Redis Cluster
//
// A cluster URL lists seed nodes (host:port, port 6379 if left out; go-redis
// learns the rest) and takes the parameters above except db (a cluster has one
// database: db= or a path is an error); rediss+cluster:// is rediss:// for every
// node. New takes a *redis.ClusterClient as well. In a cluster every name of a
// lock K is spelt with "{=K}" where a single server has K (see the key layout in
// names.go), so all of K's keys share a hash slot whatever K holds, and every
// script runs on the one master that owns it; the prefix may then not contain '{'
// or '}'. go-redis follows MOVED and ASK redirections. WAIT (replicas=N) runs on
// the master that owns the lock's slot, on the connection that ran the script,
// and counts that master's replicas; a redirection there is followed by a reload
// of the slot map and another attempt. strict and Verify check every master, and
// Persistence reports the least durable. List scans every master. Mutual exclusion
// holds while the slot's master keeps its data: a failover to a replica that had
// not received a grant lets a second client in, as on a single server, unless
// replicas=N made each grant wait for N of that master's replicas (then a
// failover to one of them keeps it, as TestClusterFailover shows); fencing tokens
// keep rising across it either way.
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
// # Semaphores
//
// A lock with a limit N > 1 (driver.Semaphorer, dlock.WithLimit) is a semaphore of
// N permits. A mutex (limit 0 or 1) is kept exactly as above, with the same keys
// and scripts; a semaphore keeps its holders in a hash at the same lock key (see
// the key layout in names.go): the limit, and one field per holder with the
// holder's expiry on the server's clock, its fencing token, its value and the
// handed mark. Each holder's grant is its own: Refresh, SetValue and Release act on
// that field alone; ForceRelease clears them all. Every script that reads the hash
// first drops the holders whose expiry has passed by the server's TIME, so a
// crashed holder's permit comes back after its TTL, as a mutex's does; the hash
// itself expires with its last holder or queued place. Waiting uses the mutex's
// queue and waiter places: a release (or a force release, or a waiter that gives
// up) hands each freed permit to the first live queued place, with its token, on
// the server, and tells that waiter's client, as a mutex handoff does; an attempt
// that finds permits free (their holders expired) hands them to the places queued
// ahead of it before it may take one, so a newcomer never passes a queued waiter.
// Tokens come from the key's one counter, whatever the limit.
//
// The limit is part of the key's state while the key has holders or queued places:
// an attempt with another limit (a mutex counts as 1) fails with an error matching
// driver.ErrLimitMismatch that names the key and both limits, and changes nothing.
// A semaphore's hash keeps its limit while its places are queued; a mutex's queued
// places, with no lock key, count as limit 1 (so a mutex's waiters whose holder
// expired keep a semaphore out, and so would a semaphore's if its hash were
// deleted by hand). The mutex paths pay nothing for this: the mutex scripts read
// the lock key with the GET they made before, and only a key that turns out to be
// a hash (its GET fails with WRONGTYPE, caught) takes the semaphore path.
//
// What a permit costs: acquire and release are still one script call each, but
// each reads the whole hash (HGETALL) to prune and count, and the queue when one
// is kept: O(N) server work for a limit N, meant for the small limits semaphores
// have (a connection pool, a few concurrent jobs), not thousands of permits. A
// client of an earlier version that meets a semaphore's hash gets an error
// (WRONGTYPE) from its scripts, never a grant.
//
// # Read-write locks
//
// The backend is a driver.Sharer: a shared request (dlock.WithShared) is a reader.
// A read-write lock keeps a semaphore's shape with limit 1: readers are holders
// of the hash at the lock key, each marked shared (its handed mark starts with the
// byte 0x1f, which no channel does), and hold together; a writer holds alone. An
// exclusive request is the mutex and runs the mutex script unchanged: while no
// reader holds or waits, a writer is a mutex (a string key, the same fast path,
// no byte more). Only when its GET finds a hash of limit 1 does a writer take the
// semaphore path, and then it is a holder alone in the hash. A reader's attempt
// runs sem_acquire.lua: on a free key it makes the hash, on readers' hash it
// joins them, and behind a mutex it queues (with a waiting attempt) in the
// mutex's queue. Queued places carry their mode (a shared place's channel is
// marked as a shared holder's is), and keep one order for readers and writers: an
// attempt first hands the key to the places queued ahead as far as they fit (the
// leading run of shared places together, or one exclusive place when nobody
// holds), and is granted only if the queue ran out and it fits, so a reader never
// passes a queued writer. A release does the same on the server: the last reader's
// hands the key to the writer at the head, or a writer's to every reader at the
// head at once, each with its token and a message on its client's channel; a
// mutex release that finds a reader at the head of its queue turns the key into
// the hash. Every grant's token comes from the key's one counter. A reader is one
// request to acquire and one to release, as a permit is, and costs what a permit
// costs (the scripts read the whole hash: readers are meant to be tens, not
// thousands); a writer that meets readers pays that too, an uncontended writer
// nothing. A shared attempt on a semaphore's key (limit > 1) fails with
// driver.ErrLimitMismatch, as does a semaphore's attempt on readers' key. Holders
// lists readers with Info.Shared, and Inspect tells whether the oldest holder is
// one. Queue (driver.Queuer) lists the live queued places in serving order, readers
// marked Shared, each with its value, in one read-only script (queue.lua). State an earlier version wrote (a mutex, its places, a semaphore's hash)
// has no shared mark and reads as exclusive.
//
// # Values
//
// A grant's value (driver.Valuer: an election leader's address, say) lives in a key
// beside the lock key (see the key layout in names.go), written by the script that
// makes the grant with the same expiry, extended by Refresh, replaced by SetValue
// (one script that compares the owner and leaves the TTL as it was) and by a
// re-entry, and deleted with the grant by release, handoff and force release. A
// mark in the lock key says that the value key belongs to the current grant, so an
// expiry takes both at once and a later grant never shows an earlier value. A
// waiting attempt keeps its value with its queued place (each attempt writes it
// again), and the release that hands the key to that place sets it in the same
// script. Inspect returns it. A grant without a value costs nothing more.
//
// # Watching holders
//
// WatchHolder (driver.HolderWatcher, for dlock.Client.Observe) subscribes to the
// key's holder channel on the client's one pub/sub connection, the one wake-ups use:
// watches cost no connection of their own, and the watches of one key on a client
// share one subscription. The scripts publish an empty message there at every
// grant, re-entry that sets or drops a value, release, handoff, force release and
// SetValue. An expiry is not published (Redis reports one only through keyspace
// notifications, a server setting, sent when the server gets round to deleting
// the key): Observe reads the holder again when its TTL runs out, and learns of an
// expiry then. When the pub/sub connection breaks, go-redis reconnects and
// subscribes again, and every watch is then notified once, for what it may have
// missed (a connection that hangs without an error is noticed only when it fails;
// Observe's own periodic reads cover that). The cost on the uncontended path is a PUBLISH in acquire and one in
// release, to a channel nobody listens to unless someone watches: a lookup in the
// server's channel table, as cheap as the EXISTS that would have to tell whether
// anyone listens (well under a microsecond of server time each).
//
// # Multi-key locks
//
// The backend is a driver.MultiAcquirer: dlock.Client.LockAll and TryLockAll take
// a free set in one script call (acquire_all.lua), which checks every key as a
// plain Acquire would (no holder, including a grant a release handed to a queued
// waiter; no semaphore or read-write lock hash with live holders or live queued
// places) and, only if all are free, grants each as Acquire does: its own token
// from the key's counter, the TTL, a message on its holder channel. Redis runs a
// script alone, so nobody sees part of the set held; a set with a taken key
// changes nothing (TryLockAll then fails naming that key, and LockAll waits for the
// keys one at a time, in key order).
// The set's lock keys are all passed to the one script. On Redis Cluster that
// works only for keys of one hash slot: AtomicSet (driver.SetChecker) tells the
// core which sets those are (keys with a common part up to their first '}', as
// "{order1}:a" and "{order1}:b"); the core takes any other set one key at a time,
// and AcquireAll refuses it with driver.ErrUnsupported, changing nothing.
//
// The scripts are files under scripts/, each with a header naming its keys,
// arguments and reply; Redis caches each script until SCRIPT FLUSH, and a flushed
// script is sent again on its next use.
//
// # Listing
//
// List (driver.Lister, dlock list) walks the lock keys under a prefix with SCAN
// (MATCH with the lock key's spelling of the prefix, its glob characters escaped)
// and reads each key's holders with the script Holders runs, a few hundred keys
// per pipelined round trip: mutexes, semaphores and readers alike. SCAN visits
// every key of the database, however few match (of every master, on Redis
// Cluster): an administrative call.
//
// # Bounded state
//
// A released lock leaves nothing on the server for longer than a bounded time: its
// lock key, value key, queue and waiter places expire with the lease or the
// patience they carry (a semaphore's or readers' hash with its last holder or
// place), and its token counter TokenRetention (5 minutes) after the lease of its
// last grant. The counter's expiry is set by the script that issues a token, in the
// SET that stores a new clock term (no extra command in the common case), and
// pushed out, never shortened, by each Refresh and re-entry of a mutex (PEXPIRE GT),
// since re-entry and Inspect read a mutex's token there; a semaphore's or readers'
// holders keep their tokens in the hash, and their counter expires TokenRetention
// after its last grant. So locking a million distinct names once each keeps at most
// the names of the last TokenRetention (plus a lease) on the server, not a million.
//
// Tokens still never go down. The counter expires no earlier than the moment the
// server clock, in milliseconds x 1000, passes the last token it holds: when a
// grant finds the counter ahead of the clock term (more than a thousand grants of
// the key in a millisecond, or a clock set back), the script lengthens the expiry
// by that lead. A token issued after the counter expired is then the clock term,
// larger than every token the counter held, as after a restart that lost it (and
// under the same assumption: the server's clock does not step back, here by more
// than the retention). TestTokenAfterStateExpires shows it with a short retention.
// Counters an earlier version left without TTL get one at their key's next grant.
//
// Measured (redis-server on one host, 100,000 distinct mutexes locked and released
// once, 10s leases): before this expiry, 100,000 keys and 12.1 MB used_memory
// (1.1 MB empty) stayed forever; now the same 100,000 counters stay for the
// retention, at 16.4 MB (the expiry costs about 43 bytes a key), and once it has
// passed the server is back to the live locks' keys (7 for 4 live locks in
// TestStateBounded100k) and 1.6 MB.
//
// # Safety model
//
// Mutual exclusion holds while the one Redis server keeps its data. Tokens are
// max(last token + 1, server clock in milliseconds x 1000) at every grant, kept in a counter
// key (Backend.TokenKey; see Bounded state for its expiry), so they keep rising even after a restart that lost every key or a
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
//
// A server that may evict keys under memory pressure (maxmemory set, and a
// maxmemory-policy other than noeviction: volatile-* too, since every lock key has a
// TTL) may drop a held lock, letting a second holder in, and a token counter within
// the millisecond of its last grants, letting a token repeat. Open (Verify) refuses
// such a server with ErrEvicts, on any master of a cluster, unless WithAllowEviction
// (?allow_eviction=true) accepts the risk, for a shared cache whose policy cannot
// change: then only fencing protects the resource. A policy changed after Open is not
// seen.
package redislock

import (
	"context"
	"fmt"
	"net/url"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/dlockio/dlock/driver"
	"github.com/dlockio/dlock/internal/recent"
)

// The URL schemes of the backend: Scheme for TCP, SchemeTLS for TCP with TLS,
// SchemeUnix for a unix socket, and SchemeSentinel and SchemeSentinelTLS for a
// master found through Redis Sentinel (TLS to the sentinels and the data nodes).
const (
	Scheme            = "redis"
	SchemeTLS         = "rediss"
	SchemeUnix        = "unix"
	SchemeSentinel    = "redis+sentinel"
	SchemeSentinelTLS = "rediss+sentinel"
)

func init() {
	for _, s := range []string{Scheme, SchemeTLS, SchemeUnix, SchemeSentinel, SchemeSentinelTLS} {
		driver.Register(s, func(ctx context.Context, u *url.URL) (driver.Backend, error) {
			return Open(ctx, u)
		})
	}
}

// Backend is the Redis backend. It implements driver.Backend, driver.Notifier,
// driver.Inspector, driver.ForceReleaser, driver.Valuer, driver.Semaphorer,
// driver.Queuer, driver.Lister and driver.HolderWatcher, and is safe for
// concurrent use.
type Backend struct {
	config
	rdb    redis.UniversalClient
	own    bool                     // close rdb in Close
	ttlArg atomic.Pointer[boxedInt] // a script argument boxed once, not per call
	hot    *recent.Slots            // the keys this client found held lately (see hotFor)
	wakeCh string                   // this client's wake-up channel

	mu         sync.Mutex
	closed     atomic.Bool // set under mu; read without it
	ps         *redis.PubSub
	waiters    map[driver.Holder]*waiter // besides recent
	recent     atomic.Pointer[waiter]    // the latest wait, unless it stopped
	subscribed atomic.Bool
	listen     sync.WaitGroup
	seq        atomic.Uint64 // numbers the waiting attempts of this client

	// Holder watches (holder.go), on the connection of ps.
	hmu     sync.Mutex
	holders map[string]*holderSub    // by holder channel
	pings   map[string]chan struct{} // by payload: confirm's pings not yet answered
	pingSeq uint64
	lost    chan struct{} // closed, and replaced, when reading ps failed

	persistence Persistence
}

var (
	_ driver.Notifier      = (*Backend)(nil)
	_ driver.WatchAdvisor  = (*Backend)(nil)
	_ driver.Inspector     = (*Backend)(nil)
	_ driver.ForceReleaser = (*Backend)(nil)
	_ driver.Valuer        = (*Backend)(nil)
	_ driver.HolderWatcher = (*Backend)(nil)
	_ driver.Semaphorer    = (*Backend)(nil)
	_ driver.Sharer        = (*Backend)(nil)
)

// Client returns the go-redis client.
func (b *Backend) Client() redis.UniversalClient { return b.rdb }

// LockKey returns the Redis key that holds the lock named key: the prefix, ":lock",
// the byte 0x1f and the key, which on Redis Cluster is spelt "{=" key "}" (see the
// key layout in names.go: no two prefix and key pairs share a key). It is a string for a mutex and a hash for a semaphore.
func (b *Backend) LockKey(key string) string { return lockKey(b.prefix, b.part(key)) }

// TokenKey returns the Redis key that holds the last fencing token issued for the
// lock named key: its lock key followed by the byte 0x1f and "token" (the scripts
// derive it from the lock key; no lock name or prefix may hold a control byte).
// It expires TokenRetention after the lease of its last grant (see Bounded state
// in the package documentation).
func (b *Backend) TokenKey(key string) string { return b.LockKey(key) + tokenSuffix }

// keys returns the keys a script on the lock named key is given: its lock key.
func (b *Backend) keys(key string) []string { return []string{b.LockKey(key)} }

// ms rounds d up to whole milliseconds, at least 1.
func ms(d time.Duration) int64 { return max(int64((d+time.Millisecond-1)/time.Millisecond), 1) }

func wrap(op, key string, err error) error {
	return fmt.Errorf("redislock: %s %q: %w", op, key, err)
}
