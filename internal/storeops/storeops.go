// Package storeops talks to the stores dlock runs on directly, without dlock, for
// benchmarks and tests: the floor (the cheapest lock a store allows, the baseline
// dlock's cost is measured against) and the count of operations a server has
// served. Nothing here is used to serve locks; the backends do not import it.
// Each store is a package of its own (redisops, etcdops, zkops, pgops), registered
// by importing it, so that a backend's tests import only their own store's client.
package storeops

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"strings"
	"sync"
)

// Store is a direct connection to one store (or, for Redlock, one per node).
type Store interface {
	// FloorCycle takes and releases key the cheapest way the store allows: the
	// least correct lock (no fencing, no waiting), one acquire and one release.
	FloorCycle(ctx context.Context, key string) error
	// Ops returns a running total of the operations the server has served (for
	// example the sum of Redis commandstats calls), read so that the reads
	// themselves are not counted, or are subtracted.
	Ops(ctx context.Context) (int64, error)
	// OpsSource says in a few words what Ops counts.
	OpsSource() string
	Close() error
}

// ErrUnsupported is returned by Open for a scheme that has no store (mem).
var ErrUnsupported = errors.New("storeops: no direct store for this scheme")

var (
	mu      sync.Mutex
	openers = map[string]func(ctx context.Context, u *url.URL) (Store, error){}
)

// Register adds the opener of a scheme; each store package (redisops, etcdops, zkops,
// pgops) calls it from init.
func Register(scheme string, open func(ctx context.Context, u *url.URL) (Store, error)) {
	mu.Lock()
	defer mu.Unlock()
	openers[scheme] = open
}

// Open connects to the store a dlock URL names (its scheme, hosts, credentials and
// TLS parameters; parameters about locks are ignored).
func Open(ctx context.Context, rawURL string) (Store, error) {
	u, err := url.Parse(rawURL)
	if err != nil {
		return nil, fmt.Errorf("storeops: %v", err)
	}
	mu.Lock()
	open, ok := openers[strings.ToLower(u.Scheme)]
	mu.Unlock()
	if !ok {
		return nil, fmt.Errorf("%w: %q", ErrUnsupported, u.Scheme)
	}
	return open(ctx, u)
}
