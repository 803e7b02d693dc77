// Package zklock is the dlock backend for Apache ZooKeeper (URL scheme zk://), on
// github.com/go-zookeeper/zk.
//
//	zk://host1:2181,host2:2181,host3:2181/dlock?session_timeout=10s
//	zk://user:password@host:2181/apps/dlock?tls_ca=/etc/zk/ca.pem
//
// The URL names the ensemble (port 2181 when omitted) and the root path under which
// locks live ("/dlock" when the URL has no path; "/" uses the ZooKeeper root). The
// root is created as persistent nodes unless create_root=false. Parameters:
// session_timeout (default 10s, at most 24h; the server may grant another value
// within its minSessionTimeout..maxSessionTimeout, and the backend uses what it
// grants), create_root, tls (true: TLS with the system roots), tls_ca, tls_cert,
// tls_key, tls_server_name (any of them turns TLS on; see driver.ReadTLS); and the
// core's ttl, renew, drift, owner. Unknown, repeated or malformed parameters are an
// error. Open gives up when ctx ends, when the session timeout passes without a
// session, and after driver.DefaultOpenTimeout when ctx has no deadline; a name that
// does not resolve is reported as the ensemble being unreachable, refused
// credentials or permissions as driver.ErrAuth. A user:password in the URL (or WithDigestAuth) authenticates with the digest
// scheme, and the nodes the backend creates are then readable and writable only by
// that identity (the "auth" ACL scheme); without credentials they are open to
// everyone (world:anyone), like most ZooKeeper data. WithACL overrides both.
//
// # Algorithm
//
// A lock is a container node under the root, named "k-" followed by the key escaped
// with url.PathEscape, so a key with '/', spaces, dots or any Unicode is one node
// name that cannot climb the tree, and two keys never share a node (the escaping
// escapes '%' too, so it can be undone). Roots may nest, even inside another root's
// lock node ("/dlock" and "/dlock/k-jobs"): a lock's contenders are its children
// named "lock-...", and the lock nodes of a nested root ("k-...") never count as
// contenders. Contenders create EPHEMERAL_SEQUENTIAL children
// named lock-<owner>-<attempt GUID>-<sequence>. The child with the lowest sequence
// holds the lock; the fencing token is that child's czxid, the zxid of the
// transaction that created it, which the ensemble orders totally. The backend reads
// it from the header of the create's reply (a write's reply carries its own zxid)
// and checks it against the child's stat at the first renewal, ending the grant
// should they differ.
//
// Acquire creates the owner's child if it has none and lists the children in the
// same round trip (the listing is sent right behind the create; a session's requests
// are processed in order, so it sees the new child). An uncontended Lock and Release
// thus cost two round trips and three requests: create, list, delete. If the
// owner's child is the lowest (one of the N lowest for a semaphore of N, see
// below), the lock is granted. Otherwise a TryLock deletes its
// child and reports ErrLocked; a waiting Lock keeps its place in the queue and sets a
// watch on its predecessor only (the child just below its own), so a release wakes
// exactly one waiter and no herd forms. A mutex's waiter that was second in line at
// its last listing (only the holder's child below its own) is granted without a
// request when that child is deleted: sequence numbers only rise, so no child can
// come below it later (one further back lists the queue again, since its
// predecessor may have been a waiter that gave up). Its later attempts (the core's fallback
// against a lost wake-up) are answered without a request while that watch is in
// place, listing the queue again at most every 30 seconds, and report how many
// are ahead (driver.HeldError.Ahead): a waiter makes no request while it waits,
// however long the queue. A waiter that gives up deletes its child.
// Release deletes the child. Refresh writes the child's data (the TTL, and the value
// if there is one, see below), a write that goes through the leader and fails if the
// child is gone. An owner that already has a
// child reuses it (re-entry, or a restarted process resuming with a stable owner id,
// only when the request says Reenter, see driver.Request; otherwise only a child of
// this client's own create, by its GUID, and another client's child of the same owner
// id is a contender like any other): same place in the queue, same token. An owner
// never keeps more than one child of those: extra ones are deleted when seen.
//
// A create whose reply is lost (the connection dropped with the request in flight)
// may or may not have happened. The backend then lists the children and adopts the
// one carrying the attempt's GUID, instead of creating a second child that nobody
// would ever delete (a ghost contender that would block the lock for the life of the
// session). If the create cannot be settled before ctx ends, the GUID is kept and a
// later Release or the local expiry deletes whatever it finds.
//
// # Semaphores
//
// A key locked with a limit of N > 1 (driver.Semaphorer, dlock.WithLimit) is the
// same queue, whose N lowest children hold a permit each: each its own grant, with
// its own token (its czxid, from the same zxid sequence as every grant of the key),
// renewal, value and release. Limits up to 99,999,999 fit (dlock.MaxLimit is lower).
//
// The limit is in every child's name: its GUID part ends in "-n" and N in eight
// digits. A mutex's child is named as older versions name it, and theirs read as
// limit 1. A listing thus tells every contender's limit without a read. An attempt
// checks its new child, once, against the contenders queued before it; if one
// carries another limit, it deletes the child and fails with an error matching
// driver.ErrLimitMismatch that names both limits. Of any two children that outlive
// their check, the younger was checked against the older, so the key's holders and
// queued places always agree on the limit; once the queue is empty, the next child
// sets it. A refused attempt creates and deletes a child, which other attempts'
// listings may see (an attempt checked at that moment may be refused too); it
// changes nothing that lasts. An older version, which knows no limits, parses a
// semaphore's children as contenders and takes the key only once its own child is
// the lowest; an attempt with a limit above 1 is refused against that version's
// child.
//
// Waking stays herd-free. The first queued place (N holders below it) watches the
// deletion of each of the N, so any release, expiry or force release wakes it, and
// it takes the freed permit; a newcomer, queued behind it, cannot. Every later
// place watches its predecessor's deletion and data. A grant that leaves
// contenders behind it writes a mark into its node's data (a third header field,
// "h", kept by later writes), which wakes the place behind, now first in line; that
// one lists the queue and watches the holders. A release thus costs the waiters two
// wake-ups and listings and the new holder one write (a mutex's handoff costs one
// wake-up and at most one listing), whatever the length of the queue; the first in
// line keeps N watches. Several permits freed at once (a force release) go down the queue one
// grant at a time, each grant waking the next place. A mutex's attempt is
// unchanged: the same requests and bytes as before.
//
// An owner id that holds a permit through another client (another process of the
// same owner id, see driver.Request) is refused a second one, waiting or not: the
// attempt deletes its child, keeps no place, and a waiting one watches the other
// client's child and is woken when it goes.
//
// Inspect reports the oldest holder, with Waiters counting the places queued behind
// the N; Holders lists the queue and reads the holders' nodes (N reads in one round
// trip); ForceRelease deletes the N holders' children; the holder watch watches
// every holder's data. Queue (driver.Queuer) lists the places behind the holders in
// sequence order, readers marked Shared, and reads their nodes for their values.
//
// # Read-write locks
//
// A shared (read) attempt (driver.Sharer, dlock.WithShared) joins the same queue as
// an exclusive (write) one, its mode in its child's name: a reader's GUID ends in
// "-s00000001", where a semaphore's carries "-n" and its limit, and a writer's is a
// mutex's, so a listing tells every contender's mode without a read. A reader holds
// when no writer's child is below its own; a writer holds when its child is the
// lowest. So the holders are the lowest writer alone, or the run of readers below
// the lowest writer, and a reader queued behind a writer waits for it: a stream of
// readers cannot starve a writer. Each grant has its own token (its child's czxid,
// from the key's one zxid sequence, so a writer's token is above every earlier
// reader's), renewal, value and release, as a semaphore's permit has.
//
// Waking stays herd-free as far as the queue allows. A queued reader watches the
// deletion of the nearest writer's child below its own; a queued writer watches the
// child just below its own, whatever its mode. A writer's release thus wakes the
// readers queued right behind it, all at once, and each takes the key with its next
// attempt (one listing each), while the writer behind them sleeps until the child
// just below it goes: a reader's release wakes at most one writer, which lists the
// queue and watches the next child below if readers remain. A mutex's attempt costs
// what it did before: the same requests and bytes.
//
// A reader counts as a limit of 1: a reader's attempt is refused with an error
// matching driver.ErrLimitMismatch against a semaphore's contenders queued before
// it, and a semaphore's against a reader's, by the limit check above. A reader and a
// writer never mismatch. An owner id that holds the key as a reader through another
// client is refused a second read grant, as for a semaphore's permit; an attempt in
// the other mode than the owner's grant or place through this backend is refused
// (driver.ErrLocked) without a change. Inspect reports the oldest holder with
// Info.Shared; Holders lists the readers with Info.Shared set and limit 1;
// ForceRelease deletes every holder's child. An older version, which knows no
// readers, takes a reader's child for a mutex's: its mutex waits behind readers as
// behind a writer, its semaphore is refused against them as against a mutex, and
// its children count as writers' here, so mixed versions stay exclusive.
//
// # Values
//
// A grant's value (driver.Valuer) lives in its child's data, after the TTL: the
// create writes it, so a queued place carries it and has it when it becomes the
// holder, and an uncontended Lock with a value costs no extra request. A child
// without a value is written exactly as older versions wrote it (the TTL alone), and
// older children read as grants without a value; an older version reads a child
// with a value as one whose TTL it does not know. Inspect returns the holder's
// value. SetValue reads the holder's child and writes it back with the new value,
// conditional on its version (two requests; a grant of another connection of the
// owner id costs one more, the listing that finds its child). The child exists only
// while it is the holder's (no contender can be created below it), so a write that
// succeeds was made to the owner's grant; a deleted child fails it with
// driver.ErrNotHeld. It keeps the TTL and its start: the write notes the time the
// TTL counts from, so Inspect does not take it for a renewal. A renewal writes the
// value it knows, conditional on the version it last saw, and reads the child again
// if another connection of the owner id changed the value meanwhile. An attempt
// that re-enters a grant (driver.Request.Reenter) writes its own value.
//
// # Listing
//
// List (driver.Lister, dlock list) lists the root's children, decodes the lock
// nodes' names back to keys (url.PathUnescape of what follows "k-"; other names,
// and escapings PathEscape would not write, are skipped), keeps those starting
// with the prefix, and reads each key's holders as Holders does, a listing and
// the holders' nodes, with the requests of up to 64 keys in flight at once on the
// session's connection. ZooKeeper has no range read of child names, so the root's
// whole listing is read whatever the prefix.
//
// # Several keys at once
//
// LockAll and TryLockAll (driver.MultiAcquirer) create a contender child under every
// key of the set in one ZooKeeper multi, all or none, as Acquire creates one; one
// round trip then lists every key's queue and reads each new child's stat (its czxid
// is the token, one zxid for the whole set). If every child is the lowest of its
// queue, the set is granted: each grant is Acquire's, renewed, released, inspected
// and watched like any other. Otherwise one more multi deletes them all and the
// attempt fails with ErrLocked naming the first key whose child was not the lowest
// (a LockAll then takes the keys one by one in key order). A multi cannot make a
// create conditional on a node having no children, so the check follows the create,
// and this is not one invisible step: until the withdrawal, which takes a round
// trip, others see the set's children. A key of the set that was free looks held
// then (Inspect, Holders and holder watches may report the set's owner for that
// moment, and a TryLock of it is refused); a Lock queued meanwhile behind such a
// child is woken by its deletion and proceeds; a semaphore's attempt checked
// against such a child is refused with ErrLimitMismatch, as against any mutex's
// child. The children queue like any contender's, so each key stays exclusive and
// its tokens rise; but the set's hold on a key begins when its child there becomes
// the lowest, which for a key whose holder releases between the multi and the
// listing is later than for the others. Uncontended, a set costs two round trips
// and 1+2n requests (the multi, n listings, n stats), and its release n deletes.
//
// # Holder watching
//
// WatchHolder (driver.HolderWatcher) sets two watches on the backend's session: on
// the lock node's children (its existence while it does not exist) and on the data
// of the holder's child (of each holder's, for a semaphore). Every change of holder (a grant, a release, a force
// release, the expiry of the holder's session) and every SetValue makes one fire;
// ZooKeeper watches fire once, and the watch sets them again as it reads the queue or
// the holder's data, sending only when the holder or its value changed. Nothing is
// polled; the cost is one read per watch for every change of the queue (a waiter
// joining or leaving lists the children) and for every renewal of the holder (which
// writes its child's data, and is not sent on). A watch sends once after every
// reconnection and session expiry, and sets its watches again on a new session.
//
// # Queued places and the session
//
// A queued place is an ephemeral child too, and lives on the session. When the
// session ends (the backend learns of its expiry on reconnection), or when nothing
// was heard from the ensemble for a whole session timeout since the place was last
// confirmed (the session has then most likely expired; if it has not, the child is
// deleted), every waiter whose place it carried is woken, and its next attempt fails
// with an error that does not match driver.ErrLocked: a waiting Lock or Campaign
// fails at once rather than queue again at the back without knowing it.
//
// # Safety model
//
// The ZooKeeper session is the lease. While the session lives, its ephemeral child
// lives; when the session expires on the ensemble (the client was silent for the
// session timeout), the child is deleted and the next waiter is granted. The backend
// closes driver.Grant.Lost, and the core ends the lease at once, when:
//   - the session expires (the library reports it on reconnection);
//   - the holder's child is deleted (a force release, an administrator): at once
//     when a watch is set on it, which the first renewal does (most locks are
//     released before and never pay for it); before that, the renewal itself
//     finds the child gone;
//   - the session may have expired: no request is known to have reached the leader
//     for half the session timeout less 1% (for clock-rate drift). ZooKeeper keeps a
//     session at least the session timeout after the server last heard from the
//     client; in an ensemble a follower passes that news to the leader once per tick,
//     and a tick is at most half the session timeout, hence the half. Every write and
//     a sync heartbeat every sixth of the session timeout count as heard, so a
//     disconnection shorter than about a third of the session timeout keeps the lease,
//     and a longer one ends it before the ensemble can grant the lock to anyone else.
//
// The core's own validity deadline (TTL minus drift after each renewal) applies too,
// cut to the same half-session bound (the backend is a driver.Bounder), so
// Lease.Expiry never promises more than the session; the lease ends at whichever
// comes first. The TTL also bounds a grant whose holder is
// alive but stopped renewing: the backend deletes a child that was not refreshed
// within its TTL (and a queued child whose waiter made no attempt within its
// patience), so a leaked lease does not hold the lock for the life of the process. A
// crashed process holds the lock until its session expires: the session timeout.
// Close ends the session, which deletes its children at once; if the ensemble cannot
// be reached then, they go when the session times out.
//
// What is not promised: ZooKeeper's guarantees hold for a quorum of an ensemble that
// keeps its transaction logs (forceSync=yes, the default). Tokens are zxids: strictly
// increasing for as long as the ensemble's data survives; wiping the data directory
// restarts them. A lease resumed from another session (a restarted process with a
// stable owner id, while the old session has not expired yet) stays tied to the old
// session: when it expires, the child goes and the lease is lost. Between the
// deletion of a holder's child and the moment the holder hears of it, the holder may
// still believe it holds the lock for the notification's latency; fence the resource
// with the token to be safe against that window and against pauses.
package zklock

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/url"
	"sync"
	"time"

	"github.com/go-zookeeper/zk"

	"github.com/dlockio/dlock/driver"
	"github.com/dlockio/dlock/internal/callers"
)

// Scheme is the URL scheme of this backend: zk://host1:2181,host2/root.
const Scheme = "zk"

func init() {
	driver.Register(Scheme, func(ctx context.Context, u *url.URL) (driver.Backend, error) {
		return Open(ctx, u)
	})
}

// Defaults.
const (
	// DefaultRoot is the root path when the URL has none.
	DefaultRoot = "/dlock"
	// DefaultSessionTimeout is the session timeout asked of the server.
	DefaultSessionTimeout = 10 * time.Second
	// MaxSessionTimeout is the longest session timeout WithSessionTimeout accepts
	// (the protocol counts it in int32 milliseconds; servers grant 40s at most
	// unless configured otherwise).
	MaxSessionTimeout = 24 * time.Hour
)

// Backend is the ZooKeeper backend. It implements driver.Backend, driver.Notifier,
// driver.Bounder, driver.Inspector, driver.ForceReleaser, driver.Valuer,
// driver.Semaphorer, driver.Sharer, driver.Queuer, driver.Lister,
// driver.HolderWatcher and driver.MultiAcquirer, and is safe for
// concurrent use. It holds
// one ZooKeeper session; Close ends it, which deletes every node it still has.
type Backend struct {
	conn   *zk.Conn
	events <-chan zk.Event
	root   string // "" for the ZooKeeper root
	acl    []zk.ACL
	log    *slog.Logger
	name   string // redacted URL, for messages

	closing chan struct{}
	ready   chan struct{} // closed when the first session is established
	wg      sync.WaitGroup
	callers *callers.Pool // runs the calls that return early when their context ends (call)

	mu          sync.Mutex
	closed      bool
	readyClosed bool
	timeout     time.Duration // negotiated session timeout
	session     int64         // current session id, 0 when none
	wireSession int64         // from the latest connect response
	wireTimeout time.Duration
	dialedAt    time.Time // when the current connection was established
	heard       time.Time // send time of the latest request known to have reached the leader
	dialErr     error
	entries     map[driver.Holder]*entry
	byPath      map[string]*entry // own child path -> entry
	waiters     map[driver.Holder]*waiter
	predOf      map[string]map[*waiter]bool // watched predecessor path -> waiters
	doomed      map[string]bool             // child paths being deleted in the background
	holders     map[*holderWatch]bool       // live holder watches (WatchHolder)
	granted     int
	hbRunning   bool

	cmu       sync.Mutex // guards the create observations below
	creates   map[string]*createWait
	createXid map[int32]*createWait
}

// async runs f on a goroutine that Close waits for; false if the backend is closed.
func (b *Backend) async(f func()) bool {
	b.mu.Lock()
	if b.closed {
		b.mu.Unlock()
		return false
	}
	b.wg.Add(1)
	b.mu.Unlock()
	go func() {
		defer b.wg.Done()
		f()
	}()
	return true
}

var (
	_ driver.Notifier      = (*Backend)(nil)
	_ driver.Inspector     = (*Backend)(nil)
	_ driver.ForceReleaser = (*Backend)(nil)
	_ driver.Bounder       = (*Backend)(nil)
	_ driver.Valuer        = (*Backend)(nil)
	_ driver.HolderWatcher = (*Backend)(nil)
	_ driver.Semaphorer    = (*Backend)(nil)
	_ driver.Sharer        = (*Backend)(nil)
	_ driver.Queuer        = (*Backend)(nil)
)

// Conn returns the ZooKeeper connection.
func (b *Backend) Conn() *zk.Conn { return b.conn }

// SessionTimeout returns the session timeout the server granted.
func (b *Backend) SessionTimeout() time.Duration {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.timeout
}

func (b *Backend) rootPath() string {
	if b.root == "" {
		return "/"
	}
	return b.root
}

// LockPath returns the path of the node under which key's contenders queue.
func (b *Backend) LockPath(key string) string {
	return b.root + "/" + lockNodePrefix + url.PathEscape(key)
}

// explain adds a hint to errors whose cause is not obvious.
func explain(err error) error {
	if errors.Is(err, zk.ErrNoAuth) || errors.Is(err, zk.ErrAuthFailed) {
		return fmt.Errorf("%w: %w (the session's credentials lack permission: check the user:password or the ACL)", driver.ErrAuth, err)
	}
	return err
}

func wrap(op, key string, err error) error {
	return fmt.Errorf("zklock: %s %q: %w", op, key, explain(err))
}

// permanent reports errors that retrying cannot fix.
func permanent(err error) bool {
	for _, e := range []error{zk.ErrNoAuth, zk.ErrInvalidACL, zk.ErrBadArguments, zk.ErrInvalidPath,
		zk.ErrAPIError, zk.ErrNoChildrenForEphemerals, zk.ErrInvalidFlags, zk.ErrAuthFailed, driver.ErrClosed} {
		if errors.Is(err, e) {
			return true
		}
	}
	return false
}

// call runs a blocking library call, returning early with ctx's error if ctx ends
// first (the call itself finishes in the background, at the latest when the
// connection closes). A call whose ctx can end runs on a goroutine kept between
// calls (internal/callers).
func (b *Backend) call(ctx context.Context, f func() error) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	b.mu.Lock()
	if b.closed {
		b.mu.Unlock()
		return driver.ErrClosed
	}
	if ctx.Done() == nil {
		b.mu.Unlock()
		return f()
	}
	b.wg.Add(1)
	b.mu.Unlock()
	done := make(chan error, 1)
	b.callers.Go(func() {
		defer b.wg.Done()
		done <- f()
	})
	select {
	case err := <-done:
		return err
	case <-ctx.Done():
		return context.Cause(ctx)
	}
}
