package zklock

import (
	"crypto/tls"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"time"

	"github.com/dlockio/dlock/driver"
	"github.com/go-zookeeper/zk"
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
