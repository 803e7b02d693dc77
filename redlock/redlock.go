// Package redlock is the dlock backend for the Redlock algorithm: one lock held on a
// majority of N independent Redis masters, with fencing tokens from a majority
// register (URL scheme redlock://), on go-redis v9 with one client per node.
//
//	redlock://h1:6379,h2:6379,h3:6379,h4:6379,h5:6379?ttl=10s
//	redlock://:password@h1,h2,h3/0?node_timeout=20ms&prefix=app
//	redlock://user:password@h1,h2,h3?tls=true&tls_ca=/etc/ca.pem
//
// The nodes are independent masters (not replicas, not a cluster); a port defaults to
// 6379, the path selects the database on every node. User and password in the URL
// apply to every node; nodes with different credentials need New with clients of
// your own. IPv6 literals cannot be written in a comma-separated URL host: use New.
//
// Parameters: prefix (key namespace, default "redlock"); node_timeout (the bound on
// one call to one node, default 10ms); dial_timeout (connecting and the checks made
// by Open, default 2s); tls (true: TLS with the system roots), tls_ca, tls_cert,
// tls_key, tls_server_name (any of them turns TLS on; see driver.ReadTLS);
// allow_few_nodes=true to accept 1 or 2 nodes; allow_eviction=true to accept nodes
// that may evict keys (see WithAllowEviction); and the core's ttl, renew, drift,
// owner. Unknown, repeated or malformed parameters are an error. A node refusing
// the credentials is an error matching driver.ErrAuth.
//
// # Nodes
//
// A lock needs a majority: Q = N/2+1 nodes. N=5 tolerates 2 failed nodes, N=3 one.
// Fewer than 3 nodes is refused unless allow_few_nodes=true: with N=1 there is no
// fault tolerance (use package redislock instead, which is cheaper), and N=2 needs both
// nodes, which is strictly worse than one. An even N costs a node more than N-1 and
// tolerates no more failures. The same address listed twice is refused, and Open
// compares the servers' run ids, so two addresses of one server are refused too, as
// are replicas, and (unless allow_eviction=true) nodes that may evict keys under
// memory pressure (maxmemory with a maxmemory-policy other than noeviction:
// volatile-* too, since lock keys carry a TTL). Open fails unless a majority of
// nodes answer; it also fails if any node refuses the credentials (a configuration
// error that waiting cannot fix); the unreachable minority is tolerated and
// reported by Ping.
//
// # Algorithm
//
// Acquire sends one Lua script to all N nodes at once, each call bounded by the node
// timeout, so a dead or paused node costs at most that much. An acquire whose
// proposed token a majority accepted, and a release that a majority confirmed,
// return without waiting for the slowest nodes: their calls finish in the
// background (a late grant of a failed attempt is given back, a late grant of a
// granted one kept), and every later call for the same key and owner waits, node by
// node, for them, so that each node runs one owner's scripts in the order they were
// made. An acquire also waits so for the releases of the key's other owners through
// the same client: a Lock right after another owner's Release here then finds the
// key free on every node, not held on the ones the release had not reached yet. On
// each node the script sets the lock with SET NX PX (or extends it when the same
// owner already holds it) and returns the node's fencing counter. The attempt
// succeeds only if a majority
// granted it and the validity left, ttl - elapsed - (ttl*drift + 2ms) with elapsed on
// the monotonic clock, is positive when the token is settled; otherwise the lock is
// released on every node that granted it or did not answer (a reply may have been
// lost; nodes that answered "held by another owner" changed nothing) and the attempt
// fails with an error matching ErrLocked, after which the core waits and retries.
// Refresh extends the lock on every node (compare owner, PEXPIRE) and keeps the
// lease only if a majority did so within the validity; a node that lost the key (it
// restarted empty) gets it back then, so a restarted node is closed again within one
// renewal. Release compares the owner and deletes on every node. A node that was
// stopped (not dead) may still run the calls it had buffered when it resumes, so a
// lock released meanwhile can reappear on that one node until its TTL: the majority
// rule makes that harmless, the node just counts as failed for that key meanwhile.
//
// # Fencing: a majority register
//
// Every node keeps a counter per key, the largest token it accepted; it never
// decreases. A token t counts only if a majority of nodes accepted it, and a node
// accepts t only if t is strictly above its counter, raising the counter to t in the
// same atomic script. The client proposes t = (the largest counter it has seen) + 1:
// in the acquire script itself when it can guess (it remembers the counters it saw
// for the key, and a release's wake-up carries the node's counter to the woken
// waiter, so an uncontended cycle or a handoff to a waiter costs one round), or
// else in a second round sent to the nodes that granted the lock, repeated with a
// larger t if a node rejects it. The lock is granted only after a majority accepted
// the token within the validity. A lock handed to a queued writer by a release (see
// Waiting) gets a token each node draws itself, one above its counter: it is used
// as it is only when a majority drew the same one, which the register's argument
// covers as it does readers' tokens (see Read-write locks, no semaphores).
//
// Why a grant that completes before another starts always has the smaller token:
// let grant A's token a be accepted by a majority MA, and grant B, which starts after
// A completed, have its token b accepted by a majority MB. Two majorities of the same
// N nodes share at least one node k. Node k accepted a before B began, so its counter
// was at least a when it accepted b, and it accepts only values strictly above its
// counter: b > a. The same argument shows that no token is issued twice. Re-entry
// (the same owner, from another process) returns the existing token only when every
// node that granted it reports that token and no larger counter, which proves that no
// other grant has completed since; otherwise the owner gets a new, larger token.
//
// What the argument assumes:
//
//   - Counters survive on a majority: a node that accepted a token must not forget it.
//     Run the nodes with appendonly yes and appendfsync always (each write is on disk
//     before the reply); appendfsync everysec survives a crash of the Redis process
//     but a machine crash can lose about a second of counters. A node that restarts
//     empty breaks the argument if it was the only shared node k: then b > a is no
//     longer guaranteed by the intersection. As a fallback, a missing counter restarts
//     from the node's clock in microseconds, which keeps tokens rising while node
//     clocks agree to within the time since the lost tokens were issued and fewer than
//     a million tokens per second are made; that is a clock assumption, so configure
//     persistence. A restarted node also lets the lock itself be granted twice if it
//     restarts empty while it belonged to the holder's majority and more than N-Q
//     nodes are in that state at once; restart nodes with persistence, or keep a
//     restarted node out for at least the largest TTL.
//   - Clock rates, not absolute clocks: each node expires a lock TTL after setting
//     it, by its own clock; the client trusts its grant for ttl*(1-drift) - 2ms minus
//     the time the acquire took, by its monotonic clock. Mutual exclusion holds while
//     no clock runs faster than the drift allowance (default 1%) relative to the
//     client's, and no node's clock is stepped: Redis stores an expiry as a wall
//     clock time, so a step forward (a manual change, NTP stepping instead of
//     slewing) ends that node's locks early.
//   - No pause longer than the validity: a client that stops (GC, swapping, SIGSTOP)
//     past its validity deadline may act while another holds the lock. Lease.Context
//     is cancelled at the deadline, but code that was already past its check keeps
//     running; only a fencing token checked by the protected resource makes that
//     safe, which is why tokens exist.
//
// Mutual exclusion of the lock itself (without fencing) holds under the same
// assumptions: two majorities intersect, and a node holds one owner at a time.
//
// # Waiting
//
// A waiting Lock is woken by pub/sub, targeted: an attempt that finds the key held
// records the waiter on that node (ordered by when it started waiting, with the
// core's patience as expiry), and the release script publishes, on each node, to
// the client of that node's oldest live waiter only. Each client subscribes once to
// its own channel on every node (one subscriber connection per node, opened on first
// contention). So one release wakes one waiter whatever the number of waiting
// clients, and the nodes agree on which one.
//
// When that oldest waiter is a writer (a mutex waiter included), the release does
// not wake it to try again: it hands it the lock, on that node, in the same script
// (with the TTL and value the waiter asked for, and a token the node draws), and
// publishes the grant. Once grants with one token came from a majority of nodes, the
// waiter's Lock returns without another request: a handoff costs one round, the
// release's (handoff.go has the details and the token's argument). A waiter that
// gives up gives back a grant handed to it, even one still on its way, and it goes
// to the next waiter (its client tries again, in the background, the nodes it could
// not reach then, and gives back a grant any of them hands it later); a waiter that got grants on too few nodes claims them with an
// attempt, which gives them back if it fails; a failed attempt of a queued writer
// keeps its place on the nodes it gives back, which are then handed to the oldest
// waiter there, perhaps itself. A waiter whose process dies after a release handed
// it the lock holds that lock until its TTL lapses, as a holder that dies does.
// Clients of earlier versions and of this one can share nodes during an upgrade:
// an earlier client's place is woken, not handed the lock; an earlier client's
// release cannot reach this version's waiters, which then wait for their fallback
// timer, so upgrade every client of a key before relying on the handoff's speed.
//
// A waiter that is woken (a reader, or a waiter of an older client) but beaten to
// the key by a newcomer stays first in line; a client that just woke a waiter makes
// its own next waiting Lock step back for about two round trips, so a tight
// Lock/Release loop does not keep the key to itself. The order is not strict FIFO
// (a newcomer can still take a key that happens to be free on a node where no
// writer waits). An attempt that loses to a majority held by another owner gives
// back what it took without waking a waiter (the holder's release will). Lost
// wake-ups are
// covered by the core's fallback timer, bounded by the holder's remaining TTL. A
// waiter that its last attempt found behind others on a majority of nodes, with
// every node's subscription up, answers those fallback attempts itself, without a
// request, and reports how many are ahead (driver.HeldError.Ahead); so thousands of
// waiters cost the nodes little while they wait. It does so until the lease it
// found, or the shortest lease a place in the queue asked for if that is shorter,
// could have lapsed (times log2 of the places ahead), at most 15 seconds (its
// places are recorded for that much longer), and then asks the nodes again: the
// waiter ahead of it may have been handed the key and died without releasing it,
// and the waiter behind, now first in line, must notice that lease lapse. The
// first in line always asks the nodes. The price: the place of a waiter whose
// process died without withdrawing lapses 15 seconds later, and the releases that
// pick it meanwhile wake nobody (the key is then taken by the next attempt that
// asks the nodes).
//
// An owner that holds the key on a node is refused there like another owner unless
// the request says Reenter (driver.Request), so another process with the same owner
// id neither takes over nor extends the grant.
//
// What is NOT promised: FIFO order; a resume (Reenter) from another process returning
// the same token after nodes lost data (it gets a larger one); any guarantee when the
// assumptions above fail, beyond what fencing tokens give.
//
// # Read-write locks, no semaphores
//
// Redlock is a driver.Sharer: dlock.WithShared takes the read side. Each node keeps
// the key's readers beside its lock key (owner ids scored by when each reader's grant
// lapses, on the node's clock, with each reader's token and value). A node grants a
// writer when it has no lock value and no live reader, and a reader when it has no
// lock value and no live writer queued ahead of the reader (any queued writer, for a
// reader not queued there), so a stream of readers does not pass a queued writer. A
// reader, like a writer, holds only with a majority, renews, restores itself on a
// node that lost it, and is released on every node; so a reader's majority and a
// writer's share a node that refuses the later of the two, under the assumptions of
// the Algorithm section. A writer's release and the last reader's release wake the
// run of readers at the front of a node's queue, or its first writer; a queued
// writer that gives up where no writer holds wakes the run of readers behind it.
// Order is not strict FIFO, as for the mutex, and comes from the waiters' client
// clocks (see Waiting): a reader whose client's clock runs d behind may pass a
// writer that queued less than d before it. ListHolders (driver.HolderLister, for
// dlock.Client.Holders and dlock inspect) lists the readers that hold on a
// majority, the smallest token first; Inspect tells the first. While readers hold,
// each node's lock key holds a marker (see the key layout), so a writer's attempt
// sees them in the read it makes anyway: the mutex's acquire and release scripts
// run no extra command for them. Clients of versions before read-write locks see
// that marker as a holder named "\x1freaders" and refuse every attempt while
// readers hold.
//
// Tokens: readers that start together would reject each other's proposals round
// after round, so a node that rejects a reader's proposal draws a token for it (its
// counter plus one) instead. Unless a majority accepted the proposal, the reader then
// raises the largest token its granting nodes hold (phase one saw every one of them;
// one above the largest counter if a node re-entered the reader's earlier grant and
// drew none) on those nodes, in one round that records the token and lifts each
// counter to it, and holds once a majority did. The register's argument carries
// over: a grant B that starts after grant A completed shares a node k with A's
// majority, whose counter was at least A's token a, so every token k gives or
// accepts for B, and one above its counter, is above a. Readers that overlap may
// share a token; a later grant always has a larger one.
//
// Redlock is not a driver.Semaphorer: a lock call with dlock.WithLimit(n > 1) fails
// with an error matching ErrUnsupported. Majorities count one holder correctly
// because any two of them share a node, which refuses the second; they cannot count
// N > 1: with N permits kept per node, holders can each hold a different majority
// while no node sees more than N of them (5 nodes, N = 2: clients on nodes {1,2,3},
// {3,4,5} and {1,4,5} are three holders, and no node counts more than two), even
// without a fault. Semaphores on Redis are redislock's, on one server.
//
// # Values
//
// A grant's value (driver.Valuer: an election leader's address, say) is stored on
// every node as part of the lock, so it expires, is released and force released
// with it, and the next grant has its own. Acquire writes it, a re-entry replaces
// it, a renewal that restores the lock on a node that lost it writes it back (if
// this client made the grant), and SetValue replaces it on every node where the
// owner holds the lock, leaving the TTL as it was; it succeeds on a majority, and
// otherwise returns an error (matching ErrNotHeld when the owner provably holds no
// majority), leaving the nodes it reached with the new value. Inspect follows its
// rule for the owner: the value that a majority of nodes holds with the owner; when
// none does (a SetValue under way, or one that failed part way), it returns a
// QuorumError rather than guess. A writer's token in Inspect follows the same rule:
// the token a majority of nodes carries, the one the holder's Lock returned (a node
// outside that majority may carry one it drew in a handoff, or 0 while the grant's
// commit is on its way); while none does, a QuorumError. A waiter's value travels
// with its place: a release that hands it the lock sets it with the grant (see
// handoff.go).
//
// # Watching holders
//
// WatchHolder (driver.HolderWatcher, for dlock.Client.Observe) subscribes to the
// key's holder channel on every node, on the subscriber connections that wake-ups
// use (one per node, whatever the number of watches; one subscription per key per
// client), and returns once a majority of nodes confirmed. Every script that
// changes a lock on a node publishes an empty message there: grant (once its token
// is known: in phase one when the proposal is accepted, else at the commit, so that
// the read it causes does not find a leader without a token), re-entry that changes
// the value, restore, SetValue, release, force release; a message from any node
// notifies the watch. A node that confirms the subscription
// later (slow, down, or subscribing again after its connection broke) also
// notifies, since it may have changed meanwhile; so a change made after
// WatchHolder returns is not missed, only heard late from a node that was not
// heard (a connection that hangs without an error is noticed only when it fails;
// Observe's own periodic reads cover that). An expiry is not published: Observe
// reads the holder again when its TTL runs out. The cost on the uncontended path is a PUBLISH per node in acquire
// and in release, to a channel nobody listens to unless someone watches (a lookup
// in the node's channel table).
package redlock

import (
	"errors"
	"sync"
	"sync/atomic"

	"github.com/redis/go-redis/v9"

	"github.com/dlockio/dlock/driver"
	"github.com/dlockio/dlock/internal/callers"
)

// Files: options.go (options), open.go (New, Open, the checks of the nodes),
// errors.go (NodeError, QuorumError), fanout.go (one call to every node), acquire.go
// (phase one and commit rounds), tokens.go (the client side of the majority register,
// the releaser's step back), handoff.go (locks handed to queued writers), release.go (refresh, release), inspect.go (inspect, set value,
// force release), notify.go (waiting by notification), holder.go (watching
// holders), names.go (key layout), scripts.go and scripts/*.lua (the Lua scripts).

// Backend is the Redlock backend. It implements driver.Backend, driver.Notifier,
// driver.Inspector, driver.ForceReleaser, driver.Valuer and driver.HolderWatcher,
// and is safe for concurrent use.
type Backend struct {
	nodes  []*node
	quorum int
	cfg    config
	own    bool // close the clients in Close
	id     string
	nonce  atomic.Uint64
	seq    atomic.Uint64 // numbers the waits and their attempts (see handoff.go)

	mu      sync.Mutex
	closed  bool
	closing chan struct{}
	fence   map[string]uint64         // key -> largest counter seen, for proposals
	grants  map[driver.Holder]grant   // grants made here, to repair nodes
	flights map[driver.Holder]*flight // calls still under way after a fan-out returned early
	yield   map[string]yielding       // key -> a recent release woke a waiter
	wakeCh  string                    // this client's wake-up channel
	waiters map[driver.Holder]*waiter
	// settles and releases: late copies of handoffs (settle.go), by wait id and
	// by holder.
	settles      map[uint64]*settling
	releases     map[driver.Holder]*releaseRecord
	releaseOrder []*releaseRecord      // the records in releases, oldest first
	recent       []*release            // the latest releases that woke a waiter here
	notify       bool                  // subscriber connections started
	holders      map[string]*holderSub // by holder channel (holder.go)
	// subscribed: some node confirmed the subscription
	subscribed bool
	bg         sync.WaitGroup
	// callers runs the fan-outs' node calls on goroutines kept between calls.
	callers *callers.Pool
	// subMu orders the holder channel subscriptions and unsubscriptions, so that
	// the nodes get them in the order the watches start and stop.
	subMu sync.Mutex
}

type node struct {
	idx  int // in Backend.nodes
	addr string
	rdb  *redis.Client
	ps   *redis.PubSub // the client's wake-up subscription, from first contention
	psUp bool          // ps is confirmed and has not failed since; guarded by Backend.mu
}

var (
	_ driver.Notifier      = (*Backend)(nil)
	_ driver.Inspector     = (*Backend)(nil)
	_ driver.ForceReleaser = (*Backend)(nil)
	_ driver.Valuer        = (*Backend)(nil)
	_ driver.HolderWatcher = (*Backend)(nil)
	_ driver.Sharer        = (*Backend)(nil)
	_ driver.HolderLister  = (*Backend)(nil)
)

func (b *Backend) isClosed() bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.closed
}

// Close implements driver.Backend: it stops the subscriber connections and waits for
// the backend's goroutines and, when the backend was made by Open, closes the
// clients (a backend made by New leaves them to the caller).
func (b *Backend) Close() error {
	b.mu.Lock()
	if b.closed {
		b.mu.Unlock()
		return nil
	}
	b.closed = true
	close(b.closing)
	started := b.notify
	b.mu.Unlock()
	var errs []error
	if started {
		for _, n := range b.nodes {
			if err := n.ps.Close(); err != nil && !errors.Is(err, redis.ErrClosed) {
				errs = append(errs, &NodeError{n.addr, err})
			}
		}
	}
	b.bg.Wait()
	b.callers.Close()
	if b.own {
		for _, n := range b.nodes {
			if err := n.rdb.Close(); err != nil {
				errs = append(errs, &NodeError{n.addr, err})
			}
		}
	}
	return driver.Join(errs...)
}

// Shares implements driver.Sharer: a Redlock key has shared (read) holders together
// or one exclusive holder (see Read-write locks in the package documentation).
func (b *Backend) Shares() bool { return true }
