package etcdlock

import (
	"crypto/tls"
	"fmt"
	"strings"
	"time"

	"github.com/dlockio/dlock/driver"
)

// Option configures a Backend.
type Option func(*config) error

// config holds every setting of a Backend: the defaults, then the URL's parameters
// (Open), then the options.
type config struct {
	prefix     string
	timeout    time.Duration
	tls        *tls.Config // Open only
	user, pass string      // Open only
	auth       bool        // user and pass are set
}

// WithPrefix sets the key prefix (default "dlock"): non-empty and without control
// characters once leading and trailing "/" are trimmed. Clients that should contend
// for the same locks must use the same prefix; clients with different prefixes never
// meet, even when one prefix lies under the other ("app" and "app/jobs").
func WithPrefix(p string) Option {
	return func(o *config) error {
		p = strings.Trim(p, "/")
		if p == "" || strings.ContainsFunc(p, func(r rune) bool { return r < 0x20 || r == 0x7f }) {
			return fmt.Errorf("%w: etcd key prefix must be non-empty and without control characters, got %q", driver.ErrInvalid, p)
		}
		o.prefix = p
		return nil
	}
}

// WithRequestTimeout bounds every request to etcd (default 5s), also when the
// caller's context has no deadline, so that an unreachable cluster fails a Lock call
// instead of hanging it.
func WithRequestTimeout(d time.Duration) Option {
	return func(o *config) error {
		if d <= 0 {
			return fmt.Errorf("%w: etcd request timeout must be positive, got %v", driver.ErrInvalid, d)
		}
		o.timeout = d
		return nil
	}
}

// WithTLS sets the TLS configuration of the connection (Open only; with New, configure
// the clientv3.Client).
func WithTLS(c *tls.Config) Option {
	return func(o *config) error {
		if c == nil {
			return fmt.Errorf("%w: nil TLS config", driver.ErrInvalid)
		}
		o.tls = c.Clone()
		return nil
	}
}

// WithAuth sets the etcd user and password (Open only).
func WithAuth(user, password string) Option {
	return func(o *config) error {
		if user == "" {
			return fmt.Errorf("%w: empty etcd user name", driver.ErrInvalid)
		}
		o.user, o.pass, o.auth = user, password, true
		return nil
	}
}

func defaultConfig() config {
	return config{prefix: DefaultPrefix, timeout: DefaultTimeout}
}

// apply runs opts on c in order; a nil option is an error.
func (c *config) apply(opts []Option) error {
	for _, opt := range opts {
		if opt == nil {
			return fmt.Errorf("%w: nil option", driver.ErrInvalid)
		}
		if err := opt(c); err != nil {
			return err
		}
	}
	return nil
}
