package driver

import (
	"context"
	"fmt"
	"net/url"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"
)

// Opener opens a backend from a URL. The core has already removed its own query
// parameters (ttl, renew, drift, owner); the opener must reject any parameter it does
// not know, so that a typo is an error and not a silently ignored setting, read the
// query with ParseParams (not url.URL.Query, which drops malformed pairs), check
// every value it passes on to a client library, and bound its work by ctx and, when
// ctx has no deadline, by OpenContext. The Host of a URL from ParseURL may be a
// comma-separated list.
type Opener func(ctx context.Context, u *url.URL) (Backend, error)

var registry struct {
	sync.RWMutex
	openers map[string]Opener
}

// Register makes a backend available to dlock.Open under a URL scheme. Backends call
// it from init. It panics if the scheme is registered twice, which is a programming
// error found at start-up.
func Register(scheme string, open Opener) {
	registry.Lock()
	defer registry.Unlock()
	if registry.openers == nil {
		registry.openers = make(map[string]Opener)
	}
	if _, dup := registry.openers[scheme]; dup {
		panic("driver: Register called twice for scheme " + scheme)
	}
	registry.openers[scheme] = open
}

// Lookup returns the opener registered for scheme.
func Lookup(scheme string) (Opener, bool) {
	registry.RLock()
	defer registry.RUnlock()
	o, ok := registry.openers[scheme]
	return o, ok
}

// Schemes lists the registered schemes in order.
func Schemes() []string {
	registry.RLock()
	defer registry.RUnlock()
	s := make([]string, 0, len(registry.openers))
	for k := range registry.openers {
		s = append(s, k)
	}
	sort.Strings(s)
	return s
}

// Params reads URL query parameters with validation and reports the ones nobody read.
// It is not safe for concurrent use.
type Params struct {
	v    url.Values
	used map[string]bool
}

// NewParams wraps a query. Parse the query with ParseQuery (or use ParseParams), not
// url.URL.Query, which drops the pairs it cannot decode.
func NewParams(v url.Values) *Params { return &Params{v: v, used: make(map[string]bool)} }

// Has reports whether the parameter was given; it does not count as reading it.
func (p *Params) Has(name string) bool { _, ok := p.v[name]; return ok }

func (p *Params) get(name string) (string, bool, error) {
	p.used[name] = true
	vals, ok := p.v[name]
	if !ok {
		return "", false, nil
	}
	if len(vals) != 1 {
		return "", false, fmt.Errorf("%w: URL parameter %q given %d times", ErrInvalid, name, len(vals))
	}
	return vals[0], true, nil
}

// String returns the parameter or def when absent.
func (p *Params) String(name, def string) (string, error) {
	s, ok, err := p.get(name)
	if err != nil || !ok {
		return def, err
	}
	return s, nil
}

// Duration returns a positive duration parameter ("10s", "250ms") or def when absent.
func (p *Params) Duration(name string, def time.Duration) (time.Duration, error) {
	s, ok, err := p.get(name)
	if err != nil || !ok {
		return def, err
	}
	d, err := time.ParseDuration(s)
	if err != nil || d <= 0 {
		return 0, fmt.Errorf("%w: URL parameter %s=%q is not a positive duration such as 10s or 250ms", ErrInvalid, name, s)
	}
	return d, nil
}

// Int returns a non-negative integer parameter or def when absent.
func (p *Params) Int(name string, def int) (int, error) {
	s, ok, err := p.get(name)
	if err != nil || !ok {
		return def, err
	}
	n, err := strconv.Atoi(s)
	if err != nil || n < 0 {
		return 0, fmt.Errorf("%w: URL parameter %s=%q is not a non-negative integer", ErrInvalid, name, s)
	}
	return n, nil
}

// Float returns a non-negative number parameter or def when absent.
func (p *Params) Float(name string, def float64) (float64, error) {
	s, ok, err := p.get(name)
	if err != nil || !ok {
		return def, err
	}
	f, err := strconv.ParseFloat(s, 64)
	if err != nil || f < 0 || f != f {
		return 0, fmt.Errorf("%w: URL parameter %s=%q is not a non-negative number", ErrInvalid, name, s)
	}
	return f, nil
}

// Bool returns a boolean parameter (true/false/1/0) or def when absent.
func (p *Params) Bool(name string, def bool) (bool, error) {
	s, ok, err := p.get(name)
	if err != nil || !ok {
		return def, err
	}
	b, err := strconv.ParseBool(s)
	if err != nil {
		return false, fmt.Errorf("%w: URL parameter %s=%q is not true or false", ErrInvalid, name, s)
	}
	return b, nil
}

// Unknown returns an error naming every parameter that was never read, or nil.
func (p *Params) Unknown() error {
	var names []string
	for k := range p.v {
		if !p.used[k] {
			names = append(names, k)
		}
	}
	if len(names) == 0 {
		return nil
	}
	sort.Strings(names)
	return fmt.Errorf("%w: unknown URL parameter(s): %s", ErrInvalid, strings.Join(names, ", "))
}

// Without returns a copy of u with the named query parameters removed. The other
// parameters keep their original encoding (a re-encoded "+" would mean a space to
// some parsers and a plus to others).
func Without(u *url.URL, names ...string) *url.URL {
	c := *u
	var kept []string
	for part := range strings.SplitSeq(u.RawQuery, "&") {
		if part == "" {
			continue
		}
		name, _, _ := strings.Cut(part, "=")
		if n, err := url.QueryUnescape(name); err == nil && slices.Contains(names, n) {
			continue
		}
		kept = append(kept, part)
	}
	c.RawQuery = strings.Join(kept, "&")
	return &c
}
