package memlock

import (
	"context"
	"fmt"
	"net/url"
	"reflect"
	"sync"

	"github.com/dlockio/dlock/clock"
	"github.com/dlockio/dlock/driver"
)

// Scheme is the URL scheme of the in-process backend, registered with package
// driver: mem://NAME names a store shared by every Open of that NAME in the process
// (mem:// alone is the store "default").
const Scheme = "mem"

func init() {
	driver.Register(Scheme, func(ctx context.Context, u *url.URL) (driver.Backend, error) {
		return Open(ctx, u)
	})
}

// Option configures a Backend.
type Option func(*config) error

// config holds every setting of a Backend.
type config struct {
	clock clock.Clock // Open only: the clock of a store Open creates; nil for clock.Real
}

// WithClock sets the clock on which the TTLs of the store that Open creates run
// (default clock.Real), for tests with a fake clock. It applies to Open only (New
// takes a Store, which has its clock), and Open refuses it for a NAME whose store
// already runs on another clock.
func WithClock(clk clock.Clock) Option {
	return func(c *config) error {
		if clk == nil {
			return fmt.Errorf("%w: memlock: nil clock", driver.ErrInvalid)
		}
		c.clock = clk
		return nil
	}
}

func (c *config) apply(opts []Option) error {
	for _, opt := range opts {
		if opt == nil {
			return fmt.Errorf("%w: memlock: nil option", driver.ErrInvalid)
		}
		if err := opt(c); err != nil {
			return err
		}
	}
	return nil
}

var named struct {
	sync.Mutex
	stores map[string]*Store
}

// Open returns a new connection to the store a mem://NAME URL names, creating the
// store on first use. The URL takes no parameters of its own (the core's ttl,
// renew, drift and owner are read by dlock.Open). ctx is unused: nothing here
// waits.
func Open(_ context.Context, u *url.URL, opts ...Option) (*Backend, error) {
	if u.Scheme != Scheme {
		return nil, fmt.Errorf("%w: memlock needs a mem:// URL, got scheme %q", driver.ErrInvalid, u.Scheme)
	}
	p, err := driver.ParseParams(u)
	if err != nil {
		return nil, err
	}
	if err := p.Unknown(); err != nil {
		return nil, err
	}
	if u.User != nil || u.Path != "" && u.Path != "/" || u.Opaque != "" {
		return nil, fmt.Errorf("%w: mem URL is mem://NAME (got a path, opaque part or user)", driver.ErrInvalid)
	}
	var c config
	if err := c.apply(opts); err != nil {
		return nil, err
	}
	name := u.Host
	if name == "" {
		name = "default"
	}
	named.Lock()
	defer named.Unlock()
	if named.stores == nil {
		named.stores = make(map[string]*Store)
	}
	s := named.stores[name]
	switch {
	case s == nil:
		clk := c.clock
		if clk == nil {
			clk = clock.Real
		}
		s = NewStore(clk)
		named.stores[name] = s
	case c.clock != nil && !sameClock(c.clock, s.clk):
		return nil, fmt.Errorf("%w: memlock: store %q already runs on another clock", driver.ErrInvalid, name)
	}
	return s.Backend(), nil
}

// New returns a new connection to s, which the caller keeps: Backend.Close closes
// the connection only. No option applies to New today (the store has its clock);
// ctx and opts are there so that every backend's New has one shape.
func New(_ context.Context, s *Store, opts ...Option) (*Backend, error) {
	if s == nil {
		return nil, fmt.Errorf("%w: memlock: nil store", driver.ErrInvalid)
	}
	var c config
	if err := c.apply(opts); err != nil {
		return nil, err
	}
	if c.clock != nil {
		return nil, fmt.Errorf("%w: memlock: WithClock applies to Open; a Store has its clock (NewStore)", driver.ErrInvalid)
	}
	return s.Backend(), nil
}

// sameClock reports whether a and b are the same clock (a clock of a type that
// cannot be compared is never the same as another).
func sameClock(a, b clock.Clock) bool {
	return reflect.TypeOf(a).Comparable() && reflect.TypeOf(b).Comparable() && a == b
}
