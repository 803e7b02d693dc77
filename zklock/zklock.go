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
// owner's child is the lowest, the lock is granted. Otherwise a TryLock deletes its
// child and reports ErrLocked; a waiting Lock keeps its place in the queue and sets a
// watch on its predecessor only (the child just below its own), so a release wakes
// exactly one waiter and no herd forms. Its later attempts (the core's fallback
// against a lost wake-up) are answered without a request while that watch is in
// place, listing the queue again at most every 30 seconds, and report how many
// are ahead (driver.HeldError.Ahead): a waiter makes no request while it waits,
// however long the queue. A waiter that gives up deletes its child.
// Release deletes the child. Refresh writes the child's data (the TTL), a write that
// goes through the leader and fails if the child is gone. An owner that already has a
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
	"cmp"
	"context"
	"crypto/rand"
	"crypto/tls"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/go-zookeeper/zk"

	"github.com/dlockio/dlock/driver"
)

func init() {
	driver.Register("zk", func(ctx context.Context, u *url.URL) (driver.Backend, error) {
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

// Option configures a Backend made by Open or Dial. Options given to Open override
// the URL.
type Option func(*config) error

type config struct {
	root           string
	sessionTimeout time.Duration
	createRoot     bool
	user, password string
	hasAuth        bool
	acl            []zk.ACL
	tls            *tls.Config
	logger         *slog.Logger
}

func invalid(format string, a ...any) error {
	return fmt.Errorf("%w: zklock: "+format, append([]any{driver.ErrInvalid}, a...)...)
}

// WithRoot sets the root path under which locks live (default "/dlock"; "/" for the
// ZooKeeper root). Clients that should contend for the same locks must use the same
// root.
func WithRoot(p string) Option {
	return func(c *config) error {
		r, err := cleanRoot(p)
		if err != nil {
			return err
		}
		c.root = r
		return nil
	}
}

// WithSessionTimeout sets the session timeout asked of the server (default 10s). A
// crashed holder blocks the lock for about this long; a disconnection longer than
// about a third of it ends the leases (see the package documentation).
func WithSessionTimeout(d time.Duration) Option {
	return func(c *config) error {
		if d < 100*time.Millisecond || d > MaxSessionTimeout {
			return invalid("session timeout %v is not between 100ms and %v", d, MaxSessionTimeout)
		}
		c.sessionTimeout = d
		return nil
	}
}

// WithCreateRoot sets whether a missing root path is created (default true).
func WithCreateRoot(create bool) Option {
	return func(c *config) error { c.createRoot = create; return nil }
}

// WithDigestAuth authenticates the session with the digest scheme. Unless WithACL
// says otherwise, the nodes the backend creates are then accessible to this identity
// only.
func WithDigestAuth(user, password string) Option {
	return func(c *config) error {
		if user == "" || strings.Contains(user, ":") {
			return invalid("digest user must be non-empty and without ':'")
		}
		c.user, c.password, c.hasAuth = user, password, true
		return nil
	}
}

// WithACL sets the ACL of the nodes the backend creates (the root, lock nodes and
// contenders). The identity of the session must keep create, delete, read and write
// permissions, or locking fails with an error that wraps zk.ErrNoAuth.
func WithACL(acl []zk.ACL) Option {
	return func(c *config) error {
		if len(acl) == 0 {
			return invalid("empty ACL")
		}
		c.acl = slices.Clone(acl)
		return nil
	}
}

// WithTLS connects with TLS (to the servers' secureClientPort). An empty ServerName
// is set to the host of each server.
func WithTLS(cfg *tls.Config) Option {
	return func(c *config) error {
		if cfg == nil {
			return invalid("nil TLS config")
		}
		c.tls = cfg.Clone()
		return nil
	}
}

// WithLogger sets the logger for the ZooKeeper client library's messages (at Debug)
// and the backend's own (session events at Info, trouble at Warn). Default: discard.
func WithLogger(l *slog.Logger) Option {
	return func(c *config) error {
		if l == nil {
			return invalid("nil logger")
		}
		c.logger = l
		return nil
	}
}

// cleanRoot validates a root path: absolute, no empty, "." or ".." component, no
// trailing slash, no character ZooKeeper refuses. It returns "" for the ZooKeeper
// root itself.
func cleanRoot(p string) (string, error) {
	if p == "/" {
		return "", nil
	}
	if !strings.HasPrefix(p, "/") || strings.HasSuffix(p, "/") {
		return "", invalid("root path %q must start with '/' and not end with one", p)
	}
	for _, part := range strings.Split(p[1:], "/") {
		if part == "" || part == "." || part == ".." {
			return "", invalid("root path %q has an empty, '.' or '..' component", p)
		}
		for _, r := range part {
			if r < 0x20 || (r >= 0x7f && r <= 0x9f) || (r >= 0xd800 && r <= 0xf8ff) || r >= 0xfff0 && r <= 0xffff {
				return "", invalid("root path %q contains character %U, which ZooKeeper refuses", p, r)
			}
		}
	}
	if p == "/zookeeper" || strings.HasPrefix(p, "/zookeeper/") {
		return "", invalid("root path %q is inside ZooKeeper's reserved /zookeeper tree", p)
	}
	return p, nil
}

// Open returns a backend for a zk:// URL; see the package documentation for its
// form and parameters. It returns once a session is established and the root is
// usable, or fails when ctx ends or the session timeout passes first.
func Open(ctx context.Context, u *url.URL, opts ...Option) (*Backend, error) {
	if u.Scheme != "zk" {
		return nil, invalid("scheme %q is not zk", u.Scheme)
	}
	if u.Host == "" {
		return nil, invalid("URL %s names no server", driver.Redact(u))
	}
	var servers []string
	for h := range strings.SplitSeq(u.Host, ",") {
		if h == "" {
			return nil, invalid("URL %s has an empty server in its list", driver.Redact(u))
		}
		host, port, err := net.SplitHostPort(h)
		if err != nil {
			host, port = strings.Trim(h, "[]"), "2181"
			if strings.Contains(host, ":") && !strings.HasPrefix(h, "[") {
				return nil, invalid("server %q is not host:port", h)
			}
		}
		if n, err := strconv.Atoi(port); err != nil || n < 1 || n > 65535 {
			return nil, invalid("server %q has a bad port", h)
		}
		if host == "" {
			return nil, invalid("server %q has no host", h)
		}
		servers = append(servers, net.JoinHostPort(host, port))
	}
	p, err := driver.ParseParams(u)
	if err != nil {
		return nil, fmt.Errorf("zklock: %w", err)
	}
	var uopts []Option
	root := u.Path
	if root == "" {
		root = DefaultRoot
	}
	uopts = append(uopts, WithRoot(root))
	timeout, err := p.Duration("session_timeout", DefaultSessionTimeout)
	if err != nil {
		return nil, err
	}
	createRoot, err := p.Bool("create_root", true)
	if err != nil {
		return nil, err
	}
	uopts = append(uopts, WithSessionTimeout(timeout), WithCreateRoot(createRoot))
	tlsCfg, err := driver.ReadTLS(p)
	if err != nil {
		return nil, fmt.Errorf("zklock: %w", err)
	}
	if err := p.Unknown(); err != nil {
		return nil, fmt.Errorf("zklock: %w", err)
	}
	if tlsCfg != nil {
		uopts = append(uopts, WithTLS(tlsCfg))
	}
	if u.User != nil {
		pw, ok := u.User.Password()
		if !ok {
			return nil, invalid("URL user info needs both a user name and a password (user:password@)")
		}
		uopts = append(uopts, WithDigestAuth(u.User.Username(), pw))
	}
	return dial(ctx, servers, driver.Redact(u), append(uopts, opts...))
}

// Dial returns a backend connected to the given servers (host:port). It returns once
// a session is established and the root is usable, or fails when ctx ends or the
// session timeout passes first.
func Dial(ctx context.Context, servers []string, opts ...Option) (*Backend, error) {
	if len(servers) == 0 {
		return nil, invalid("no server given")
	}
	return dial(ctx, servers, "zk://"+strings.Join(servers, ","), opts)
}

func dial(ctx context.Context, servers []string, name string, opts []Option) (*Backend, error) {
	cfg := config{root: DefaultRoot, sessionTimeout: DefaultSessionTimeout, createRoot: true,
		logger: slog.New(slog.DiscardHandler)}
	for _, o := range opts {
		if o == nil {
			return nil, invalid("nil option")
		}
		if err := o(&cfg); err != nil {
			return nil, err
		}
	}
	if cfg.acl == nil {
		if cfg.hasAuth {
			cfg.acl = zk.AuthACL(zk.PermAll)
		} else {
			cfg.acl = zk.WorldACL(zk.PermAll)
		}
	}
	b := &Backend{
		root: cfg.root, acl: cfg.acl, log: cfg.logger, name: name,
		timeout: cfg.sessionTimeout,
		closing: make(chan struct{}), ready: make(chan struct{}),
		entries: make(map[ekey]*entry), byPath: make(map[string]*entry),
		waiters: make(map[ekey]*waiter), predOf: make(map[string]map[*waiter]bool),
		doomed:  make(map[string]bool),
		creates: make(map[string]*createWait), createXid: make(map[int32]*createWait),
	}
	// Open's bound: ctx, the session timeout, and driver.DefaultOpenTimeout when ctx
	// has no deadline.
	octx, ocancel := driver.OpenContext(ctx)
	defer ocancel()
	wctx, cancel := context.WithTimeout(octx, cfg.sessionTimeout)
	defer cancel()
	// The client library resolves the names without a context and calls a failure
	// an error of its arguments; resolving them here first bounds it by ctx and
	// reports it as the servers being unreachable.
	if err := resolve(wctx, servers); err != nil {
		return nil, fmt.Errorf("zklock: connect to %s: %w", name, err)
	}
	var rawMu sync.Mutex
	var raw net.Conn // the latest connection dialed
	hooks := &wireHooks{connect: b.onConnectResponse, wrote: b.onCreateWritten, replied: b.onReply,
		dialed: func(c net.Conn) { rawMu.Lock(); raw = c; rawMu.Unlock() }}
	conn, events, err := zk.Connect(servers, cfg.sessionTimeout,
		zk.WithDialer(dialer(cfg.tls, hooks, b.onDialError)),
		zk.WithLogger(zkLogger{cfg.logger}), zk.WithLogInfo(false),
		zk.WithEventCallback(b.onEvent))
	if err != nil {
		return nil, fmt.Errorf("zklock: connect to %s: %w", name, err)
	}
	b.conn, b.events = conn, events
	fail := func(err error) (*Backend, error) {
		b.shutdown()
		return nil, err
	}
	// Wait for the first session.
	select {
	case <-b.ready:
	case <-wctx.Done():
		b.mu.Lock()
		why := b.dialErr
		b.mu.Unlock()
		if why == nil {
			why = errors.New("no session established")
		}
		err := wctx.Err()
		if ctx.Err() != nil {
			err = context.Cause(ctx)
		}
		if errors.Is(why, zk.ErrAuthFailed) {
			why = fmt.Errorf("%w: %w", driver.ErrAuth, why)
		}
		// A server that accepted the connection but does not answer holds the
		// library in a read with a deadline of its own (ten times two thirds of the
		// session timeout): end it now.
		rawMu.Lock()
		if raw != nil {
			raw.Close()
		}
		rawMu.Unlock()
		return fail(fmt.Errorf("zklock: connect to %s: %w (%w)", name, why, err))
	}
	if cfg.hasAuth {
		err := b.call(octx, func() error { return conn.AddAuth("digest", []byte(cfg.user+":"+cfg.password)) })
		if err != nil {
			if errors.Is(err, zk.ErrAuthFailed) || errors.Is(err, zk.ErrNoAuth) {
				err = fmt.Errorf("%w: %w", driver.ErrAuth, err)
			}
			return fail(fmt.Errorf("zklock: authenticate as %q on %s: %w", cfg.user, name, err))
		}
	}
	if err := b.prepareRoot(octx, cfg.createRoot); err != nil {
		return fail(fmt.Errorf("zklock: root %q on %s: %w", b.rootPath(), name, err))
	}
	b.wg.Add(1)
	go b.monitor()
	return b, nil
}

// resolve looks the servers' names up within ctx. It fails when none resolves, with
// the lookup errors joined; an address that is an IP literal needs no lookup.
func resolve(ctx context.Context, servers []string) error {
	var errs []error
	for _, s := range servers {
		host, _, _ := net.SplitHostPort(s)
		if net.ParseIP(host) != nil {
			return nil
		}
		if _, err := net.DefaultResolver.LookupHost(ctx, host); err != nil {
			errs = append(errs, err)
			continue
		}
		return nil
	}
	return fmt.Errorf("no server name resolves: %w", errors.Join(errs...))
}

// prepareRoot creates the missing parts of the root if asked to (the existing ones
// may belong to someone else and refuse us creation), then checks that the session
// can read it.
func (b *Backend) prepareRoot(ctx context.Context, create bool) error {
	if b.root != "" && create {
		parts := strings.Split(b.root[1:], "/")
		for i := range parts {
			p := "/" + strings.Join(parts[:i+1], "/")
			var exists bool
			err := b.call(ctx, func() error {
				var err error
				exists, _, err = b.conn.Exists(p)
				return err
			})
			if err != nil {
				return fmt.Errorf("look up %s: %w", p, explain(err))
			}
			if exists {
				continue
			}
			err = b.call(ctx, func() error {
				_, err := b.conn.Create(p, nil, zk.FlagPersistent, b.acl)
				return err
			})
			if err != nil && !errors.Is(err, zk.ErrNodeExists) {
				return fmt.Errorf("create %s: %w", p, explain(err))
			}
		}
	}
	err := b.call(ctx, func() error {
		_, _, err := b.conn.Children(b.rootPath())
		return err
	})
	if errors.Is(err, zk.ErrNoNode) {
		return fmt.Errorf("%w: it does not exist (create it, or allow create_root)", driver.ErrInvalid)
	}
	if err != nil {
		return explain(err)
	}
	return nil
}

// explain adds a hint to errors whose cause is not obvious.
func explain(err error) error {
	if errors.Is(err, zk.ErrNoAuth) || errors.Is(err, zk.ErrAuthFailed) {
		return fmt.Errorf("%w: %w (the session's credentials lack permission: check the user:password or the ACL)", driver.ErrAuth, err)
	}
	return err
}

// Backend is the ZooKeeper backend. It implements driver.Backend, driver.Notifier,
// driver.Inspector and driver.ForceReleaser, and is safe for concurrent use. It holds
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
	entries     map[ekey]*entry
	byPath      map[string]*entry // own child path -> entry
	waiters     map[ekey]*waiter
	predOf      map[string]map[*waiter]bool // watched predecessor path -> waiters
	doomed      map[string]bool             // child paths being deleted in the background
	granted     int
	hbRunning   bool

	cmu       sync.Mutex // guards the create observations below
	creates   map[string]*createWait
	createXid map[int32]*createWait
}

// createWait follows one create request on the wire.
type createWait struct {
	written chan struct{} // closed when the request has been written
	wrote   bool
	zxid    int64 // of the successful reply: the node's czxid
}

func (b *Backend) expectCreate(p string) *createWait {
	cw := &createWait{written: make(chan struct{})}
	b.cmu.Lock()
	b.creates[p] = cw
	b.cmu.Unlock()
	return cw
}

func (b *Backend) forgetCreate(p string) {
	b.cmu.Lock()
	defer b.cmu.Unlock()
	cw := b.creates[p]
	delete(b.creates, p)
	for x, c := range b.createXid {
		if c == cw {
			delete(b.createXid, x)
		}
	}
}

func (b *Backend) createZxid(cw *createWait) int64 {
	b.cmu.Lock()
	defer b.cmu.Unlock()
	return cw.zxid
}

// onCreateWritten is called by the connection wrapper for every create request.
func (b *Backend) onCreateWritten(xid int32, p string) {
	b.cmu.Lock()
	defer b.cmu.Unlock()
	cw := b.creates[p]
	if cw == nil {
		return
	}
	b.createXid[xid] = cw
	if !cw.wrote {
		cw.wrote = true
		close(cw.written)
	}
}

// onReply is called by the connection wrapper for every reply.
func (b *Backend) onReply(xid int32, zxid int64, code int32) {
	b.cmu.Lock()
	defer b.cmu.Unlock()
	if len(b.createXid) == 0 {
		return
	}
	if cw := b.createXid[xid]; cw != nil {
		delete(b.createXid, xid)
		if code == 0 {
			cw.zxid = zxid
		}
	}
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
)

type ekey struct{ key, owner string }

// entry is this backend's child (or attempt at one) for a (key, owner).
type entry struct {
	key, owner string
	parent     string

	op sync.Mutex // serialises server operations on the entry

	// Guarded by Backend.mu.
	guid    string // GUID of the current create attempt
	name    string // child name once known
	path    string
	czxid   int64
	session int64 // the child's ephemeral owner
	granted bool
	watched bool // a deletion watch is set on the child
	dead    bool // removed from the backend's maps
	lost    chan struct{}
	lostSet bool
	timer   *time.Timer
	gen     uint64 // bumped when the timer is re-armed
}

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
	return b.root + "/k-" + url.PathEscape(key)
}

// Child names: lock-<owner>-<32 hex GUID>-<10 digit sequence>.
const (
	childPrefix = "lock-"
	guidLen     = 32
	seqLen      = 10
)

type child struct {
	name, owner, guid string
	seq               int64
}

func parseChild(name string) (child, bool) {
	n := len(name)
	if n < len(childPrefix)+1+1+guidLen+1+seqLen || !strings.HasPrefix(name, childPrefix) ||
		name[n-seqLen-1] != '-' || name[n-seqLen-1-guidLen-1] != '-' {
		return child{}, false
	}
	seq, err := strconv.ParseInt(name[n-seqLen:], 10, 64)
	if err != nil || seq < 0 {
		return child{}, false
	}
	owner := name[len(childPrefix) : n-seqLen-1-guidLen-1]
	if !validOwner(owner) {
		return child{}, false
	}
	return child{name: name, owner: owner, guid: name[n-seqLen-1-guidLen : n-seqLen-1], seq: seq}, true
}

// ownerByte marks the bytes an owner id may contain (driver.ValidateOwner).
var ownerByte = func() (t [256]bool) {
	for c := range 256 {
		t[c] = c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '.' || c == '_' || c == ':' || c == '-'
	}
	return t
}()

// validOwner is driver.ValidateOwner(owner) == nil, without building an error: it
// runs for every child of every listing.
func validOwner(owner string) bool {
	if owner == "" || len(owner) > driver.MaxOwnerLen {
		return false
	}
	for i := 0; i < len(owner); i++ {
		if !ownerByte[owner[i]] {
			return false
		}
	}
	return true
}

// contenders parses the contenders among names, in no particular order.
func contenders(names []string) []child {
	cs := make([]child, 0, len(names))
	for _, n := range names {
		if c, ok := parseChild(n); ok {
			cs = append(cs, c)
		}
	}
	return cs
}

func bySeq(a, b child) int { return cmp.Compare(a.seq, b.seq) }

// queue parses and sorts the contenders among names.
func queue(names []string) []child {
	cs := contenders(names)
	slices.SortFunc(cs, bySeq)
	return cs
}

func newGUID() string {
	var g [guidLen / 2]byte
	_, _ = rand.Read(g[:])
	return hex.EncodeToString(g[:])
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
// connection closes).
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
	go func() {
		defer b.wg.Done()
		done <- f()
	}()
	select {
	case err := <-done:
		return err
	case <-ctx.Done():
		return context.Cause(ctx)
	}
}

// markHeard records that a request sent at sent reached the leader.
func (b *Backend) markHeard(sent time.Time, session int64) {
	b.mu.Lock()
	if session == b.session && sent.After(b.heard) {
		b.heard = sent
	}
	b.mu.Unlock()
}

func (b *Backend) currentSession() int64 {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.session
}

// sessionValidity is how long after a request reached the leader the session is
// certainly alive: half the session timeout, less 1% for clock-rate drift and 2ms.
func sessionValidity(timeout time.Duration) time.Duration {
	return timeout/2 - timeout/100 - 2*time.Millisecond
}

// entryFor returns the live entry of (key, owner), making one if needed.
func (b *Backend) entryFor(key, owner string) (*entry, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.closed {
		return nil, driver.ErrClosed
	}
	k := ekey{key, owner}
	e := b.entries[k]
	if e == nil {
		e = &entry{key: key, owner: owner, parent: b.LockPath(key), lost: make(chan struct{})}
		b.entries[k] = e
	}
	return e, nil
}

func (b *Backend) lookup(key, owner string) *entry {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.entries[ekey{key, owner}]
}

// Bound implements driver.Bounder: a grant lives on the session, which is certainly
// kept until half the session timeout (less 1%) after the last request known to
// have reached the leader (see the package documentation). A grant resumed on
// another process's session gets driver.NoBound: this backend cannot see that
// session's keep-alives, and learns of its end from the child's deletion.
func (b *Backend) Bound(key, owner string) (time.Duration, bool) {
	b.mu.Lock()
	defer b.mu.Unlock()
	e := b.entries[ekey{key, owner}]
	switch {
	case e == nil || e.dead || !e.granted:
		return 0, false
	case e.session != b.session:
		return driver.NoBound, true
	}
	return time.Until(b.heard.Add(sessionValidity(b.timeout))), true
}

// dropLocked removes e from the backend and closes its Lost channel. If the child
// may still exist and deleteNode is set, it is deleted in the background. Called with
// b.mu held.
func (b *Backend) dropLocked(e *entry, deleteNode bool) {
	if e.dead {
		return
	}
	e.dead = true
	k := ekey{e.key, e.owner}
	if b.entries[k] == e {
		delete(b.entries, k)
	}
	if e.path != "" && b.byPath[e.path] == e {
		delete(b.byPath, e.path)
	}
	if e.granted {
		b.granted--
	}
	if e.timer != nil {
		e.timer.Stop()
	}
	if !e.lostSet {
		e.lostSet = true
		close(e.lost)
	}
	if w := b.waiters[k]; w != nil {
		w.signal()
	}
	if deleteNode && !b.closed && (e.path != "" || e.guid != "") {
		b.wg.Add(1)
		if e.path != "" {
			b.doomed[e.path] = true
		}
		go b.deleteInBackground(e)
	}
}

// deleteInBackground deletes the child of a dropped entry (or, if the create's
// outcome was unknown, any child with its GUID), retrying transient errors for up to
// a session timeout (after which the session, and the child with it, is gone).
func (b *Backend) deleteInBackground(e *entry) {
	defer b.wg.Done()
	b.mu.Lock()
	p, guid, limit := e.path, e.guid, b.timeout
	b.mu.Unlock()
	defer func() {
		b.mu.Lock()
		delete(b.doomed, p)
		b.mu.Unlock()
	}()
	// Close ends the session, which deletes the child anyway, and makes every call
	// return at once.
	ctx, cancel := context.WithTimeout(context.Background(), limit)
	defer cancel()
	for {
		var err error
		if p != "" {
			err = b.call(ctx, func() error { return b.conn.Delete(p, -1) })
		} else {
			_, err = b.deleteMatching(ctx, e.parent, func(c child) bool { return c.guid == guid })
		}
		if err == nil || errors.Is(err, zk.ErrNoNode) || permanent(err) || ctx.Err() != nil {
			if err != nil && !errors.Is(err, zk.ErrNoNode) && !errors.Is(err, driver.ErrClosed) {
				b.log.Debug("zklock: could not delete an abandoned contender", "key", e.key, "err", err)
			}
			return
		}
		select {
		case <-ctx.Done():
			return
		case <-b.closing:
			return
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// deleteMatching deletes the children of parent that match, and reports whether one
// of them was the holder (the lowest contender).
func (b *Backend) deleteMatching(ctx context.Context, parent string, match func(child) bool) (bool, error) {
	var names []string
	err := b.call(ctx, func() error {
		var err error
		names, _, err = b.conn.Children(parent)
		return err
	})
	if errors.Is(err, zk.ErrNoNode) {
		return false, nil
	}
	if err != nil {
		return false, err
	}
	q := queue(names)
	held := false
	var errs []error
	for i, c := range q {
		if !match(c) {
			continue
		}
		err := b.call(ctx, func() error { return b.conn.Delete(parent+"/"+c.name, -1) })
		if err == nil && i == 0 {
			held = true
		}
		if err != nil && !errors.Is(err, zk.ErrNoNode) {
			errs = append(errs, err)
		}
	}
	return held, errors.Join(errs...)
}

// armLocked (re)starts e's local expiry: a child not refreshed (or, queued, not
// attempted) within d is deleted. Called with b.mu held.
func (b *Backend) armLocked(e *entry, d time.Duration) {
	if e.timer != nil {
		e.timer.Stop()
	}
	if d <= 0 || b.closed {
		return
	}
	e.gen++
	gen := e.gen
	e.timer = time.AfterFunc(d, func() {
		b.mu.Lock()
		defer b.mu.Unlock()
		if e.dead || e.gen != gen || b.closed {
			return
		}
		b.log.Debug("zklock: local expiry of an unrenewed contender", "key", e.key, "granted", e.granted)
		b.dropLocked(e, true)
	})
}

// Acquire implements driver.Backend.
func (b *Backend) Acquire(ctx context.Context, req driver.Request) (driver.Grant, error) {
	for range 4 {
		e, err := b.entryFor(req.Key, req.Owner)
		if err != nil {
			return driver.Grant{}, err
		}
		e.op.Lock()
		g, err, again := b.attempt(ctx, e, req)
		e.op.Unlock()
		if !again {
			return g, err
		}
	}
	return driver.Grant{}, wrap("acquire", req.Key, errors.New("the contender node kept vanishing (session expiring?)"))
}

// attempt makes one attempt with e's operation lock held. again means e was dropped
// meanwhile and the attempt should start over with a new entry.
func (b *Backend) attempt(ctx context.Context, e *entry, req driver.Request) (g driver.Grant, err error, again bool) {
	b.mu.Lock()
	if e.dead {
		b.mu.Unlock()
		return g, nil, true
	}
	own := e.name
	knownStat := e.czxid != 0
	if own != "" && req.Wait && !e.granted {
		if w := b.waiters[ekey{req.Key, req.Owner}]; w != nil && w.watching && w.pred != "" &&
			e.session == b.session && time.Since(w.checked) < recheck {
			// Still queued behind a watched predecessor: answered without a
			// request (see recheck).
			b.armLocked(e, req.Patience)
			ahead := w.ahead
			b.mu.Unlock()
			return g, &driver.HeldError{Ahead: ahead}, false
		}
	}
	b.mu.Unlock()
	data := []byte(strconv.FormatInt(req.TTL.Milliseconds(), 10))

	var pre created
	if own == "" {
		if pre, err = b.create(ctx, e, data, req); err != nil {
			return g, err, false
		}
		own = pre.name
	}
	ownPath := e.parent + "/" + own
	// Until this attempt settles, the child expires locally like a queued one, so
	// that a failure below cannot leave it behind for the life of the session.
	b.mu.Lock()
	b.armLocked(e, max(req.TTL, req.Patience))
	b.mu.Unlock()

	// List the queue (unless it was listed right behind the create) and, for a new
	// child whose czxid is unknown, read its stat (czxid, session) and watch it for
	// deletion, in one round trip.
	var names []string
	var st *zk.Stat
	var stErr error
	var wg sync.WaitGroup
	if !knownStat && pre.czxid != 0 {
		knownStat = true
		b.mu.Lock()
		if !e.dead {
			e.czxid, e.session = pre.czxid, pre.session
			b.byPath[ownPath] = e
		}
		b.mu.Unlock()
	}
	if !knownStat {
		wg.Go(func() {
			stErr = b.call(ctx, func() error {
				var err error
				_, st, _, err = b.conn.ChildrenW(ownPath)
				return err
			})
		})
	}
	if pre.listed {
		names = pre.names
	} else {
		err = b.call(ctx, func() error {
			var err error
			names, _, err = b.conn.Children(e.parent)
			return err
		})
	}
	wg.Wait()
	if err == nil && !knownStat {
		err = stErr
	}
	if err != nil && !errors.Is(err, zk.ErrNoNode) {
		return g, wrap("acquire", req.Key, err), false
	}
	// Not sorted: with thousands of waiters, sorting each listing cost more than
	// the rest of the handoff; one pass finds what the attempt needs.
	q := contenders(names)
	b.mu.Lock()
	if !knownStat && st != nil && !e.dead {
		e.czxid, e.session, e.watched = st.Czxid, st.EphemeralOwner, true
		b.byPath[ownPath] = e
	}
	// The owner's children: with Reenter (driver.Request) every child of the owner
	// id, since the caller may hold the grant under any of them (a restarted
	// process resuming); without it only this entry's own (its GUID: a create
	// whose reply was lost), since another client or process may use the same
	// owner id and its child is another contender's.
	var mine []child
	found := false
	for _, c := range q {
		if c.owner == req.Owner && !b.doomed[e.parent+"/"+c.name] && (req.Reenter || c.guid == e.guid) {
			mine = append(mine, c)
			found = found || c.name == own
		}
	}
	if e.dead || !found || err != nil {
		// Our child is gone (expired, force-released, reaped): start over.
		b.dropLocked(e, false)
		b.mu.Unlock()
		return g, nil, true
	}
	slices.SortFunc(mine, bySeq)

	// One child per owner (of those above): keep the oldest (an earlier grant being
	// resumed or re-entered, or a create whose reply was lost) and delete the others.
	keep := mine[0]
	if keep.name != own {
		// Our own child is about to be deleted as an extra: its deletion is not a loss.
		if b.byPath[ownPath] == e {
			delete(b.byPath, ownPath)
		}
	}
	b.mu.Unlock()
	for _, c := range mine[1:] {
		if err := b.call(ctx, func() error { return b.conn.Delete(e.parent+"/"+c.name, -1) }); err != nil && !errors.Is(err, zk.ErrNoNode) {
			return g, wrap("acquire", req.Key, err), false
		}
	}
	if keep.name != own {
		var st *zk.Stat
		kp := e.parent + "/" + keep.name
		err := b.call(ctx, func() error {
			var err error
			_, st, _, err = b.conn.ChildrenW(kp)
			return err
		})
		b.mu.Lock()
		if errors.Is(err, zk.ErrNoNode) || e.dead {
			b.dropLocked(e, false)
			b.mu.Unlock()
			return g, nil, true
		}
		if err != nil {
			b.mu.Unlock()
			return g, wrap("acquire", req.Key, err), false
		}
		e.name, e.path, e.czxid, e.session, e.guid, e.watched = keep.name, kp, st.Czxid, st.EphemeralOwner, keep.guid, true
		b.byPath[kp] = e
		b.mu.Unlock()
		ownPath = kp
	}
	// The place of the child kept: idx contenders below it, the highest of them
	// (its predecessor) below.
	idx, below := 0, child{}
	for _, c := range q {
		if c.seq < keep.seq {
			if idx == 0 || c.seq > below.seq {
				below = c
			}
			idx++
		}
	}

	if idx == 0 {
		if err := b.freshSession(ctx); err != nil {
			return g, wrap("acquire", req.Key, err), false
		}
		b.mu.Lock()
		defer b.mu.Unlock()
		if e.dead {
			return g, nil, true
		}
		if !e.granted {
			e.granted = true
			b.granted++
		}
		b.armLocked(e, req.TTL)
		return driver.Grant{Token: uint64(e.czxid), Lost: e.lost}, nil, false
	}

	if !req.Wait {
		err := b.call(ctx, func() error { return b.conn.Delete(ownPath, -1) })
		b.mu.Lock()
		b.dropLocked(e, err != nil && !errors.Is(err, zk.ErrNoNode))
		b.mu.Unlock()
		return g, &driver.HeldError{}, false
	}

	// Queue: keep the child, watch the predecessor only.
	pred := e.parent + "/" + below.name
	b.mu.Lock()
	if e.dead {
		b.mu.Unlock()
		return g, nil, true
	}
	b.armLocked(e, req.Patience)
	held := &driver.HeldError{Ahead: idx - 1}
	w := b.waiters[ekey{req.Key, req.Owner}]
	if w != nil {
		w.checked, w.ahead = time.Now(), held.Ahead
	}
	arm := w != nil && w.pred != pred
	if arm {
		b.unwatchLocked(w)
		w.pred = pred
		if b.predOf[pred] == nil {
			b.predOf[pred] = make(map[*waiter]bool)
		}
		b.predOf[pred][w] = true
	}
	b.mu.Unlock()
	if arm {
		err := b.call(ctx, func() error {
			_, _, _, err := b.conn.ChildrenW(pred)
			return err
		})
		b.mu.Lock()
		if err != nil {
			// Gone already (or unknown): try again at once rather than wait.
			b.unwatchLocked(w)
			b.mu.Unlock()
			w.signal()
		} else {
			// The watch is in place unless it fired already (which cleared pred).
			w.watching = w.pred == pred
			b.mu.Unlock()
		}
	}
	return g, held, false
}

// created is the outcome of create: the child's name, its czxid when the reply was
// observed, and the queue when it could be listed right behind the create.
type created struct {
	name    string
	czxid   int64
	session int64
	names   []string
	listed  bool
}

// freshSession makes sure a request reached the leader recently enough for the
// session to be certainly alive, sending a sync if not.
func (b *Backend) freshSession(ctx context.Context) error {
	b.mu.Lock()
	ok := time.Since(b.heard) < sessionValidity(b.timeout)/2
	sess := b.session
	b.mu.Unlock()
	if ok {
		return nil
	}
	sent := time.Now()
	if err := b.call(ctx, func() error { _, err := b.conn.Sync(b.rootPath()); return err }); err != nil {
		return fmt.Errorf("session in doubt: %w", err)
	}
	b.markHeard(sent, sess)
	return nil
}

// create makes e's child, settling a lost reply by looking for the attempt's GUID.
// The first try lists the queue in the same round trip: the listing is sent right
// behind the create, and a session's requests are processed in order, so it sees the
// new child. On failure, an entry whose create may have happened is left to expire
// locally (which deletes whatever carries its GUID); one whose create certainly did
// not happen is dropped.
func (b *Backend) create(ctx context.Context, e *entry, data []byte, req driver.Request) (res created, err error) {
	b.mu.Lock()
	if e.guid == "" {
		e.guid = newGUID()
	}
	guid, limit := e.guid, b.timeout
	b.mu.Unlock()
	unknown := false
	defer func() {
		if err == nil {
			return
		}
		b.mu.Lock()
		defer b.mu.Unlock()
		if unknown && !errors.Is(err, driver.ErrClosed) {
			b.armLocked(e, max(req.TTL, req.Patience))
		} else {
			b.dropLocked(e, false)
		}
	}()
	prefix := e.parent + "/" + childPrefix + e.owner + "-" + guid + "-"
	cw := b.expectCreate(prefix)
	defer b.forgetCreate(prefix)
	giveUp := time.Now().Add(limit)
	var last error
	unsettled := false // a create's outcome is unknown: find out before creating again
	for try := 0; ; try++ {
		if try > 0 {
			if time.Now().After(giveUp) {
				return res, wrap("acquire", e.key, last)
			}
			if try > 1 {
				select {
				case <-ctx.Done():
					return res, wrap("acquire", e.key, errors.Join(last, context.Cause(ctx)))
				case <-b.closing:
					return res, driver.ErrClosed
				case <-time.After(50 * time.Millisecond):
				}
			}
		}
		if unsettled {
			// The request may have been applied and its reply lost. Look for the
			// attempt's GUID before creating again.
			sess, sent := b.currentSession(), time.Now()
			var names []string
			lerr := b.call(ctx, func() error {
				var err error
				names, _, err = b.conn.Children(e.parent)
				return err
			})
			switch {
			case errors.Is(lerr, zk.ErrNoNode):
				unsettled = false // no lock node, so no child either
			case lerr != nil:
				last = errors.Join(last, lerr)
				if ctx.Err() != nil || permanent(lerr) {
					return res, wrap("acquire", e.key, last)
				}
				continue
			default:
				unsettled = false
				for _, c := range queue(names) {
					if c.guid == guid {
						b.log.Debug("zklock: adopted a contender whose create reply was lost", "key", e.key, "node", c.name)
						b.markHeard(sent, sess)
						name, _ := b.setName(e, c.name)
						return created{name: name, session: sess}, nil
					}
				}
			}
		}
		sess := b.currentSession()
		sent := time.Now()
		var path string
		createFn := func() error {
			var err error
			path, err = b.conn.Create(prefix, data, zk.FlagEphemeralSequential, b.acl)
			return err
		}
		var names []string
		var lerr error
		listed := false
		if try == 0 {
			errc := make(chan error, 1)
			if !b.async(func() { errc <- b.call(ctx, createFn) }) {
				return res, driver.ErrClosed
			}
			select {
			case <-cw.written:
				listed = true
				lerr = b.call(ctx, func() error {
					var err error
					names, _, err = b.conn.Children(e.parent)
					return err
				})
				err = <-errc
			case err = <-errc:
			}
		} else {
			err = b.call(ctx, createFn)
		}
		switch {
		case err == nil:
			b.markHeard(sent, sess)
			name, _ := b.setName(e, pathBase(path))
			res = created{name: name, czxid: b.createZxid(cw), session: sess}
			if listed && lerr == nil {
				res.names, res.listed = names, true
			}
			return res, nil
		case errors.Is(err, zk.ErrNoNode):
			if err := b.makeParent(ctx, e.parent); err != nil {
				return res, wrap("acquire", e.key, err)
			}
			continue
		case permanent(err):
			return res, wrap("acquire", e.key, err)
		case ctx.Err() != nil:
			unknown = true // the request may still be on its way
			return res, wrap("acquire", e.key, err)
		case errors.Is(err, zk.ErrSessionExpired):
			last = err // nothing of the old session survives: create again
			continue
		}
		// The outcome is unknown (connection lost with the request in flight).
		unknown, unsettled = true, true
		last = err
	}
}

func pathBase(p string) string { return p[strings.LastIndexByte(p, '/')+1:] }

func (b *Backend) setName(e *entry, name string) (string, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	e.name, e.path = name, e.parent+"/"+name
	return name, nil
}

// makeParent creates the lock's container node. The server deletes a container once
// its last child is gone, so lock nodes do not pile up.
func (b *Backend) makeParent(ctx context.Context, p string) error {
	err := b.call(ctx, func() error {
		_, err := b.conn.CreateContainer(p, nil, zk.FlagContainer, b.acl)
		return err
	})
	switch {
	case err == nil, errors.Is(err, zk.ErrNodeExists):
		return nil
	case errors.Is(err, zk.ErrNoNode):
		return fmt.Errorf("root %s does not exist: %w", b.rootPath(), err)
	}
	return err
}

// Refresh implements driver.Backend: it writes the child's data, which the leader
// refuses if the child is gone.
func (b *Backend) Refresh(ctx context.Context, key, owner string, ttl time.Duration) error {
	e := b.lookup(key, owner)
	if e == nil {
		return driver.ErrNotHeld
	}
	e.op.Lock()
	defer e.op.Unlock()
	b.mu.Lock()
	ok := !e.dead && e.granted
	p, czxid, watch := e.path, e.czxid, !e.watched
	sess := b.session
	b.mu.Unlock()
	if !ok {
		return driver.ErrNotHeld
	}
	// A grant whose czxid came from the create reply gets its deletion watch now,
	// at its first renewal, in the same round trip; most locks are released before
	// that and never pay for it. The watch's stat also confirms the token.
	var wst *zk.Stat
	var werr error
	var wg sync.WaitGroup
	if watch {
		wg.Go(func() {
			werr = b.call(ctx, func() error {
				var err error
				_, wst, _, err = b.conn.ChildrenW(p)
				return err
			})
		})
	}
	sent := time.Now()
	err := b.call(ctx, func() error {
		_, err := b.conn.Set(p, []byte(strconv.FormatInt(ttl.Milliseconds(), 10)), -1)
		return err
	})
	wg.Wait()
	b.mu.Lock()
	defer b.mu.Unlock()
	if watch && werr == nil && !e.dead {
		if wst.Czxid != czxid {
			b.log.Warn("zklock: the create reply's zxid is not the node's czxid; ending the grant", "key", key, "reply", czxid, "czxid", wst.Czxid)
			b.dropLocked(e, true)
			return fmt.Errorf("%w: zklock: token of %q could not be confirmed", driver.ErrNotHeld, key)
		}
		e.watched = true
	}
	switch {
	case err == nil:
		if e.dead {
			return driver.ErrNotHeld
		}
		if sent.After(b.heard) && sess == b.session {
			b.heard = sent
		}
		b.armLocked(e, ttl)
		return nil
	case errors.Is(err, zk.ErrNoNode):
		b.dropLocked(e, false)
		return fmt.Errorf("%w: zklock: the contender node of %q is gone", driver.ErrNotHeld, key)
	}
	return wrap("refresh", key, err)
}

// Release implements driver.Backend.
func (b *Backend) Release(ctx context.Context, key, owner string) error {
	e := b.lookup(key, owner)
	if e != nil {
		e.op.Lock()
		defer e.op.Unlock()
		b.mu.Lock()
		dead, granted, p, guid := e.dead, e.granted, e.path, e.guid
		b.mu.Unlock()
		if dead {
			return driver.ErrNotHeld
		}
		if p != "" {
			err := b.call(ctx, func() error { return b.conn.Delete(p, -1) })
			if err != nil && !errors.Is(err, zk.ErrNoNode) {
				return wrap("release", key, err)
			}
			b.mu.Lock()
			b.dropLocked(e, false)
			b.mu.Unlock()
			if err != nil || !granted {
				return driver.ErrNotHeld
			}
			return nil
		}
		if guid != "" {
			// A create whose outcome is unknown: delete what carries its GUID.
			_, err := b.deleteMatching(ctx, e.parent, func(c child) bool { return c.guid == guid })
			if err != nil {
				return wrap("release", key, err)
			}
			b.mu.Lock()
			b.dropLocked(e, false)
			b.mu.Unlock()
			return driver.ErrNotHeld
		}
	}
	// Not ours here: the owner may hold the key through another connection.
	held, err := b.deleteMatching(ctx, b.LockPath(key), func(c child) bool { return c.owner == owner })
	if err != nil {
		return wrap("release", key, err)
	}
	if !held {
		return driver.ErrNotHeld
	}
	return nil
}

// Inspect implements driver.Inspector. TTL is an estimate: the holder's TTL less the
// time since its last renewal (the child's mtime, on the server's clock).
func (b *Backend) Inspect(ctx context.Context, key string) (driver.Info, error) {
	parent := b.LockPath(key)
	for range 3 {
		var names []string
		err := b.call(ctx, func() error {
			var err error
			names, _, err = b.conn.Children(parent)
			return err
		})
		if errors.Is(err, zk.ErrNoNode) {
			return driver.Info{}, driver.ErrNotHeld
		}
		if err != nil {
			return driver.Info{}, wrap("inspect", key, err)
		}
		q := queue(names)
		if len(q) == 0 {
			return driver.Info{}, driver.ErrNotHeld
		}
		var data []byte
		var st *zk.Stat
		err = b.call(ctx, func() error {
			var err error
			data, st, err = b.conn.Get(parent + "/" + q[0].name)
			return err
		})
		if errors.Is(err, zk.ErrNoNode) {
			continue
		}
		if err != nil {
			return driver.Info{}, wrap("inspect", key, err)
		}
		info := driver.Info{Key: key, Owner: q[0].owner, Token: uint64(st.Czxid), Waiters: len(q) - 1}
		if ms, err := strconv.ParseInt(string(data), 10, 64); err == nil && ms > 0 {
			ttl := time.Duration(ms) * time.Millisecond
			left := time.Until(time.UnixMilli(st.Mtime).Add(ttl))
			info.TTL = min(max(left, time.Millisecond), ttl)
		}
		return info, nil
	}
	return driver.Info{}, wrap("inspect", key, errors.New("the queue kept changing"))
}

// ForceRelease implements driver.ForceReleaser: it deletes the holder's child. The
// holder's backend sees the deletion and ends its lease; the next waiter is granted
// with a larger token.
func (b *Backend) ForceRelease(ctx context.Context, key string) error {
	parent := b.LockPath(key)
	for range 5 {
		var names []string
		err := b.call(ctx, func() error {
			var err error
			names, _, err = b.conn.Children(parent)
			return err
		})
		if errors.Is(err, zk.ErrNoNode) {
			return driver.ErrNotHeld
		}
		if err != nil {
			return wrap("force release", key, err)
		}
		q := queue(names)
		if len(q) == 0 {
			return driver.ErrNotHeld
		}
		err = b.call(ctx, func() error { return b.conn.Delete(parent+"/"+q[0].name, -1) })
		if err == nil {
			return nil
		}
		if !errors.Is(err, zk.ErrNoNode) {
			return wrap("force release", key, err)
		}
	}
	return wrap("force release", key, errors.New("the queue kept changing"))
}

// Watch implements driver.Notifier. A waiting attempt watches its predecessor child
// only; the waiter is signalled when that child is deleted, when its own child is,
// and when the session ends.
func (b *Backend) Watch(ctx context.Context, key, owner string) (driver.Waiter, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.closed {
		return nil, driver.ErrClosed
	}
	k := ekey{key, owner}
	if old := b.waiters[k]; old != nil {
		b.unwatchLocked(old)
	}
	w := &waiter{b: b, key: key, owner: owner, c: make(chan struct{}, 1)}
	b.waiters[k] = w
	return w, nil
}

type waiter struct {
	b          *Backend
	key, owner string
	c          chan struct{}

	// Guarded by Backend.mu.
	pred     string    // watched predecessor path
	watching bool      // the watch on pred is set on the server and has not fired
	checked  time.Time // when an attempt last listed the queue on the server
	ahead    int       // children between the holder and the own child then
}

// recheck bounds how long the attempts of a queued waiter whose watch on its
// predecessor is in place are answered without a request. ZooKeeper delivers a
// watch's event whenever the node goes while the session lives (the client library
// sets the watches again on reconnection; a session's end wakes every waiter), so
// the waiter is woken when its predecessor goes. Without this, every queued
// waiter's fallback attempt (the core's guard against a lost wake-up, every few
// seconds) would list the whole queue on the server: N waiters, N listings of N
// children every few seconds, which at a few thousand waiters saturates the server
// and delays the holder's heartbeats past the session's validity. The recheck
// still finds, within its bound, a child of ours that was deleted behind our back.
const recheck = 30 * time.Second

func (w *waiter) C() <-chan struct{} { return w.c }

func (w *waiter) signal() {
	select {
	case w.c <- struct{}{}:
	default:
	}
}

// unwatchLocked forgets w's predecessor watch (the server-side watch stays until the
// predecessor is deleted or the session ends; it then fires into nothing).
func (b *Backend) unwatchLocked(w *waiter) {
	w.watching = false
	if w.pred == "" {
		return
	}
	if m := b.predOf[w.pred]; m != nil {
		delete(m, w)
		if len(m) == 0 {
			delete(b.predOf, w.pred)
		}
	}
	w.pred = ""
}

// Stop implements driver.Waiter: a waiter that did not acquire deletes its child.
func (w *waiter) Stop(ctx context.Context, acquired bool) error {
	b := w.b
	k := ekey{w.key, w.owner}
	b.mu.Lock()
	b.unwatchLocked(w)
	if b.waiters[k] == w {
		delete(b.waiters, k)
	}
	e := b.entries[k]
	b.mu.Unlock()
	if acquired || e == nil {
		return nil
	}
	e.op.Lock()
	defer e.op.Unlock()
	b.mu.Lock()
	if e.dead || e.granted {
		b.mu.Unlock()
		return nil
	}
	p, guid := e.path, e.guid
	b.mu.Unlock()
	var err error
	switch {
	case p != "":
		err = b.call(ctx, func() error { return b.conn.Delete(p, -1) })
		if errors.Is(err, zk.ErrNoNode) {
			err = nil
		}
	case guid != "":
		_, err = b.deleteMatching(ctx, e.parent, func(c child) bool { return c.guid == guid })
	}
	b.mu.Lock()
	b.dropLocked(e, err != nil)
	b.mu.Unlock()
	if err != nil {
		return wrap("withdraw waiter", w.key, err)
	}
	return nil
}

// onConnectResponse is called by the connection wrapper with the server's answer to
// a (re)connection, just before the library announces the session.
func (b *Backend) onConnectResponse(sid int64, timeout time.Duration) {
	b.mu.Lock()
	b.wireSession, b.wireTimeout = sid, timeout
	b.mu.Unlock()
}

func (b *Backend) onDialError(err error) {
	b.mu.Lock()
	b.dialErr = err
	b.mu.Unlock()
}

// onEvent receives every session and watch event from the library's goroutines. It
// must not block.
func (b *Backend) onEvent(ev zk.Event) {
	b.mu.Lock()
	defer b.mu.Unlock()
	switch ev.Type {
	case zk.EventSession:
		switch ev.State {
		case zk.StateConnected:
			b.dialedAt = time.Now()
			b.dialErr = nil
		case zk.StateHasSession:
			sid := b.wireSession
			if b.session != 0 && sid != b.session {
				b.sessionGoneLocked("replaced by a new session")
			}
			if sid != b.session {
				b.heard = b.dialedAt
			} else if b.dialedAt.After(b.heard) {
				b.heard = b.dialedAt // revalidated by the ensemble on reconnection
			}
			b.session = sid
			if b.wireTimeout > 0 {
				b.timeout = b.wireTimeout
			}
			if !b.readyClosed {
				b.readyClosed = true
				close(b.ready)
			}
		case zk.StateExpired:
			b.log.Warn("zklock: ZooKeeper session expired; its locks are lost", "server", ev.Server)
			b.sessionGoneLocked("expired")
			b.session = 0
		case zk.StateAuthFailed:
			b.dialErr = zk.ErrAuthFailed
		}
	case zk.EventNodeDeleted, zk.EventNotWatching:
		if e := b.byPath[ev.Path]; e != nil && ev.Type == zk.EventNodeDeleted {
			b.dropLocked(e, false)
		}
		for w := range b.predOf[ev.Path] {
			w.pred, w.watching = "", false
			w.signal()
		}
		delete(b.predOf, ev.Path)
	}
}

// sessionGoneLocked drops every entry: the session that owned their children is
// gone, and with it the watches that would have told us about them.
func (b *Backend) sessionGoneLocked(why string) {
	for _, e := range b.entries {
		b.dropLocked(e, false)
	}
	for _, w := range b.waiters {
		b.unwatchLocked(w)
		w.signal()
	}
	if len(b.entries) > 0 {
		b.log.Debug("zklock: session gone", "why", why)
	}
}

// monitor heartbeats while the backend has children and ends every grant when the
// session may have expired (see the package documentation).
func (b *Backend) monitor() {
	defer b.wg.Done()
	var lastBeat time.Time
	for {
		b.mu.Lock()
		beatEvery := b.timeout / 6
		next := beatEvery
		if len(b.entries) > 0 && !b.hbRunning {
			next = max(time.Until(lastBeat.Add(beatEvery)), 0)
		}
		if b.granted > 0 {
			next = min(next, time.Until(b.heard.Add(sessionValidity(b.timeout))))
		}
		b.mu.Unlock()
		t := time.NewTimer(max(next, time.Millisecond))
		select {
		case <-b.closing:
			t.Stop()
			return
		case <-t.C:
		}
		now := time.Now()
		b.mu.Lock()
		if b.granted > 0 && !now.Before(b.heard.Add(sessionValidity(b.timeout))) {
			b.log.Warn("zklock: no reply from the ZooKeeper leader for half the session timeout; the session may have expired, ending its leases",
				"session_timeout", b.timeout, "last_heard", b.heard)
			for _, e := range b.entries {
				if e.granted {
					b.dropLocked(e, true)
				}
			}
		}
		start := len(b.entries) > 0 && !b.hbRunning && !now.Before(lastBeat.Add(beatEvery)) && !b.closed
		if start {
			b.hbRunning = true
			b.wg.Add(1)
		}
		sess := b.session
		b.mu.Unlock()
		if start {
			lastBeat = now
			go b.heartbeat(beatEvery, sess)
		}
	}
}

// heartbeat sends a sync, which goes through the leader, and records it as heard.
func (b *Backend) heartbeat(limit time.Duration, sess int64) {
	defer b.wg.Done()
	ctx, cancel := context.WithTimeout(context.Background(), limit)
	defer cancel()
	sent := time.Now()
	err := b.call(ctx, func() error { _, err := b.conn.Sync(b.rootPath()); return err })
	if err == nil {
		b.markHeard(sent, sess)
	}
	b.mu.Lock()
	b.hbRunning = false
	b.mu.Unlock()
}

// Close implements driver.Backend: it ends the session, which deletes every child the
// backend still has, and stops its goroutines.
func (b *Backend) Close() error {
	b.mu.Lock()
	if b.closed {
		b.mu.Unlock()
		return nil
	}
	for _, e := range b.entries {
		b.dropLocked(e, false)
	}
	b.closed = true
	close(b.closing)
	b.mu.Unlock()
	b.shutdown()
	return nil
}

// shutdown closes the connection and waits for the library's goroutines, whose last
// act is closing the event channel, and for the backend's.
func (b *Backend) shutdown() {
	b.mu.Lock()
	if !b.closed {
		b.closed = true
		close(b.closing)
	}
	b.mu.Unlock()
	b.conn.Close()
	t := time.NewTimer(10 * time.Second)
	defer t.Stop()
drain:
	for {
		select {
		case _, ok := <-b.events:
			if !ok {
				break drain
			}
		case <-t.C:
			b.log.Warn("zklock: the ZooKeeper client did not stop within 10s")
			break drain
		}
	}
	b.wg.Wait()
}
