package redisops

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/url"
	"strconv"
	"strings"
	"sync"

	"github.com/redis/go-redis/v9"

	"github.com/dlockio/dlock/driver"
	"github.com/dlockio/dlock/internal/storeops"
)

// redlockStore talks to the nodes of a redlock:// URL, with a go-redis client per
// node of its own.
type redlockStore struct {
	nodes  []*redis.Client
	prefix string
}

// redlockDefaultPrefix is redlock.DefaultPrefix (the backend is not imported: the
// backends do not depend on this package, nor it on them).
const redlockDefaultPrefix = "redlock"

func init() { storeops.Register("redlock", openRedlock) }

// openRedlock connects to every node of a redlock:// URL: its hosts (port 6379 by
// default), database, credentials and TLS parameters (driver.ReadTLS), and its
// prefix, which names the floor's key. Other parameters are ignored.
func openRedlock(ctx context.Context, u *url.URL) (storeops.Store, error) {
	p, err := driver.ParseParams(u)
	if err != nil {
		return nil, fmt.Errorf("storeops: %w", err)
	}
	prefix, err := p.String("prefix", redlockDefaultPrefix)
	if err != nil {
		return nil, err
	}
	tlsCfg, err := driver.ReadTLS(p)
	if err != nil {
		return nil, fmt.Errorf("storeops: %w", err)
	}
	db := 0
	if path := strings.Trim(u.Path, "/"); path != "" {
		if db, err = strconv.Atoi(path); err != nil {
			return nil, fmt.Errorf("storeops: redlock URL path must be a database number, got %q", u.Path)
		}
	}
	if u.Host == "" {
		return nil, errors.New("storeops: redlock URL lists no nodes")
	}
	s := &redlockStore{prefix: prefix}
	for h := range strings.SplitSeq(u.Host, ",") {
		addr := h
		if _, _, err := net.SplitHostPort(h); err != nil {
			addr = net.JoinHostPort(h, "6379")
		}
		// One attempt per call, as the backend's clients make: a node that is down
		// fails Ops at once.
		opt := &redis.Options{Addr: addr, DB: db, DisableIdentity: true, MaxRetries: -1, DialerRetries: 1}
		if u.User != nil {
			opt.Username = u.User.Username()
			opt.Password, _ = u.User.Password()
		}
		if tlsCfg != nil {
			opt.TLSConfig = tlsCfg.Clone()
			if opt.TLSConfig.ServerName == "" {
				opt.TLSConfig.ServerName, _, _ = net.SplitHostPort(addr)
			}
		}
		s.nodes = append(s.nodes, redis.NewClient(opt))
	}
	return s, nil
}

// FloorCycle is the single-instance floor Redlock over N nodes is compared with, to
// show what the fan-out costs over one instance: SET NX PX with a fresh random
// value, then a compare-and-delete script, on the first node only, on the key's
// floor key (P:floor 0x1f K; see the key layout in redlock/names.go).
func (s *redlockStore) FloorCycle(ctx context.Context, key string) error {
	return redisFloor(ctx, s.nodes[0], s.prefix+":floor\x1f"+key)
}

// Ops is the sum over all nodes of the calls in INFO commandstats (which counts the
// commands run inside scripts too), less the INFO calls themselves. Every node must
// answer.
func (s *redlockStore) Ops(ctx context.Context) (int64, error) {
	counts := make([]int64, len(s.nodes))
	errs := make([]error, len(s.nodes))
	var wg sync.WaitGroup
	for i, rdb := range s.nodes {
		wg.Go(func() {
			counts[i], errs[i] = redisCalls(ctx, rdb)
			if errs[i] != nil {
				errs[i] = fmt.Errorf("redlock node %s: %w", rdb.Options().Addr, errs[i])
			}
		})
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		return 0, err
	}
	var total int64
	for _, c := range counts {
		total += c
	}
	return total, nil
}

func (s *redlockStore) OpsSource() string {
	return "INFO commandstats calls summed over the nodes, less INFO"
}

func (s *redlockStore) Close() error {
	var errs []error
	for _, rdb := range s.nodes {
		errs = append(errs, rdb.Close())
	}
	return errors.Join(errs...)
}
