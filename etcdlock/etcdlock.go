// Package etcdlock is the dlock backend for etcd v3 (URL scheme etcd://), on
// go.etcd.io/etcd/client/v3.
//
//	etcd://127.0.0.1:2379/dlock?ttl=10s
//	etcd://user:password@h1:2379,h2:2379,h3:2379/app/locks?tls_ca=/etc/etcd/ca.pem
//
// The host part lists the endpoints (port 2379 when omitted); the path is the key
// prefix (default "dlock"). Parameters: tls (true for TLS with the system roots),
// tls_ca, tls_cert, tls_key, tls_server_name (any of them turns TLS on; see
// driver.ReadTLS), timeout (bound on each request, default 5s; a waiting Lock's
// attempt that runs past it is retried like a refused one, so only the caller's
// context ends a wait), dial_timeout (bound on connecting in Open, default 5s); and
// the core's ttl, renew, drift, owner. User and password come from the URL's user info. Unknown, repeated or
// malformed parameters are an error. With TLS, Open makes one handshake of its own
// first, so that a certificate problem is reported by name at once; refused
// credentials, a refused client certificate and denied permissions are errors
// matching driver.ErrAuth.
//
// # Algorithm
//
// Every contender for a lock creates its own member key in the lock's range,
// prefix/<key> followed by the byte 0x1f (Backend.LockPrefix), bound to a session
// lease of its client, with its owner id as the value (and the request's value, if
// any, see Values and holder watching). The lock belongs to the
// member with the lowest create revision; the others queue behind it in
// create-revision order (FIFO). Acquire is one transaction: if no member exists,
// create the own member key, which takes the lock; otherwise a waiting Lock queues
// (creates it too) and a TryLock writes nothing. The queueing write counts the
// members (etcd's in-memory index only) and swaps the lock's tail key, prefix/<key>
// followed by the byte 0x1e, which names the member that queued last, on its lease:
// the waiter watches the member the tail named, once the watch has found it still
// there. No write reads the members sorted by create revision: etcd applies writes
// one at a time, and such a read lists and sorts every member, so thousands of
// waiters queueing at once stalled the server. The tail is a hint only: the check
// that makes a waiter the holder reads the member just ahead by create revision.
// A member created on a lock with nothing in it (no member, tail or limit key),
// which takes the lock, writes no tail: nobody is queued behind it, and the first
// waiter to queue behind it reads the member ahead instead. Its release is then a
// plain delete, where that of a member that wrote the tail also deletes the tail
// if it still names it. "Nothing in it" is a compare over the lock's range, which
// etcd evaluates by reading every member, so a waiter's write asks it only when
// the tail is missing; while members remain, that is only after the tail's member
// ended with its session, or released while others held beside it (readers, a
// semaphore's permits). A withdrawn wait leaves its tail, stale, for that reason.
// The transaction is guarded by "the own member key does not exist", so a retry
// after a lost reply finds the first try's key instead of making another.
// A first member whose value is the caller's owner id, under another member key, is
// taken over only by a request that says Resume (driver.Request: a restarted
// process resuming it with dlock.WithResume): it is moved onto the current
// session's lease, which keeps its create revision and so its token. Without
// Resume it is waited for like any other holder (another live process may use the
// same owner id), and no attempt looks for one: a generated owner id's grants are
// all made through this client, under its own member name.
//
// Member keys are named after the client, the lock's range and <client id>.<n>, n
// the smallest number not in use in that client, not after the owner: owner ids are
// usually random per lock call, and etcd keeps an index entry for every key name
// until its history is compacted, which every read of a lock's members walks. Reused
// names keep those reads as cheap on the millionth grant as on the first.
//
// A waiter watches only its predecessor, the member with the next lower create
// revision (as named by the tail, or read), so a release wakes exactly one waiter. The watch starts at the current
// revision, which keeps it in etcd's synced watcher group (a watch that starts at a
// revision already passed waits for etcd's catch-up loop, which runs every 100ms);
// when the revision moved between the read that found the predecessor and the
// watch's creation, the predecessor is read again at that revision, so no delete is
// missed. A woken waiter checks, in one read, that its own key still exists and is
// now the first. It reads at the revision at which its watch found the member ahead
// gone, serializably (any member that has applied that revision answers, with no
// quorum round): no member can be created ahead of it later, and its own key, there
// at that revision, stays while its session lease is kept, which the grant's Lost
// reports (a force release may delete it at any time, after this read as after a
// linearizable one; the holder learns at its next Refresh). A revision compacted
// meanwhile, or one the member asked has not applied, makes it a linearizable read
// of the current revision. A waiter whose session ends (see Sessions and TTL) is
// woken, and one whose key vanished gives up at once too: its next attempt, and so
// a waiting Lock or Campaign, returns an error matching ErrSessionLost (never
// ErrLocked), because its place in the queue is gone.
//
// Release deletes the own member key. Refresh checks that it still exists, with the
// grant's create revision and owner, first in line (a reader: see Read-write
// locks), on the live session lease. ForceRelease deletes the first member key
// (the first N of a semaphore, see Semaphores; the readers that hold, see
// Read-write locks). Inspect reads the first member (keys
// only, then its value), the number behind it, and its lease's remaining TTL.
// Queue (driver.Queuer) reads every member with its value, sorted, in one read,
// and lists the members behind the holders.
// List (driver.Lister) reads every lock range under a key prefix in one range read.
// Requests that fail because etcd is between leaders are retried within the request
// timeout (every write here is idempotent). A Release whose context has already
// ended sends nothing and leaves the grant as it is (see Backend.Release).
//
// # Semaphores
//
// The backend is a driver.Semaphorer: a request with a limit N above 1
// (dlock.WithLimit) makes the lock a semaphore of N permits, kept in the same
// queue of member keys as a mutex: the first N members by create revision hold a
// permit each, the others wait in create-revision order (FIFO). Each permit is its
// own member key, with its own owner, value, token (its create revision, from the
// cluster's one rising revision counter, as for a mutex), Refresh and Release. A
// permit costs one member key on the session lease, one transaction to give back,
// and one to take by a waiting Lock; two when the lock's limit key is absent or
// says another limit (the first use of a key as a semaphore of N: the first
// transaction writes nothing), and for a TryLock, which counts first and creates
// only if fewer than N are there, so that it never queues.
//
// The limit is kept in two places. Each semaphore member's value carries it (the
// owner id, 0x01, N in decimal, then the value, see Member values), so a read of
// a member tells its lock's limit. And the lock's limit key, prefix/<key> followed
// by the byte 0x1d, outside the members' range and without a lease, holds N while
// the lock is a semaphore: the transaction that creates a semaphore member compares
// it with its own N; one that finds it different writes nothing, and fails with an
// error matching driver.ErrLimitMismatch (naming the key and both limits) if the
// lock has members, or, if it has none, writes the limit key and its member
// together, guarded by "no member exists". A mutex member is created only where
// the limit key is absent: a waiting mutex attempt's transaction compares that (a
// few bytes more on that path), and a TryLock's "no member" condition covers the
// range from the limit key to the end of the members, which costs no byte more. So
// while a lock has members, they are all of one limit, and the limit key says it.
// A limit key or tail left on a lock without members (its last holder expired) is
// deleted by the next attempt that runs into it.
//
// A waiter queued behind the N holders with k members ahead of it holds a permit
// once k-N+1 of them are gone. It keeps one etcd watch on the lock's member range
// that etcd filters to deletes only, from the revision of the read that counted
// the members ahead, and counts the deletes; only when the count says it may be
// among the first N does it ask etcd, in one read (the keys of the members created
// before its own), whether it holds. A release is therefore, as for a mutex, one
// request (the delete), plus one read by the waiter it promotes, and by no other:
// the others count the delete locally. Several permits freed at once promote as
// many waiters. A delete behind the waiter (another waiter giving up) wakes it
// early; it reads its place again and goes on counting. The cost is that every
// delete is sent to every waiter's watch: a release sends one watch event to each
// waiter, where a mutex release sends one in all. Watching only the member N
// places ahead would wake too few (the first waiter must learn of the release of
// any of the N holders, and a member between would change which one is N places
// ahead), and watching each of the N members ahead would make every waiter read.
//
// Holders reads the first member (with its value, the limit) and then the first N;
// Inspect reports the oldest holder and counts the other members beyond the N as
// waiters; ForceRelease deletes the first N; Refresh of a permit checks that fewer
// than N members are ahead of it; SetValue rewrites the permit's member keeping its
// limit. Resuming, with dlock.WithResume, a permit held through another client is
// not supported: the attempt takes a place of its own. Clients of versions before
// semaphores ignore the limit key and read a semaphore member as another owner's
// mutex grant; do not mix them on a semaphore.
//
// # Read-write locks
//
// The backend is a driver.Sharer: a request with driver.Request.Shared set
// (dlock.WithShared) takes a reader's place, in the same queue of member keys as a
// mutex. A reader's member value carries the byte 0x02 after the owner id (then
// 0x00 and the value, if any, see Member values); a writer is a mutex member,
// without a tag, so a read-write lock's writers, and every mutex, cost not a byte
// and not a request more than before. A writer holds when its member is first, as
// a mutex's does; a reader holds when no writer's member was created before its
// own. So the leading run of readers holds together, a writer holds alone, and a
// reader queued behind a writer stays behind it (a stream of readers cannot starve
// a waiting writer). Every token is a create revision, from the one counter.
//
// A waiting reader's attempt is a mutex's transaction (create the member key,
// count the members, swap the tail) that also reads the first 32 members, with
// their values; when the lock has no more, those created before its own are every
// member ahead of it (one request), else it reads those in a read-only
// transaction (two requests). With no writer among them it holds, else it watches
// the nearest writer ahead of it, the one created last, whose delete is the
// earliest moment it may hold. (The read with the write is bounded so that what
// etcd's apply loop reads per write stays small however many members queue.) Woken, it reads its own key and the members ahead again (one read): it
// holds, or watches the writer now nearest (an older one, when the nearest gave up
// first). A waiting writer watches the member just ahead of it, reader or writer,
// as a mutex waiter does. Nobody watches a reader but the writer just behind it.
//
// What a release costs: the delete of the releaser's key, one request, and then
// one read by each member it promotes and by no other. A writer's release wakes
// the readers whose nearest writer it was, which are exactly the run behind it
// that now holds (each reads once and holds; readers behind the next writer watch
// that writer and hear nothing), or the writer just behind it. A reader's release
// wakes only a writer queued just behind its key: that writer reads the member
// ahead again and, while other readers still hold, watches the next one; a writer
// behind k readers therefore reads at most k times before it holds. The cost that
// grows is the reader's read of the members ahead of it, with values, when it
// queues and when its writer goes: a reader queued behind a long queue reads it.
//
// A reader's TryLock is one transaction on a lock without members, as a mutex's
// (also when the first member is a writer: it is refused); on a lock held by
// readers it reads every member and creates its key only if none is a writer,
// guarded by "no member created since the read", three requests in all. Refresh of
// a reader checks its own key alone: no member can be created ahead of it, so a
// reader that held holds for as long as its key exists. Holders and ForceRelease
// read every member, sorted, when the first one is a reader, to find the run of
// readers that holds; Inspect does too, to count the waiters (one read more than
// for a writer). driver.HeldError.Ahead of a writer queued behind readers counts
// every member ahead of it but one.
//
// A reader is a member of limit 1: a reader's attempt on a semaphore's key, and a
// semaphore's attempt on a key held or waited for by readers, fail with an error
// matching driver.ErrLimitMismatch (the limit key, see Semaphores, decides it, as
// for a mutex); readers and writers never mismatch. A reader's grant is never
// resumed through another client, and never turned into a writer's or back (an
// attempt that finds its owner's member of the other kind is refused as held).
// Clients of versions before read-write locks read a reader's member as a mutex
// holder whose owner id ends in the tag: they exclude readers as writers would,
// which is safe, but list only the first of them; they cannot take a shared grant.
//
// # Sets of keys
//
// The backend is a driver.MultiAcquirer: dlock.Client.LockAll and TryLockAll
// take a free set of keys in one etcd transaction whose conditions say that no
// lock of the set has a member (nor a limit key or tail, as for a TryLock; a
// stale one is cleared and the transaction sent again) and which creates every
// member key and tail on the session lease, so all keys are granted at one
// revision (each token is that revision, above every earlier grant of its key)
// or none is, and nobody sees part of the set held. A set with a key held or
// waited for writes nothing; LockAll then waits for the keys one by one in key
// order. etcd bounds the operations of a transaction (--max-txn-ops, 128 by
// default): a set takes two writes per key, so dlock.MaxKeys (64) fits the
// default exactly, and a server with a lower bound refuses larger sets. Each
// condition reads its lock's range, as a TryLock's does.
//
// # Sessions and TTL
//
// A Backend keeps one session lease per distinct lock TTL, rounded up to whole
// seconds (etcd leases count in seconds, and etcd raises a TTL below its minimum,
// 1.5 election timeouts rounded up to whole seconds, which is 2s by default). A
// session is created on first use and kept alive in the background every TTL/3
// whatever the number of locks it carries, so the per-lock renewal of the core costs
// one read. The session tracks when the server can expire it at the earliest (the
// time its last successful keep-alive was sent, plus the lease TTL); if that moment
// comes within a safety margin (TTL/50 + 10ms) without a newer successful
// keep-alive, or the server says the lease is gone, the session ends: every grant
// made under it is reported lost at once (driver.Grant.Lost), and every waiter with
// a place on it is woken (driver.Waiter.C) and gives up with ErrSessionLost. A lease
// revoked or expired on the server is noticed at the next keep-alive, within about TTL/3;
// one the client cannot keep alive, at the safety margin above. The next Acquire
// starts a new session. The backend is a driver.Bounder: after
// each acquire and renewal the core ends the lease's validity no later than that
// margin before the session's earliest expiry, so Lease.Expiry never promises more
// than the session, even for a grant made on a session last kept alive before it.
//
// Because the backend, not the core, keeps sessions alive, it also makes sure a
// member key does not outlive its use while the process runs: a grant the core stops
// refreshing for its TTL (it declared the lease lost) is deleted, a release or
// withdrawal that failed is retried in the background, and keys on a session that
// nothing in the client answers for (a write applied after its request was given up)
// are deleted when the session's periodic check finds them twice.
//
// # Values and holder watching
//
// The backend is a driver.Valuer and a driver.HolderWatcher (dlock's elections:
// Campaign's and Proclaim's values, Leader, Observe), for every holder of a
// semaphore and every reader too. A request's value is stored in its member key,
// after the owner id (and a semaphore's limit or a reader's tag) and the byte 0x00
// (an owner id holds no control byte); a mutex request without one writes the owner id alone, as before, so locking
// without values costs not a byte more. The value is written with the member key, so
// a queued place carries its own value into the grant the queue hands it, and it
// goes with the key: the next grant has its own value or none. An attempt that
// re-enters a grant (driver.Request.Reenter) rewrites the key with its value, in the
// transaction it makes anyway. SetValue is one transaction that compares the member
// key's create revision (the token: a member that was first stays first while it
// exists) and its owner, and rewrites the value keeping the key's lease, so the TTL
// is unchanged; for a grant made through another client with the same owner id it
// reads the first member first. Inspect returns the value with the owner.
//
// WatchHolder is one etcd watch on the lock's range, on the backend's client and
// watch stream, from the revision at which etcd set it up (WatchHolder returns once
// it has). Every change of a member key notifies: a grant, a release, a force
// release, a SetValue, and a lease's expiry or revocation, which etcd signals by
// deleting the lease's keys; so does a waiter that queues or leaves, which the watch
// cannot tell from a change of holder without knowing which member is first, so an
// observer of a busy lock reads it again for every waiter that comes or goes. If
// etcd ends the watch (the member lost the leader, or the history it needs was
// compacted), it is started again from the current revision and notifies once it is
// in place; a broken connection is resumed by the etcd client from the next
// revision, without a gap. Nothing is polled.
//
// Clients of the version before values read a member key with a value as another
// owner's; do not mix them on locks that carry values.
//
// # Safety model
//
// Mutual exclusion holds as long as etcd is linearizable: a member key is created and
// deleted by Raft-committed transactions, and the first member is decided by the
// revisions the cluster assigns. It survives member crashes and leader changes (the
// new leader extends all leases by an election timeout, so leases do not expire
// early). A holder learns that its lease may be lost before the server can expire it
// (see Sessions and TTL), provided the client's and the server's clocks run at about
// the same rate and the holder's process is not paused; a pause can outlast the
// lease, which is what fencing tokens are for.
//
// The fencing token is the member key's create revision: etcd revisions are
// cluster-wide, strictly increasing and never reused, also across restarts and
// leader changes, so a later grant of the same key always has a larger token.
//
// What etcd does not promise: a cluster that loses a majority of its members' data,
// or runs with --unsafe-no-fsync, can forget grants. Restoring a snapshot takes the
// revision back to the snapshot's, so tokens could repeat unless the restore bumps
// it (etcdutl snapshot restore --bump-revision --mark-compacted). A crashed holder
// blocks others until its
// session lease expires: the TTL rounded up as above, plus up to half a second for
// etcd's expiry check.
//
// The prefix is a namespace that dlock alone writes to, under prefix/. Prefixes may
// nest ("app" and "app/jobs"): the byte 0x1f that ends a lock's range is in no
// prefix and no key, so the locks of two prefixes never share a range, whatever
// their keys. The etcd user, with authentication on, needs read and write access to
// the prefix range and permission to grant, keep alive and revoke leases.
//
// Layout change: before this version a lock's range ended in "/" instead of 0x1f.
// Clients of the two layouts do not exclude each other on the same lock; stop every
// older client before starting new ones. (Tokens keep rising: they are revisions.)
package etcdlock

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"sync"
	"time"

	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/dlockio/dlock/driver"
)

// Scheme is the URL scheme of etcd, registered with package driver.
const Scheme = "etcd"

func init() {
	driver.Register(Scheme, func(ctx context.Context, u *url.URL) (driver.Backend, error) {
		return Open(ctx, u)
	})
}

// Defaults.
const (
	DefaultPrefix      = "dlock"
	DefaultTimeout     = 5 * time.Second // bound on each request
	DefaultDialTimeout = 5 * time.Second // bound on connecting in Open
	DefaultPort        = "2379"
)

// ErrSessionLost is returned by a waiting Lock whose session lease ended (expired or
// revoked) while it waited: its place in the queue is gone. Lock again to queue
// afresh.
var ErrSessionLost = errors.New("etcdlock: session lease lost")

// Backend is the etcd backend. It implements driver.Backend, driver.Notifier,
// driver.Inspector, driver.ForceReleaser, driver.Bounder, driver.Valuer,
// driver.Semaphorer, driver.Sharer, driver.MultiAcquirer, driver.HolderWatcher,
// driver.Queuer and driver.Lister, and is safe for concurrent use.
type Backend struct {
	cli     *clientv3.Client
	own     bool // close cli in Close
	prefix  string
	timeout time.Duration

	ctx    context.Context // ends at Close; parent of background work
	cancel context.CancelFunc
	wg     sync.WaitGroup // background goroutines
	grant  chan struct{}  // capacity 1: serialises session creation

	mu        sync.Mutex
	closed    bool
	sessions  map[int64]*session // live sessions by TTL in seconds
	waiters   map[driver.Holder]*waiter
	held      map[driver.Holder]*tracked
	idleWatch bool                     // keepWatchStream runs
	names     map[driver.Holder]string // member key name of each (key, owner) in use here
	burned    map[string]bool          // names of ours found taken by another owner
	firsts    map[string]firstHint     // the first member last read, by lock prefix
	reading   map[string]*firstRead    // reads of the first member under way, by lock prefix
	id        string                   // in this backend's member key names
}

var (
	_ driver.Notifier      = (*Backend)(nil)
	_ driver.Inspector     = (*Backend)(nil)
	_ driver.ForceReleaser = (*Backend)(nil)
	_ driver.Bounder       = (*Backend)(nil)
	_ driver.Valuer        = (*Backend)(nil)
	_ driver.HolderWatcher = (*Backend)(nil)
	_ driver.Semaphorer    = (*Backend)(nil)
	_ driver.Queuer        = (*Backend)(nil)
)

// Client returns the etcd client.
func (b *Backend) Client() *clientv3.Client { return b.cli }

// Prefix returns the key prefix.
func (b *Backend) Prefix() string { return b.prefix }

// LockPrefix returns the etcd key prefix under which the member keys of the lock
// named key live: prefix/<key> and the byte 0x1f, where "%" and "/" in key are
// escaped as %25 and %2F. A member key is the lock prefix followed by <client
// id>.<n>; its value is the owner id, followed by the byte 0x01 and the limit for
// a member of a semaphore or by the byte 0x02 for a reader's, and by the byte 0x00
// and the grant's value when it has one. See lockPrefix for why no lock's range can
// contain another's, whatever the prefixes.
func (b *Backend) LockPrefix(key string) string { return lockPrefix(b.prefix, key) }

func wrap(op, key string, err error) error {
	return fmt.Errorf("etcdlock: %s %q: %w", op, key, err)
}

// opCtx bounds one request by the backend's timeout.
func (b *Backend) opCtx(ctx context.Context) (context.Context, context.CancelFunc) {
	return context.WithTimeout(ctx, b.timeout)
}

// retry runs f, an idempotent request, until it succeeds, fails for good, or ctx
// ends. Each try has a shorter timeout than the whole: a request sent to a member
// whose leader just died is lost without an answer, and a new try reaches the new
// leader as soon as one is elected. All writes of this package are idempotent: they
// create the owner's own member key only if absent, or delete it.
func (b *Backend) retry(ctx context.Context, f func(ctx context.Context) error) error {
	try := min(b.timeout, max(b.timeout/4, 500*time.Millisecond))
	for {
		tctx, cancel := context.WithTimeout(ctx, try)
		err := f(tctx)
		cancel()
		if err == nil || ctx.Err() != nil || !retryable(err) {
			return err
		}
		select {
		case <-time.After(20 * time.Millisecond):
		case <-ctx.Done():
			return err
		}
	}
}

// retryable reports whether err may go away by itself: the try's own timeout, or
// etcd saying it is unavailable (no leader, leader changed, stopping, timed out).
func retryable(err error) bool {
	if errors.Is(err, context.DeadlineExceeded) {
		return true
	}
	var ee rpctypes.EtcdError
	if errors.As(err, &ee) {
		return ee.Code() == codes.Unavailable
	}
	if st, ok := status.FromError(err); ok {
		return st.Code() == codes.Unavailable
	}
	return false
}

func (b *Backend) isClosed() bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.closed
}

// Close implements driver.Backend: it stops the keep-alive of every session and
// revokes the session leases, which deletes the member keys still on them (queued
// places; held grants the core did not release), and, when the backend was made by
// Open, closes the etcd client.
func (b *Backend) Close() error {
	b.mu.Lock()
	if b.closed {
		b.mu.Unlock()
		return nil
	}
	b.closed = true
	var sessions []*session
	for _, s := range b.sessions {
		sessions = append(sessions, s)
	}
	b.sessions = map[int64]*session{}
	for k, h := range b.held {
		h.timer.Stop()
		delete(b.held, k)
	}
	b.mu.Unlock()
	var wg sync.WaitGroup
	for _, s := range sessions {
		wg.Go(func() { s.end(fmt.Errorf("%w: backend closed", driver.ErrClosed), true) })
	}
	wg.Wait()
	b.cancel()
	b.wg.Wait()
	if b.own {
		return b.cli.Close()
	}
	return nil
}
