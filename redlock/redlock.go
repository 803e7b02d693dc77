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
// allow_few_nodes=true to accept 1 or 2 nodes; and the core's ttl, renew, drift,
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
// are replicas. Open fails unless a majority of nodes answer; it also fails if any
// node refuses the credentials (a configuration error that waiting cannot fix); the
// unreachable minority is tolerated and reported by Ping.
//
// # Algorithm
//
// Acquire sends one Lua script to all N nodes at once, each call bounded by the node
// timeout, so a dead or paused node costs at most that much. On each node the script
// sets the lock with SET NX PX (or extends it when the same owner already holds it)
// and returns the node's fencing counter. The attempt succeeds only if a majority
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
// for the key, so an uncontended cycle or a handoff to a waiter costs one round), or
// else in a second round sent to the nodes that granted the lock, repeated with a
// larger t if a node rejects it. The lock is granted only after a majority accepted
// the token within the validity.
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
// clients, and the nodes agree on which one. A waiter that is woken but beaten to
// the key by a newcomer stays first in line; a client that just handed the key over
// makes its own next waiting Lock step back for about two round trips, so a tight
// Lock/Release loop does not keep the key to itself. The order is not strict FIFO
// (a newcomer can still take a key that happens to be free). Lost wake-ups are
// covered by the core's fallback timer, bounded by the holder's remaining TTL. A
// waiter that its last attempt found behind others on a majority of nodes, with
// every node's subscription up, answers those fallback attempts itself, without a
// request, for up to 15 seconds (its places are recorded for that much longer), and
// reports how many are ahead (driver.HeldError.Ahead); so thousands of waiters cost
// the nodes little while they wait. The first in line always asks the nodes. The
// price: the place of a waiter whose process died without withdrawing lapses 15
// seconds later, and the releases that pick it meanwhile wake nobody (the key is
// then taken by the next attempt that asks the nodes).
//
// An owner that holds the key on a node is refused there like another owner unless
// the request says Reenter (driver.Request), so another process with the same owner
// id neither takes over nor extends the grant.
//
// What is NOT promised: FIFO order; a resume (Reenter) from another process returning
// the same token after nodes lost data (it gets a larger one); any guarantee when the
// assumptions above fail, beyond what fencing tokens give.
package redlock

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"net"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/dlockio/dlock/driver"
)

func init() {
	driver.Register("redlock", func(ctx context.Context, u *url.URL) (driver.Backend, error) {
		return Open(ctx, u)
	})
}

// Defaults.
const (
	DefaultPrefix      = "redlock"
	DefaultNodeTimeout = 10 * time.Millisecond
	DefaultDialTimeout = 2 * time.Second
	DefaultDrift       = 0.01
	DefaultDriftFixed  = 2 * time.Millisecond
	defaultPort        = "6379"
	maxCommitRounds    = 3
	maxFenceCache      = 4096
	maxYield           = 50 * time.Millisecond
)

// Option configures a Backend.
type Option func(*config) error

type config struct {
	prefix      string
	nodeTimeout time.Duration
	dialTimeout time.Duration
	drift       float64
	driftFixed  time.Duration
	allowFew    bool
}

// WithPrefix sets the key namespace (default "redlock"): non-empty, without spaces
// or control characters (the byte 0x1f separates a key name's parts; see the key
// layout in scripts.go). Clients that should contend for the same locks must use the
// same prefix; clients with different prefixes never share a key, whatever their
// lock names.
func WithPrefix(p string) Option {
	return func(c *config) error {
		if p == "" || strings.ContainsFunc(p, func(r rune) bool { return r == ' ' || r < 0x20 || r == 0x7f }) {
			return fmt.Errorf("%w: redlock key prefix must be non-empty and without spaces or control characters, got %q", driver.ErrInvalid, p)
		}
		c.prefix = p
		return nil
	}
}

// WithNodeTimeout bounds each call to one node (default 10ms): a dead or stopped node
// delays an operation by at most this much. Keep it well below the lease validity,
// and above a round trip to the farthest node (plus a TLS handshake when a connection
// must be made).
func WithNodeTimeout(d time.Duration) Option {
	return func(c *config) error {
		if d <= 0 {
			return fmt.Errorf("%w: node timeout must be positive, got %v", driver.ErrInvalid, d)
		}
		c.nodeTimeout = d
		return nil
	}
}

// WithDrift sets the clock drift allowance the backend subtracts from the TTL when it
// checks that a grant or renewal is still valid (default 1% of the TTL plus 2ms). The
// core applies its own allowance (dlock.WithDrift) on top; set both when clocks may
// run at different rates.
func WithDrift(factor float64, fixed time.Duration) Option {
	return func(c *config) error {
		if factor < 0 || factor >= 0.5 || factor != factor || fixed < 0 {
			return fmt.Errorf("%w: drift needs a factor in [0, 0.5) and a non-negative fixed part, got %v and %v", driver.ErrInvalid, factor, fixed)
		}
		c.drift, c.driftFixed = factor, fixed
		return nil
	}
}

// WithAllowFewNodes accepts 1 or 2 nodes, which give no fault tolerance (see the
// package documentation). Without it New and Open refuse fewer than 3 nodes.
func WithAllowFewNodes() Option {
	return func(c *config) error {
		c.allowFew = true
		return nil
	}
}

// NodeError is the failure of one node in an operation. Errors from several nodes are
// combined with errors.Join; use errors.As to find them.
type NodeError struct {
	Addr string
	Err  error
}

// Error names the node and its error.
func (e *NodeError) Error() string { return "redlock node " + e.Addr + ": " + e.Err.Error() }

// Unwrap returns the underlying error.
func (e *NodeError) Unwrap() error { return e.Err }

// QuorumError reports an operation that did not reach a majority of the nodes. An
// acquire's QuorumError matches driver.ErrLocked (it wraps a *driver.HeldError), so the
// core retries; a refresh or release that proves the owner no longer holds a majority
// matches driver.ErrNotHeld. Err joins the nodes' *NodeError values.
type QuorumError struct {
	Op    string // "acquire", "refresh", "release", ...
	Key   string
	OK    int // nodes that did what was asked
	Need  int // the majority
	Nodes int
	Held  int    // acquire: nodes that answered that another owner holds the key
	Note  string // why a majority of OKs was still not enough, if so
	Err   error  // errors.Join of *NodeError, or nil

	held    *driver.HeldError // for acquire
	notHeld bool
}

// Error says how many nodes answered and why that was not enough.
func (e *QuorumError) Error() string {
	var b strings.Builder
	fmt.Fprintf(&b, "redlock: %s %q: no majority: %d of %d nodes ok (need %d)", e.Op, e.Key, e.OK, e.Nodes, e.Need)
	if e.Held > 0 {
		fmt.Fprintf(&b, ", %d held by another owner", e.Held)
	}
	if e.Note != "" {
		b.WriteString(", " + e.Note)
	}
	if e.held != nil && e.held.RetryAfter > 0 {
		fmt.Fprintf(&b, " (free in %v unless renewed)", e.held.RetryAfter)
	}
	if e.notHeld {
		b.WriteString(": " + driver.ErrNotHeld.Error())
	}
	if e.Err != nil {
		b.WriteString(": " + strings.ReplaceAll(e.Err.Error(), "\n", "; "))
	}
	return b.String()
}

// Unwrap returns the node errors and, for an acquire, a *driver.HeldError, or, when
// the owner provably holds no majority, driver.ErrNotHeld.
func (e *QuorumError) Unwrap() []error {
	var errs []error
	if e.held != nil {
		errs = append(errs, e.held)
	}
	if e.notHeld {
		errs = append(errs, driver.ErrNotHeld)
	}
	if e.Err != nil {
		errs = append(errs, e.Err)
	}
	return errs
}

// Backend is the Redlock backend. It implements driver.Backend, driver.Notifier,
// driver.Inspector, driver.ForceReleaser, driver.Floorer and driver.OpsCounter, and
// is safe for concurrent use.
type Backend struct {
	nodes  []*node
	quorum int
	cfg    config
	own    bool // close the clients in Close
	id     string
	nonce  atomic.Uint64

	mu      sync.Mutex
	closed  bool
	closing chan struct{}
	fence   map[string]uint64   // key -> largest counter seen, for proposals
	tokens  map[grantKey]uint64 // token of grants made here, for counter repair
	yield   map[string]yielding // key -> a recent release woke a waiter
	wakeCh  string              // this client's wake-up channel
	waiters map[waitKey]*waiter
	recent  []release // the latest releases that woke a waiter here
	notify  bool      // subscriber connections started
	// subscribed: some node confirmed the subscription
	subscribed bool
	bg         sync.WaitGroup
}

type grantKey struct{ key, owner string }

// yielding makes this client's waiting Lock calls on a key step back for a moment
// after its release woke a waiter elsewhere, so that the woken waiter is not beaten
// to the key by the releaser's next Lock (a tight Lock/Release loop would otherwise
// keep the key to itself).
type yielding struct {
	until time.Time
	to    []string // the woken waiters, who must not yield
}

type node struct {
	addr string
	rdb  *redis.Client
	ps   *redis.PubSub // the client's wake-up subscription, from first contention
	psUp bool          // ps is confirmed and has not failed since; guarded by Backend.mu
}

var (
	_ driver.Notifier      = (*Backend)(nil)
	_ driver.Inspector     = (*Backend)(nil)
	_ driver.ForceReleaser = (*Backend)(nil)
	_ driver.Floorer       = (*Backend)(nil)
	_ driver.OpsCounter    = (*Backend)(nil)
)

// New returns a backend over existing go-redis clients, one per independent master,
// which the caller keeps owning (Close does not close them). Give the clients
// ContextTimeoutEnabled (so the node timeout bounds every call) and MaxRetries -1
// (one attempt per node per round; the algorithm retries as a whole). New makes no
// network call.
func New(clients []*redis.Client, opts ...Option) (*Backend, error) {
	cfg := config{prefix: DefaultPrefix, nodeTimeout: DefaultNodeTimeout, dialTimeout: DefaultDialTimeout,
		drift: DefaultDrift, driftFixed: DefaultDriftFixed}
	for _, o := range opts {
		if o == nil {
			return nil, fmt.Errorf("%w: nil redlock option", driver.ErrInvalid)
		}
		if err := o(&cfg); err != nil {
			return nil, err
		}
	}
	if err := checkCount(len(clients), cfg.allowFew); err != nil {
		return nil, err
	}
	seen := make(map[string]bool)
	b := &Backend{quorum: len(clients)/2 + 1, cfg: cfg, closing: make(chan struct{}),
		fence: make(map[string]uint64), tokens: make(map[grantKey]uint64), yield: make(map[string]yielding),
		waiters: make(map[waitKey]*waiter)}
	for _, c := range clients {
		if c == nil {
			return nil, fmt.Errorf("%w: nil redis client", driver.ErrInvalid)
		}
		addr := c.Options().Addr
		if seen[addr] {
			return nil, fmt.Errorf("%w: redlock node %s listed twice; the nodes must be distinct, independent masters", driver.ErrInvalid, addr)
		}
		seen[addr] = true
		b.nodes = append(b.nodes, &node{addr: addr, rdb: c})
	}
	var id [8]byte
	_, _ = rand.Read(id[:])
	b.id = hex.EncodeToString(id[:])
	b.wakeCh = wakeChannel(cfg.prefix, b.id)
	return b, nil
}

func checkCount(n int, allowFew bool) error {
	switch {
	case n == 0:
		return fmt.Errorf("%w: redlock needs at least one node", driver.ErrInvalid)
	case n < 3 && !allowFew:
		return fmt.Errorf("%w: redlock with %d node(s) has no fault tolerance; use 3 or more independent masters (5 tolerates 2 failures), or allow_few_nodes=true for development", driver.ErrInvalid, n)
	}
	return nil
}

// Open returns a backend for a redlock:// URL; see the package documentation for its
// parameters. It checks the nodes before returning: a majority must answer, every
// node that answers must accept the credentials and be a master, and no server may
// be listed twice.
func Open(ctx context.Context, u *url.URL) (*Backend, error) {
	if u.Scheme != "redlock" {
		return nil, fmt.Errorf("%w: redlock URL must use the redlock:// scheme", driver.ErrInvalid)
	}
	p, err := driver.ParseParams(u)
	if err != nil {
		return nil, fmt.Errorf("redlock: %w", err)
	}
	var opts []Option
	prefix, err := p.String("prefix", DefaultPrefix)
	if err != nil {
		return nil, err
	}
	opts = append(opts, WithPrefix(prefix))
	nodeTimeout, err := p.Duration("node_timeout", DefaultNodeTimeout)
	if err != nil {
		return nil, err
	}
	opts = append(opts, WithNodeTimeout(nodeTimeout))
	dialTimeout, err := p.Duration("dial_timeout", DefaultDialTimeout)
	if err != nil {
		return nil, err
	}
	allowFew, err := p.Bool("allow_few_nodes", false)
	if err != nil {
		return nil, err
	}
	if allowFew {
		opts = append(opts, WithAllowFewNodes())
	}
	tlsBase, err := driver.ReadTLS(p)
	if err != nil {
		return nil, fmt.Errorf("redlock: %w", err)
	}
	if err := p.Unknown(); err != nil {
		return nil, err
	}
	db := 0
	if path := strings.Trim(u.Path, "/"); path != "" {
		if db, err = strconv.Atoi(path); err != nil || db < 0 {
			return nil, fmt.Errorf("%w: redlock URL path must be a database number, got %q", driver.ErrInvalid, u.Path)
		}
	}
	addrs, err := parseHosts(u.Host)
	if err != nil {
		return nil, err
	}
	if err := checkCount(len(addrs), allowFew); err != nil {
		return nil, err
	}
	clients := make([]*redis.Client, len(addrs))
	for i, addr := range addrs {
		opt := &redis.Options{
			Addr:                  addr,
			DB:                    db,
			DialTimeout:           dialTimeout,
			ContextTimeoutEnabled: true,
			MaxRetries:            -1, // one call per node per round: the algorithm retries as a whole
			DialerRetries:         1,  // one dial per call, so a dead node fails fast with its own error
			DisableIdentity:       true,
		}
		if u.User != nil {
			opt.Username = u.User.Username()
			opt.Password, _ = u.User.Password()
		}
		if tlsBase != nil {
			opt.TLSConfig = tlsBase.Clone()
			if opt.TLSConfig.ServerName == "" {
				opt.TLSConfig.ServerName, _, _ = net.SplitHostPort(addr)
			}
		}
		clients[i] = redis.NewClient(opt)
	}
	closeAll := func() {
		for _, c := range clients {
			c.Close()
		}
	}
	b, err := New(clients, opts...)
	if err != nil {
		closeAll()
		return nil, err
	}
	b.own = true
	b.cfg.dialTimeout = dialTimeout
	if err := b.check(ctx); err != nil {
		closeAll()
		return nil, fmt.Errorf("redlock: open %s: %w", driver.Redact(u), err)
	}
	return b, nil
}

// parseHosts splits "h1:6379,h2,h3:7000" into host:port addresses, refusing empty
// entries, bad ports and duplicates.
func parseHosts(hosts string) ([]string, error) {
	if hosts == "" {
		return nil, fmt.Errorf("%w: redlock URL lists no nodes; write redlock://h1:6379,h2:6379,h3:6379", driver.ErrInvalid)
	}
	var addrs []string
	seen := make(map[string]bool)
	for h := range strings.SplitSeq(hosts, ",") {
		host, port := h, defaultPort
		if i := strings.LastIndexByte(h, ':'); i >= 0 {
			host, port = h[:i], h[i+1:]
		}
		if host == "" {
			return nil, fmt.Errorf("%w: empty node in redlock host list %q", driver.ErrInvalid, hosts)
		}
		if n, err := strconv.Atoi(port); err != nil || n < 1 || n > 65535 {
			return nil, fmt.Errorf("%w: redlock node %q has a bad port", driver.ErrInvalid, h)
		}
		addr := net.JoinHostPort(strings.ToLower(host), port)
		if seen[addr] {
			return nil, fmt.Errorf("%w: redlock node %s listed twice; the nodes must be distinct, independent masters", driver.ErrInvalid, addr)
		}
		seen[addr] = true
		addrs = append(addrs, addr)
	}
	return addrs, nil
}

// check is Open's look at the nodes: see Open.
func (b *Backend) check(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, b.cfg.dialTimeout)
	defer cancel()
	type nodeInfo struct{ runID, role string }
	infos := make([]nodeInfo, len(b.nodes))
	errs := make([]error, len(b.nodes))
	var wg sync.WaitGroup
	for i, n := range b.nodes {
		wg.Go(func() {
			s, err := n.rdb.Info(ctx, "server", "replication").Result()
			if err != nil {
				errs[i] = err
				return
			}
			for line := range strings.SplitSeq(s, "\n") {
				k, v, _ := strings.Cut(strings.TrimSpace(line), ":")
				switch k {
				case "run_id":
					infos[i].runID = v
				case "role":
					infos[i].role = v
				}
			}
		})
	}
	wg.Wait()
	var fatal, down []error
	byRun := make(map[string]string)
	for i, n := range b.nodes {
		if err := errs[i]; err != nil {
			var rerr redis.Error
			if errors.As(err, &rerr) && !strings.HasPrefix(err.Error(), "LOADING") {
				// The server answered with an error: credentials, ACL or
				// configuration. Waiting will not fix it.
				if authError(err) {
					err = fmt.Errorf("%w: %w", driver.ErrAuth, err)
				}
				fatal = append(fatal, &NodeError{n.addr, err})
			} else {
				down = append(down, &NodeError{n.addr, err})
			}
			continue
		}
		if infos[i].role != "" && infos[i].role != "master" {
			fatal = append(fatal, &NodeError{n.addr, fmt.Errorf("%w: the server is a %s; redlock needs independent masters", driver.ErrInvalid, infos[i].role)})
		}
		if id := infos[i].runID; id != "" {
			if other, dup := byRun[id]; dup {
				fatal = append(fatal, &NodeError{n.addr, fmt.Errorf("%w: the same server as node %s (run_id %s); the nodes must be distinct", driver.ErrInvalid, other, id)})
			}
			byRun[id] = n.addr
		}
	}
	if len(fatal) > 0 {
		return errors.Join(append(fatal, down...)...)
	}
	if up := len(b.nodes) - len(down); up < b.quorum {
		return fmt.Errorf("only %d of %d nodes answered, a majority is %d: %w", up, len(b.nodes), b.quorum, errors.Join(down...))
	}
	return nil
}

// authError reports whether err is a node refusing the credentials or the ACL
// permission for a command.
func authError(err error) bool {
	msg := err.Error()
	for _, p := range []string{"WRONGPASS", "NOAUTH", "NOPERM", "ERR AUTH", "ERR invalid password", "ERR Client sent AUTH"} {
		if strings.HasPrefix(msg, p) {
			return true
		}
	}
	return false
}

// Ping checks every node and returns the failures joined (*NodeError values), or nil
// when all answer. The backend works while a majority answers.
func (b *Backend) Ping(ctx context.Context) error {
	errs := fanout(ctx, b, b.all(), func(ctx context.Context, n *node) (struct{}, error) {
		return struct{}{}, n.rdb.Ping(ctx).Err()
	}).errs
	return b.nodeErrors(errs)
}

// Nodes returns the node addresses in order.
func (b *Backend) Nodes() []string {
	s := make([]string, len(b.nodes))
	for i, n := range b.nodes {
		s[i] = n.addr
	}
	return s
}

// Clients returns the go-redis clients, one per node, in order.
func (b *Backend) Clients() []*redis.Client {
	s := make([]*redis.Client, len(b.nodes))
	for i, n := range b.nodes {
		s[i] = n.rdb
	}
	return s
}

// Quorum returns the number of nodes that make a majority.
func (b *Backend) Quorum() int { return b.quorum }

// LockKey returns the Redis key, on every node, that holds the lock named key: the
// prefix, ":lock", the byte 0x1f and the key (see the key layout in scripts.go).
func (b *Backend) LockKey(key string) string { return lockKey(b.cfg.prefix, key) }

// FenceKey returns the Redis key, on every node, that holds the fencing counter of key.
func (b *Backend) FenceKey(key string) string { return fenceKey(b.cfg.prefix, key) }

func (b *Backend) keys(key string) []string {
	return []string{lockKey(b.cfg.prefix, key), fenceKey(b.cfg.prefix, key), waitSetKey(b.cfg.prefix, key)}
}

func (b *Backend) waiterPrefix(key string) string { return waiterPrefix(b.cfg.prefix, key) }

func (b *Backend) newNonce() string {
	return b.id + "." + strconv.FormatUint(b.nonce.Add(1), 36)
}

func ms(d time.Duration) int64 { return max(int64((d+time.Millisecond-1)/time.Millisecond), 1) }

// validity is how long a grant or renewal made at start stays trustworthy.
func (b *Backend) validity(ttl time.Duration, start time.Time) time.Duration {
	return ttl - time.Since(start) - (time.Duration(float64(ttl)*b.cfg.drift) + b.cfg.driftFixed)
}

func (b *Backend) isClosed() bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.closed
}

func (b *Backend) all() []int {
	s := make([]int, len(b.nodes))
	for i := range s {
		s[i] = i
	}
	return s
}

type results[T any] struct {
	vals []T
	errs []error // nil for a node that answered (or was not asked)
	sent []bool
}

// fanout calls f on the listed nodes in parallel, each bounded by the node timeout,
// and waits for all of them.
func fanout[T any](ctx context.Context, b *Backend, idx []int, f func(context.Context, *node) (T, error)) results[T] {
	r := results[T]{vals: make([]T, len(b.nodes)), errs: make([]error, len(b.nodes)), sent: make([]bool, len(b.nodes))}
	call := func(i int) {
		nctx, cancel := context.WithTimeout(ctx, b.cfg.nodeTimeout)
		r.vals[i], r.errs[i] = f(nctx, b.nodes[i])
		cancel()
	}
	var wg sync.WaitGroup
	for j, i := range idx {
		r.sent[i] = true
		if j == len(idx)-1 {
			call(i) // the last one on this goroutine
			break
		}
		wg.Go(func() { call(i) })
	}
	wg.Wait()
	return r
}

func (b *Backend) nodeErrors(errs []error) error {
	var joined []error
	for i, err := range errs {
		if err != nil {
			joined = append(joined, &NodeError{Addr: b.nodes[i].addr, Err: err})
		}
	}
	return errors.Join(joined...)
}

type acqReply struct {
	status  int64 // 0 held, 1 fresh grant, 2 re-entry
	counter uint64
	x       int64 // token (fresh, re-entry) or pttl (held)
	rank    int64 // held: the owner's place in the wait set, -1 if not there
}

func parseAcq(v any, err error) (acqReply, error) {
	if err != nil {
		return acqReply{}, err
	}
	a, ok := v.([]any)
	if !ok || len(a) < 3 || len(a) > 4 {
		return acqReply{}, fmt.Errorf("unexpected script reply %v", v)
	}
	n := [4]int64{3: -1}
	for i := range a {
		if n[i], ok = a[i].(int64); !ok {
			return acqReply{}, fmt.Errorf("unexpected script reply %v", v)
		}
	}
	return acqReply{status: n[0], counter: uint64(max(n[1], 0)), x: n[2], rank: n[3]}, nil
}

// guess returns the proposal for key: one above the largest counter seen, or 0.
func (b *Backend) guess(key string) uint64 {
	b.mu.Lock()
	defer b.mu.Unlock()
	if c, ok := b.fence[key]; ok {
		return c + 1
	}
	return 0
}

// saw records a counter seen for key.
func (b *Backend) saw(key string, c uint64) {
	if c == 0 {
		return
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	if old, ok := b.fence[key]; ok && old >= c {
		return
	}
	if len(b.fence) >= maxFenceCache {
		clear(b.fence) // the cache only saves a round trip
	}
	b.fence[key] = c
}

func (b *Backend) yieldTo(key string, woken []string, d time.Duration) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if len(b.yield) >= maxFenceCache {
		now := time.Now()
		for k, y := range b.yield {
			if now.After(y.until) {
				delete(b.yield, k)
			}
		}
	}
	b.yield[key] = yielding{until: time.Now().Add(d), to: woken}
}

// yieldFor returns how long a waiting attempt by owner should step back, or 0.
func (b *Backend) yieldFor(key, owner string) time.Duration {
	b.mu.Lock()
	defer b.mu.Unlock()
	y, ok := b.yield[key]
	if !ok {
		return 0
	}
	left := time.Until(y.until)
	if left <= 0 {
		delete(b.yield, key)
		return 0
	}
	if slices.Contains(y.to, owner) {
		return 0
	}
	return left
}

// Acquire implements driver.Backend: phase one on all nodes, then, unless the
// proposal settled the token, commit rounds on the nodes that granted.
func (b *Backend) Acquire(ctx context.Context, req driver.Request) (driver.Grant, error) {
	if b.isClosed() {
		return driver.Grant{}, driver.ErrClosed
	}
	if req.Wait && !b.isQueued(req.Key, req.Owner) {
		// A newcomer, not a waiter that was woken.
		if d := b.yieldFor(req.Key, req.Owner); d > 0 {
			return driver.Grant{}, fmt.Errorf("redlock: acquire %q: stepping back for a waiter this client's release woke: %w",
				req.Key, &driver.HeldError{RetryAfter: d})
		}
	}
	if ahead, ok := b.stillQueued(req); ok {
		return driver.Grant{}, fmt.Errorf("redlock: acquire %q: still queued, %d ahead: %w",
			req.Key, ahead, &driver.HeldError{Ahead: ahead})
	}
	start := time.Now()
	keys := b.keys(req.Key)
	proposal := b.guess(req.Key)
	wait, since := b.waitArgs(req)
	ttl, patience, prefix := ms(req.TTL), ms(req.Patience), b.waiterPrefix(req.Key)
	if req.Wait {
		// The place must outlive the attempts answered locally (see recheck).
		patience = ms(req.Patience + recheck)
	}
	reenter := "0"
	if req.Reenter {
		reenter = "1"
	}
	r := fanout(ctx, b, b.all(), func(ctx context.Context, n *node) (acqReply, error) {
		return parseAcq(acquireScript.Run(ctx, n.rdb, keys, req.Owner, ttl, proposal, wait, patience,
			prefix, b.wakeCh, since, reenter).Result())
	})

	var granted, unknown []int
	var held []int64 // pttl of nodes held by another owner
	var maxSeen uint64
	ahead := int64(-1) // the least rank in the wait sets of the held nodes
	for i := range b.nodes {
		switch {
		case r.errs[i] != nil:
			unknown = append(unknown, i)
		case r.vals[i].status == 0:
			held = append(held, r.vals[i].x)
			maxSeen = max(maxSeen, r.vals[i].counter)
			if rk := r.vals[i].rank; rk >= 0 && (ahead < 0 || rk < ahead) {
				ahead = rk
			}
		default:
			granted = append(granted, i)
			maxSeen = max(maxSeen, r.vals[i].counter, uint64(max(r.vals[i].x, 0)))
		}
	}
	b.saw(req.Key, maxSeen)
	fail := func(note string, nodeErrs []error) (driver.Grant, error) {
		// Give back what this attempt may have taken: fresh grants and nodes whose
		// reply was lost. A re-entered node held the owner's earlier grant before
		// this attempt, so it is left as it was. Without Reenter, a node whose
		// reply was lost may hold a grant of the same owner id made by another
		// client or process (which refused this attempt): it is left to expire.
		var undo []int
		for _, i := range granted {
			if r.vals[i].status == 1 {
				undo = append(undo, i)
			}
		}
		if req.Reenter {
			undo = append(undo, unknown...)
		}
		if len(undo) > 0 {
			b.releaseOn(context.WithoutCancel(ctx), undo, req.Key, req.Owner)
		}
		he := &driver.HeldError{RetryAfter: b.retryAfter(held)}
		if req.Wait && len(held) > 0 {
			he.Ahead = int(max(ahead, 0))
			b.queued(req.Key, req.Owner, he.Ahead, len(held) >= b.quorum && ahead >= 0 && len(granted) == 0)
		}
		return driver.Grant{}, &QuorumError{Op: "acquire", Key: req.Key, OK: len(granted), Need: b.quorum,
			Nodes: len(b.nodes), Held: len(held), Note: note, Err: b.nodeErrors(nodeErrs),
			held: he}
	}
	if len(granted) < b.quorum {
		return fail("", r.errs)
	}
	if v := b.validity(req.TTL, start); v <= 0 {
		return fail(fmt.Sprintf("but the validity was used up (%v elapsed)", time.Since(start).Round(time.Microsecond)), r.errs)
	}

	var token uint64
	reentry, fresh := true, true
	var recorded uint64
	for _, i := range granted {
		v := r.vals[i]
		if v.status != 2 || v.x <= 0 || (recorded != 0 && uint64(v.x) != recorded) {
			reentry = false
		}
		if v.status == 2 && v.x > 0 {
			recorded = uint64(v.x)
		}
		if v.status != 1 || uint64(v.x) != proposal || proposal == 0 {
			fresh = false
		}
	}
	switch {
	case reentry && maxSeen == recorded:
		token = recorded // every granting node holds this grant; nothing later completed
	case fresh:
		token = proposal // a majority accepted the proposal in phase one
	default:
		t, cerrs, note := b.commit(ctx, req, keys, granted, maxSeen+1, start)
		if t == 0 {
			errs := slices.Clone(r.errs)
			for i, err := range cerrs {
				if err != nil {
					errs[i] = err
				}
			}
			return fail(note, errs)
		}
		token = t
	}
	if v := b.validity(req.TTL, start); v <= 0 {
		return fail(fmt.Sprintf("but the validity was used up (%v elapsed)", time.Since(start).Round(time.Microsecond)), r.errs)
	}
	b.saw(req.Key, token)
	b.mu.Lock()
	if len(b.tokens) >= maxFenceCache {
		clear(b.tokens) // only used to repair counters; leases lost unnoticed leave entries
	}
	b.tokens[grantKey{req.Key, req.Owner}] = token
	b.mu.Unlock()
	if req.Wait && len(granted) < len(b.nodes) {
		// The nodes that did not grant (not yet released there, or failed) may
		// have recorded the owner as a waiter; a release there would wake it in
		// vain until its place lapsed. Withdraw it in the background.
		var rest []int
		for i := range b.nodes {
			if r.errs[i] != nil || r.vals[i].status == 0 {
				rest = append(rest, i)
			}
		}
		b.withdrawAsync(req.Key, req.Owner, rest)
	}
	return driver.Grant{Token: token}, nil
}

// commit offers token t to the granting nodes until a majority accepts one, within
// the validity and a few rounds. It returns the accepted token, or 0 with the node
// errors of the last round (indexed like b.nodes) and a note.
func (b *Backend) commit(ctx context.Context, req driver.Request, keys []string, nodes []int, t uint64, start time.Time) (uint64, []error, string) {
	var errs []error
	for range maxCommitRounds {
		if err := ctx.Err(); err != nil {
			return 0, errs, "cancelled while settling the fencing token: " + err.Error()
		}
		if b.validity(req.TTL, start) <= 0 {
			return 0, errs, "validity used up while settling the fencing token"
		}
		r := fanout(ctx, b, nodes, func(ctx context.Context, n *node) (int64, error) {
			return commitScript.Run(ctx, n.rdb, keys[:2], req.Owner, t).Int64()
		})
		errs = r.errs
		accepted := 0
		var next []int
		maxC := t
		for _, i := range nodes {
			switch v := r.vals[i]; {
			case r.errs[i] != nil:
				next = append(next, i)
			case v == 0:
				accepted++
				next = append(next, i)
			case v > 0:
				maxC = max(maxC, uint64(v))
				next = append(next, i)
			}
		}
		if accepted >= b.quorum {
			return t, nil, ""
		}
		if len(next) < b.quorum {
			return 0, errs, fmt.Sprintf("the lock vanished from granting nodes while settling the fencing token (%d accepted)", accepted)
		}
		b.saw(req.Key, maxC)
		t, nodes = maxC+1, next
	}
	return 0, errs, "no fencing token accepted by a majority after several rounds"
}

// retryAfter estimates when enough held nodes free up for a majority: with held
// sorted by remaining TTL, the one whose expiry completes a majority.
func (b *Backend) retryAfter(held []int64) time.Duration {
	need := b.quorum - (len(b.nodes) - len(held))
	if need <= 0 {
		return 0
	}
	s := slices.Clone(held)
	slices.Sort(s)
	if s[need-1] <= 0 {
		return 0
	}
	return time.Duration(s[need-1]) * time.Millisecond
}

// releaseOn releases the owner's lock on the given nodes, ignoring failures (the
// lock expires by itself).
func (b *Backend) releaseOn(ctx context.Context, idx []int, key, owner string) {
	keys, prefix, nonce := b.releaseKeys(key), b.waiterPrefix(key), b.newNonce()
	fanout(ctx, b, idx, func(ctx context.Context, n *node) (any, error) {
		return releaseScript.Run(ctx, n.rdb, keys, owner, prefix, nonce, key).Result()
	})
}

func (b *Backend) releaseKeys(key string) []string {
	k := b.keys(key)
	return []string{k[0], k[2]}
}

func (b *Backend) tokenOf(key, owner string) uint64 {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.tokens[grantKey{key, owner}]
}

func (b *Backend) forget(key, owner string) {
	b.mu.Lock()
	defer b.mu.Unlock()
	delete(b.tokens, grantKey{key, owner})
}

// Refresh implements driver.Backend: it extends the lock on every node and succeeds
// if a majority did so within the validity. Nodes that lost the key get it back.
func (b *Backend) Refresh(ctx context.Context, key, owner string, ttl time.Duration) error {
	start := time.Now()
	keys := b.keys(key)[:2]
	tok := b.tokenOf(key, owner)
	pttl := ms(ttl)
	r := fanout(ctx, b, b.all(), func(ctx context.Context, n *node) (int64, error) {
		return refreshScript.Run(ctx, n.rdb, keys, owner, pttl, tok, 0).Int64()
	})
	ok, failed := 0, 0
	var absent []int
	for i := range b.nodes {
		switch {
		case r.errs[i] != nil:
			failed++
		case r.vals[i] == 1:
			ok++
		case r.vals[i] == -1:
			absent = append(absent, i)
		}
	}
	if ok >= b.quorum {
		if v := b.validity(ttl, start); v <= 0 {
			return &QuorumError{Op: "refresh", Key: key, OK: ok, Need: b.quorum, Nodes: len(b.nodes),
				Note: fmt.Sprintf("but the validity was used up (%v elapsed)", time.Since(start).Round(time.Microsecond))}
		}
		if len(absent) > 0 {
			// A node that lost the key (restarted empty) would grant it to anyone:
			// close it again for the valid owner.
			fanout(ctx, b, absent, func(ctx context.Context, n *node) (int64, error) {
				return refreshScript.Run(ctx, n.rdb, keys, owner, pttl, tok, 1).Int64()
			})
		}
		return nil
	}
	qe := &QuorumError{Op: "refresh", Key: key, OK: ok, Need: b.quorum, Nodes: len(b.nodes), Err: b.nodeErrors(r.errs)}
	if ok+failed < b.quorum {
		// Lost for good: free the minority that still has it, so others need not
		// wait for its TTL.
		qe.notHeld = true
		b.forget(key, owner)
		b.releaseOn(context.WithoutCancel(ctx), b.all(), key, owner)
	}
	return qe
}

// Release implements driver.Backend. It returns nil when a majority released the
// lock, an error matching ErrNotHeld when the owner provably held no majority, and a
// QuorumError otherwise (too many nodes failed to tell).
func (b *Backend) Release(ctx context.Context, key, owner string) error {
	b.forget(key, owner)
	start := time.Now()
	keys, prefix, nonce := b.releaseKeys(key), b.waiterPrefix(key), b.newNonce()
	r := fanout(ctx, b, b.all(), func(ctx context.Context, n *node) (any, error) {
		return releaseScript.Run(ctx, n.rdb, keys, owner, prefix, nonce, key).Result()
	})
	released, failed := 0, 0
	var woken []string
	for i := range b.nodes {
		if r.errs[i] != nil {
			failed++
			continue
		}
		switch v := r.vals[i].(type) {
		case int64:
			if v == 1 {
				released++
			}
		case string:
			released++
			if !slices.Contains(woken, v) {
				woken = append(woken, v)
			}
		}
	}
	if len(woken) > 0 {
		// Let the woken waiter take it before this client's next Lock barges in:
		// about one more round trip for the message and one for its attempt.
		b.yieldTo(key, woken, min(max(2*time.Since(start), time.Millisecond), maxYield))
	}
	if released >= b.quorum {
		return nil
	}
	qe := &QuorumError{Op: "release", Key: key, OK: released, Need: b.quorum, Nodes: len(b.nodes), Err: b.nodeErrors(r.errs)}
	qe.notHeld = released+failed < b.quorum
	return qe
}

// ForceRelease implements driver.ForceReleaser: it deletes the lock on every node,
// whatever its owner. The old holder learns at its next renewal; the next grant's
// token is larger, as for any grant.
func (b *Backend) ForceRelease(ctx context.Context, key string) error {
	keys, prefix, nonce := b.releaseKeys(key), b.waiterPrefix(key), b.newNonce()
	r := fanout(ctx, b, b.all(), func(ctx context.Context, n *node) (int64, error) {
		return forceReleaseScript.Run(ctx, n.rdb, keys, "", prefix, nonce, key).Int64()
	})
	deleted, failed := 0, 0
	for i := range b.nodes {
		if r.errs[i] != nil {
			failed++
		} else if r.vals[i] == 1 {
			deleted++
		}
	}
	if failed > len(b.nodes)-b.quorum {
		// The unanswered nodes could still hold a majority.
		return &QuorumError{Op: "force release", Key: key, OK: len(b.nodes) - failed, Need: b.quorum, Nodes: len(b.nodes), Err: b.nodeErrors(r.errs)}
	}
	if deleted == 0 {
		return fmt.Errorf("redlock: force release %q: %w", key, driver.ErrNotHeld)
	}
	return nil
}

// Inspect implements driver.Inspector with the majority's view: the owner that holds
// the key on a majority of nodes, its token, the time for which a majority still
// holds it, and the largest number of live waiters any node knows.
func (b *Backend) Inspect(ctx context.Context, key string) (driver.Info, error) {
	keys := b.keys(key)
	type view struct {
		owner string
		tok   uint64
		pttl  int64
		wait  int64
	}
	r := fanout(ctx, b, b.all(), func(ctx context.Context, n *node) (view, error) {
		v, err := inspectScript.Run(ctx, n.rdb, keys, b.waiterPrefix(key)).Slice()
		if err != nil {
			return view{}, err
		}
		if len(v) != 4 {
			return view{}, fmt.Errorf("unexpected script reply %v", v)
		}
		var out view
		if s, ok := v[0].(string); ok {
			h, t, _ := strings.Cut(s, " ")
			out.owner = h
			out.tok, _ = strconv.ParseUint(t, 10, 64)
		}
		out.pttl, _ = v[1].(int64)
		out.wait, _ = v[3].(int64)
		return out, nil
	})
	byOwner := make(map[string][]view)
	failed := 0
	var waiters int64
	for i := range b.nodes {
		if r.errs[i] != nil {
			failed++
			continue
		}
		v := r.vals[i]
		waiters = max(waiters, v.wait)
		if v.owner != "" {
			byOwner[v.owner] = append(byOwner[v.owner], v)
		}
	}
	best := 0
	for owner, vs := range byOwner {
		best = max(best, len(vs))
		if len(vs) < b.quorum {
			continue
		}
		// The TTL for which a majority still holds it: the quorum-th largest.
		slices.SortFunc(vs, func(a, c view) int { return int(c.pttl - a.pttl) })
		var tok uint64
		for _, v := range vs {
			tok = max(tok, v.tok)
		}
		return driver.Info{Key: key, Owner: owner, Token: tok,
			TTL: time.Duration(max(vs[b.quorum-1].pttl, 0)) * time.Millisecond, Waiters: int(waiters)}, nil
	}
	if best+failed >= b.quorum {
		return driver.Info{}, &QuorumError{Op: "inspect", Key: key, OK: len(b.nodes) - failed, Need: b.quorum, Nodes: len(b.nodes),
			Note: "too many nodes failed to tell who holds it", Err: b.nodeErrors(r.errs)}
	}
	return driver.Info{}, fmt.Errorf("redlock: inspect %q: %w", key, driver.ErrNotHeld)
}

var floorCAD = redis.NewScript(`if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end return 0`)

// FloorCycle implements driver.Floorer with the single-instance floor: SET NX PX with
// a fresh random value, then a compare-and-delete script (as redislock's floor), on
// the first node only, with this backend's client, on the key's floor key (see the
// key layout in scripts.go). Redlock over N nodes is compared with it to
// show what the fan-out costs over one instance.
func (b *Backend) FloorCycle(ctx context.Context, key string) error {
	rdb, k, v := b.nodes[0].rdb, floorKey(b.cfg.prefix, key), driver.RandomHex(16)
	ok, err := rdb.SetNX(ctx, k, v, 15*time.Second).Result()
	if err != nil {
		return err
	}
	if !ok {
		return fmt.Errorf("floor key %q held", k)
	}
	return floorCAD.Run(ctx, rdb, []string{k}, v).Err()
}

// ServerOps implements driver.OpsCounter: the sum over all nodes of the calls in
// INFO commandstats (which counts the commands run inside scripts too), less the
// INFO calls themselves. Every node must answer.
func (b *Backend) ServerOps(ctx context.Context) (int64, error) {
	counts := make([]int64, len(b.nodes))
	errs := make([]error, len(b.nodes))
	var wg sync.WaitGroup
	for i, n := range b.nodes {
		wg.Go(func() {
			s, err := n.rdb.Info(ctx, "commandstats").Result()
			if err != nil {
				errs[i] = err
				return
			}
			for line := range strings.SplitSeq(s, "\n") {
				name, rest, ok := strings.Cut(line, ":calls=")
				if !ok || name == "cmdstat_info" {
					continue
				}
				c, _ := strconv.ParseInt(rest[:max(strings.IndexByte(rest, ','), 0)], 10, 64)
				counts[i] += c
			}
		})
	}
	wg.Wait()
	if err := b.nodeErrors(errs); err != nil {
		return 0, err
	}
	var total int64
	for _, c := range counts {
		total += c
	}
	return total, nil
}

// Close implements driver.Backend: it stops the subscriber connections and waits for
// the backend's goroutines and, when the backend was made by Open, closes the clients.
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
	if b.own {
		for _, n := range b.nodes {
			if err := n.rdb.Close(); err != nil {
				errs = append(errs, &NodeError{n.addr, err})
			}
		}
	}
	return errors.Join(errs...)
}
