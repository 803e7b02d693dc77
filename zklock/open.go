package zklock

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/url"
	"strconv"
	"strings"
	"sync"

	"github.com/dlockio/dlock/driver"
	"github.com/dlockio/dlock/internal/callers"
	"github.com/go-zookeeper/zk"
)

// Open returns a backend for a zk:// URL; see the package documentation for its
// form and parameters. It returns once a session is established and the root is
// usable, or fails when ctx ends or the session timeout passes first.
func Open(ctx context.Context, u *url.URL, opts ...Option) (*Backend, error) {
	if u.Scheme != Scheme {
		return nil, invalid("scheme %q is not %s", u.Scheme, Scheme)
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
//
// There is no New taking a *zk.Conn the program already has, as the other backends
// have for their clients: a lock's safety rests on the session (its expiry ends
// every lease at once, and the backend watches its state and sniffs create replies
// on the wire to settle lost ones), so the backend must make and own the connection.
// Dial is the counterpart that takes servers instead of a URL.
func Dial(ctx context.Context, servers []string, opts ...Option) (*Backend, error) {
	if len(servers) == 0 {
		return nil, invalid("no server given")
	}
	return dial(ctx, servers, "zk://"+strings.Join(servers, ","), opts)
}

func dial(ctx context.Context, servers []string, name string, opts []Option) (*Backend, error) {
	cfg, err := newConfig(opts)
	if err != nil {
		return nil, err
	}
	b := newBackend(cfg, name)
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
	var conn *zk.Conn
	var events <-chan zk.Event
	hooks := &wireHooks{connect: b.onConnectResponse, wrote: b.onCreateWritten, replied: b.onReply,
		dialed: func(c net.Conn) { rawMu.Lock(); raw = c; rawMu.Unlock() }}
	conn, events, err = zk.Connect(servers, cfg.sessionTimeout,
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
	if err := b.awaitSession(ctx, wctx, name, &rawMu, &raw); err != nil {
		return fail(err)
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

// newConfig applies opts to the defaults.
func newConfig(opts []Option) (config, error) {
	cfg := config{root: DefaultRoot, sessionTimeout: DefaultSessionTimeout, createRoot: true,
		logger: slog.New(slog.DiscardHandler)}
	for _, o := range opts {
		if o == nil {
			return cfg, invalid("nil option")
		}
		if err := o(&cfg); err != nil {
			return cfg, err
		}
	}
	if cfg.acl == nil {
		if cfg.hasAuth {
			cfg.acl = zk.AuthACL(zk.PermAll)
		} else {
			cfg.acl = zk.WorldACL(zk.PermAll)
		}
	}
	return cfg, nil
}

// newBackend returns a Backend for cfg, not connected yet.
func newBackend(cfg config, name string) *Backend {
	return &Backend{
		root: cfg.root, acl: cfg.acl, log: cfg.logger, name: name,
		timeout: cfg.sessionTimeout,
		closing: make(chan struct{}), ready: make(chan struct{}), callers: callers.New(),
		entries: make(map[driver.Holder]*entry), byPath: make(map[string]*entry),
		waiters: make(map[driver.Holder]*waiter), predOf: make(map[string]map[*waiter]bool),
		doomed: make(map[string]bool), holders: make(map[*holderWatch]bool),
		creates: make(map[string]*createWait), createXid: make(map[int32]*createWait),
	}
}

// awaitSession waits for the first session, until wctx ends (Open's bound), and
// says why none came: the last dial error, and ctx's cause if the caller gave up.
func (b *Backend) awaitSession(ctx, wctx context.Context, name string, rawMu *sync.Mutex, raw *net.Conn) error {
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
		if *raw != nil {
			(*raw).Close()
		}
		rawMu.Unlock()
		return fmt.Errorf("zklock: connect to %s: %w (%w)", name, why, err)
	}
	return nil
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
	return fmt.Errorf("no server name resolves: %w", driver.Join(errs...))
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
