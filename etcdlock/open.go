package etcdlock

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"net/url"
	"strconv"
	"strings"
	"time"

	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/dlockio/dlock/driver"
)

// New returns a backend on an existing etcd client, which the caller keeps owning:
// Close does not close it. WithTLS and WithAuth do not apply: configure them on the
// client. New makes no request today; ctx is there so that every backend's New has
// one shape.
func New(ctx context.Context, cli *clientv3.Client, opts ...Option) (*Backend, error) {
	if cli == nil {
		return nil, fmt.Errorf("%w: nil etcd client", driver.ErrInvalid)
	}
	c := defaultConfig()
	if err := c.apply(opts); err != nil {
		return nil, err
	}
	if c.tls != nil || c.auth {
		return nil, fmt.Errorf("%w: WithTLS and WithAuth apply to Open; configure the clientv3.Client given to New", driver.ErrInvalid)
	}
	return newBackend(cli, c), nil
}

func newBackend(cli *clientv3.Client, c config) *Backend {
	ctx, cancel := context.WithCancel(context.Background())
	return &Backend{
		cli: cli, prefix: c.prefix, timeout: c.timeout,
		ctx: ctx, cancel: cancel, grant: make(chan struct{}, 1),
		sessions: make(map[int64]*session), waiters: make(map[driver.Holder]*waiter), held: make(map[driver.Holder]*tracked),
		names: make(map[driver.Holder]string), burned: make(map[string]bool), firsts: make(map[string]firstHint), reading: make(map[string]*firstRead), id: newID(),
	}
}

// Open returns a backend for an etcd:// URL; see the package documentation for its
// parameters. Options override the URL. It checks that the cluster answers a read
// before returning, within ctx and the dial timeout.
func Open(ctx context.Context, u *url.URL, opts ...Option) (*Backend, error) {
	if u.Scheme != Scheme {
		return nil, fmt.Errorf("%w: etcdlock needs an etcd:// URL, got scheme %q", driver.ErrInvalid, u.Scheme)
	}
	c, dialTimeout, err := readURL(u)
	if err != nil {
		return nil, err
	}
	if err := c.apply(opts); err != nil {
		return nil, err
	}
	endpoints, err := parseEndpoints(u.Host, c.tls != nil)
	if err != nil {
		return nil, err
	}
	return connect(ctx, u, c, endpoints, dialTimeout)
}

// readURL reads the settings of an etcd:// URL: its parameters, its path (the
// prefix) and its user info. It returns the dial timeout apart: it bounds Open only.
func readURL(u *url.URL) (config, time.Duration, error) {
	c := defaultConfig()
	p, err := driver.ParseParams(u)
	if err != nil {
		return c, 0, fmt.Errorf("etcdlock: %w", err)
	}
	if c.timeout, err = p.Duration("timeout", DefaultTimeout); err != nil {
		return c, 0, err
	}
	dialTimeout, err := p.Duration("dial_timeout", DefaultDialTimeout)
	if err != nil {
		return c, 0, err
	}
	if c.tls, err = driver.ReadTLS(p); err != nil {
		return c, 0, fmt.Errorf("etcdlock: %w", err)
	}
	if err := p.Unknown(); err != nil {
		return c, 0, err
	}
	if path := strings.Trim(u.Path, "/"); path != "" {
		if err := WithPrefix(path)(&c); err != nil {
			return c, 0, err
		}
	}
	if u.User != nil {
		pass, ok := u.User.Password()
		if u.User.Username() == "" || !ok {
			return c, 0, fmt.Errorf("%w: etcd URL user info needs both a user name and a password", driver.ErrInvalid)
		}
		c.user, c.pass, c.auth = u.User.Username(), pass, true
	}
	return c, dialTimeout, nil
}

// connect makes the client of a backend made by Open and checks, with one read,
// that the cluster answers, within ctx and dialTimeout.
func connect(ctx context.Context, u *url.URL, c config, endpoints []string, dialTimeout time.Duration) (*Backend, error) {
	connectTimeout := dialTimeout
	if dl, ok := ctx.Deadline(); ok {
		// clientv3.New authenticates within its dial timeout, not within ctx.
		connectTimeout = max(min(connectTimeout, time.Until(dl)), time.Millisecond)
	}
	pctx, cancel := context.WithTimeout(ctx, dialTimeout)
	defer cancel()
	if c.tls != nil {
		// gRPC retries a failed TLS handshake until the deadline and then reports
		// only the deadline; one handshake of our own names the cause.
		if err := probeTLS(pctx, endpoints, c.tls); err != nil {
			return nil, fmt.Errorf("etcdlock: connect to %s: %w", driver.Redact(u), err)
		}
	}
	cfg := clientv3.Config{
		Endpoints:            endpoints,
		DialTimeout:          connectTimeout,
		DialKeepAliveTime:    10 * time.Second,
		DialKeepAliveTimeout: 3 * time.Second,
		TLS:                  c.tls,
		Logger:               zap.NewNop(),
	}
	if c.auth {
		cfg.Username, cfg.Password = c.user, c.pass
	}
	cli, err := clientv3.New(cfg)
	if err != nil {
		return nil, fmt.Errorf("etcdlock: connect to %s: %w", driver.Redact(u), authErr(err))
	}
	b := newBackend(cli, c)
	b.own = true
	if _, err := cli.Get(pctx, b.prefix+"/", clientv3.WithCountOnly()); err != nil {
		b.Close()
		if ctx.Err() != nil {
			err = errors.Join(err, ctx.Err())
		}
		return nil, fmt.Errorf("etcdlock: connect to %s: %w", driver.Redact(u), authErr(err))
	}
	return b, nil
}

// authErr marks etcd refusing the credentials or the permission with
// driver.ErrAuth.
func authErr(err error) error {
	conv := rpctypes.Error(err)
	for _, a := range []error{rpctypes.ErrAuthFailed, rpctypes.ErrUserEmpty, rpctypes.ErrPermissionDenied, rpctypes.ErrInvalidAuthToken} {
		if errors.Is(err, a) || errors.Is(conv, a) {
			return fmt.Errorf("%w: %w", driver.ErrAuth, err)
		}
	}
	if st, ok := status.FromError(err); ok && (st.Code() == codes.Unauthenticated || st.Code() == codes.PermissionDenied) {
		return fmt.Errorf("%w: %w", driver.ErrAuth, err)
	}
	return err
}

// refusedCert reports whether err is the server's TLS alert refusing the client's
// certificate (or its absence).
func refusedCert(err error) bool {
	var opErr *net.OpError
	if !errors.As(err, &opErr) || opErr.Op != "remote error" {
		return false
	}
	msg := opErr.Err.Error()
	return strings.Contains(msg, "certificate") || strings.Contains(msg, "access denied")
}

// probeTLS makes a TLS handshake with the endpoints in turn until one succeeds. It
// returns nil then, or when no endpoint could be reached at all (clientv3 reports
// that itself); it returns the handshake error when an endpoint answered but the
// handshake failed (an unknown authority, a wrong name, a refused client
// certificate), which is otherwise hidden behind gRPC's retries.
func probeTLS(ctx context.Context, endpoints []string, base *tls.Config) error {
	var failed error
	for _, ep := range endpoints {
		addr := strings.TrimPrefix(ep, "https://")
		cfg := base.Clone()
		if cfg.ServerName == "" {
			cfg.ServerName, _, _ = net.SplitHostPort(addr)
		}
		cfg.NextProtos = []string{"h2"}
		d := tls.Dialer{Config: cfg}
		c, err := d.DialContext(ctx, "tcp", addr)
		if err == nil {
			// A client certificate the server refuses (TLS 1.3) is reported on the
			// first read; an etcd server otherwise sends its HTTP/2 settings at once.
			_ = c.SetReadDeadline(time.Now().Add(250 * time.Millisecond))
			var one [1]byte
			_, rerr := c.Read(one[:])
			c.Close()
			if refusedCert(rerr) {
				failed = fmt.Errorf("%w: TLS handshake with %s: %w", driver.ErrAuth, addr, rerr)
				continue
			}
			return nil
		}
		var opErr *net.OpError
		if errors.As(err, &opErr) && opErr.Op == "dial" || ctx.Err() != nil {
			continue // not reached: clientv3 reports it
		}
		if refusedCert(err) {
			err = fmt.Errorf("%w: %w", driver.ErrAuth, err)
		}
		failed = fmt.Errorf("TLS handshake with %s: %w", addr, err)
	}
	return failed
}

func parseEndpoints(host string, secure bool) ([]string, error) {
	if host == "" {
		return nil, fmt.Errorf("%w: etcd URL names no endpoint (etcd://host:2379,...)", driver.ErrInvalid)
	}
	var eps []string
	for ep := range strings.SplitSeq(host, ",") {
		if ep == "" {
			return nil, fmt.Errorf("%w: empty endpoint in etcd URL host list %q", driver.ErrInvalid, host)
		}
		h, port, err := net.SplitHostPort(ep)
		if err != nil {
			h, port = ep, DefaultPort
			if strings.Contains(ep, ":") && !strings.HasPrefix(ep, "[") {
				return nil, fmt.Errorf("%w: etcd endpoint %q is not host:port", driver.ErrInvalid, ep)
			}
			h = strings.Trim(h, "[]")
		}
		if n, err := strconv.Atoi(port); err != nil || n < 1 || n > 65535 {
			return nil, fmt.Errorf("%w: etcd endpoint %q has a bad port", driver.ErrInvalid, ep)
		}
		if h == "" {
			return nil, fmt.Errorf("%w: etcd endpoint %q has no host", driver.ErrInvalid, ep)
		}
		scheme := "http://"
		if secure {
			scheme = "https://"
		}
		eps = append(eps, scheme+net.JoinHostPort(h, port))
	}
	return eps, nil
}
