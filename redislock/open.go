package redislock

import (
	"context"
	"crypto/tls"
	"fmt"
	"net/url"

	"github.com/redis/go-redis/v9"

	"github.com/dlockio/dlock/driver"
	"github.com/dlockio/dlock/internal/recent"
)

// New returns a backend on an existing go-redis client. The caller keeps owning the
// client: Close does not close it. Use a client with ContextTimeoutEnabled so that
// contexts bound every call. New does no I/O (ctx is for the shape every backend's
// New shares); call Verify to read and check the server's persistence settings.
func New(ctx context.Context, rdb redis.UniversalClient, opts ...Option) (*Backend, error) {
	if rdb == nil {
		return nil, invalid("nil redis client")
	}
	b := &Backend{rdb: rdb, config: defaultConfig(), waiters: make(map[driver.Holder]*waiter),
		holders: make(map[string]*holderSub), pings: make(map[string]chan struct{}), lost: make(chan struct{}), hot: recent.NewSlots(hotFor)}
	for _, o := range opts {
		if err := o(&b.config); err != nil {
			return nil, err
		}
	}
	if err := b.setCluster(rdb); err != nil {
		return nil, err
	}
	b.wakeCh = wakeChannel(b.prefix, driver.RandomHex(wakeIDBytes))
	return b, nil
}

// Open returns a backend for a redis://, rediss://, unix://, redis+sentinel://,
// rediss+sentinel://, redis+cluster:// or rediss+cluster:// URL; see the package
// documentation for its parameters. Options given here apply after the URL's. It
// checks that the server answers and runs Verify before returning.
func Open(ctx context.Context, u *url.URL, opts ...Option) (*Backend, error) {
	if isClusterScheme(u.Scheme) {
		return openCluster(ctx, u, opts)
	}
	switch u.Scheme {
	case Scheme, SchemeTLS, SchemeUnix, SchemeSentinel, SchemeSentinelTLS:
	default:
		return nil, invalid("scheme %q is not %s, %s, %s, %s, %s, %s or %s", u.Scheme, Scheme, SchemeTLS, SchemeUnix,
			SchemeSentinel, SchemeSentinelTLS, SchemeCluster, SchemeClusterTLS)
	}
	p, err := driver.ParseParams(u)
	if err != nil {
		return nil, fmt.Errorf("redislock: %w", err)
	}
	urlOpts, err := urlOptions(p)
	if err != nil {
		return nil, err
	}
	var rdb *redis.Client
	if sentinelScheme(u.Scheme) {
		fo, err := failoverOptions(u, p)
		if err != nil {
			return nil, err
		}
		if err := p.Unknown(); err != nil {
			return nil, fmt.Errorf("redislock: %w", err)
		}
		fo.ContextTimeoutEnabled = true
		rdb = redis.NewFailoverClient(fo)
	} else {
		opt, err := redisOptions(u, p)
		if err != nil {
			return nil, err
		}
		if opt.TLSConfig, err = readTLS(u, p); err != nil {
			return nil, err
		}
		if err := p.Unknown(); err != nil {
			return nil, fmt.Errorf("redislock: %w", err)
		}
		opt.ContextTimeoutEnabled = true
		rdb = redis.NewClient(opt)
	}
	return start(ctx, u, rdb, append(urlOpts, opts...), func(ctx context.Context) error { return rdb.Ping(ctx).Err() })
}

// start makes the backend of Open on rdb, which it then owns: ping (every node
// the backend's scripts may run on) must answer, and Verify pass; on failure rdb
// is closed.
func start(ctx context.Context, u *url.URL, rdb redis.UniversalClient, opts []Option, ping func(context.Context) error) (*Backend, error) {
	b, err := New(ctx, rdb, opts...)
	if err != nil {
		rdb.Close()
		return nil, err
	}
	b.own = true
	octx, cancel := driver.OpenContext(ctx)
	defer cancel()
	if err := ping(octx); err != nil {
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

// readTLS returns the TLS configuration of u, or nil for none: driver.ReadTLS's
// rule, with TLS on by itself for rediss:// and rediss+sentinel:// (where
// tls=false is an error) and not available on a unix socket. skip_verify, a
// go-redis parameter ReadTLS has no counterpart of, stays for the users who rely
// on it: it turns off the certificate check and needs TLS on.
func readTLS(u *url.URL, p *driver.Params) (*tls.Config, error) {
	tlsScheme := u.Scheme == SchemeTLS || u.Scheme == SchemeSentinelTLS
	if tlsScheme {
		if on, err := p.Bool("tls", true); err != nil {
			return nil, err
		} else if !on {
			return nil, invalid("tls=false with the %s:// scheme", u.Scheme)
		}
	}
	cfg, err := driver.ReadTLS(p)
	if err != nil {
		return nil, fmt.Errorf("redislock: %w", err)
	}
	if cfg == nil && tlsScheme {
		cfg, _ = driver.TLSConfig(nil) // nothing to read: cannot fail
	}
	skip, err := p.Bool("skip_verify", false)
	if err != nil {
		return nil, err
	}
	switch {
	case cfg == nil && p.Has("skip_verify"):
		return nil, invalid("skip_verify needs TLS (the %s:// or %s:// scheme, or tls=true)", SchemeTLS, SchemeSentinelTLS)
	case cfg == nil:
		return nil, nil
	case u.Scheme == SchemeUnix:
		return nil, invalid("TLS parameters with a %s:// socket", SchemeUnix)
	}
	if cfg.ServerName == "" && !sentinelScheme(u.Scheme) {
		// A sentinel URL names several hosts, and the master's address comes from
		// the sentinels: crypto/tls then checks each connection against the host
		// it dials.
		cfg.ServerName = u.Hostname()
	}
	cfg.InsecureSkipVerify = skip
	return cfg, nil
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
	return driver.Join(errs...)
}
